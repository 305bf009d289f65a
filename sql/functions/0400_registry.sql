-- The registry's actions in SQL, so that psql, the CLI and the admin API do
-- the same: removing a watch (with its undelivered deliveries) and removing
-- a consumer service (with its watches); and what the watches covering one
-- object may cost emit() (fan-out budgets). Adding them is Rust's
-- (src/services/, src/watches/). Below the pump (0500_delivery.sql), whose
-- complete() removes the watch of a 410.

-- Removes a live watch and drops what it still had waiting to be sent. The
-- one place a watch goes away: a consumer's DELETE, a 410 answer, a removed
-- service. Returns the dropped deliveries.
create or replace function watchpump.remove_watch(p_watch_id bigint, p_reason text)
returns table (delivery_id bigint, service_id bigint)
language plpgsql as $$
declare
    v_outcomes watchpump.settle_outcome[];
begin
    update watchpump.watches w
    set removed_at = clock_timestamp(), removed_reason = p_reason
    where w.id = p_watch_id and w.removed_at is null;
    if not found then
        return;
    end if;
    -- What waits to be sent; a delivery in flight settles as its pump finds
    -- it (dropped: its watch is gone).
    v_outcomes := array(select watchpump.settle_as(q.id, 'dropped', 'watch removed: ' || p_reason)
                        from watchpump.queue q
                        where q.watch_id = p_watch_id and not watchpump.in_flight(q.lease_until)
                        order by q.id
                        for update);
    return query
    select s.delivery_id, s.service_id from watchpump.settle(v_outcomes) s;
end
$$;

-- Removes a consumer service: it authenticates no more, its watches are
-- removed and their undelivered deliveries dropped (a delivery in flight
-- finishes as the pump finds it: dropped, since its watch is gone).
-- Returns how many watches were removed and deliveries dropped.
create or replace function watchpump.remove_service(p_name text, p_actor text default null)
returns table (watches integer, deliveries integer)
language plpgsql as $$
declare
    v_id      bigint;
    v_watches integer := 0;
    v_dropped integer := 0;
    v_watch   bigint;
    v_n       integer;
begin
    select s.id into v_id from watchpump.services s
    where s.name = p_name and s.removed_at is null
    for update;
    if not found then
        raise exception 'watchpump.remove_service: there is no service %', coalesce(quote_literal(p_name), 'null')
            using errcode = 'P0002';
    end if;
    update watchpump.services s set removed_at = clock_timestamp(), version = s.version + 1
    where s.id = v_id;
    for v_watch in
        select w.id from watchpump.watches w where w.service_id = v_id and w.removed_at is null order by w.id
    loop
        select count(*) into v_n
        from watchpump.remove_watch(v_watch, 'service ' || p_name || ' removed by ' || watchpump.actor(p_actor));
        v_watches := v_watches + 1;
        v_dropped := v_dropped + v_n;
    end loop;
    return query select v_watches, v_dropped;
end
$$;

-- FAN-OUT BUDGETS (src/watches/fanout.rs). What the watches covering one
-- object may cost emit() together, for the objects under the top segment
-- p_top: the operator's figure in fanout_budgets (`watchpump fanout
-- set-budget`), else settings.fanout_units, else 1,200 units.
create or replace function watchpump.fanout_budget(p_top text) returns integer
language sql stable as $$
    select coalesce((select b.units from watchpump.fanout_budgets b where b.top_segment = p_top),
                    (select s.fanout_units from watchpump.settings s),
                    1200)
$$;
