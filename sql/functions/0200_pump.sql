-- The pump's side: claim due deliveries, record what became of them, sweep
-- up lost leases and passed deadlines. Each is one round trip per batch.

-- Claim up to p_free due deliveries of each service (p_default_free for
-- services not listed), lock them with a lease, and return what the pump
-- needs to send them. A probing service (p_probe) gets its soonest pending
-- delivery even if that one's own retry is not due yet: the probe stands in
-- for the whole service's backlog. SKIP LOCKED keeps pumps out of each
-- other's way; the lease fences a pump that died mid-send.
create or replace function watchpump.claim(
    p_pump         text,
    p_service_ids  bigint[],
    p_free         integer[],
    p_probe        boolean[],
    p_default_free integer,
    p_lease        interval
) returns table (
    delivery_id  bigint,
    change_id    bigint,
    watch_id     bigint,
    service_id   bigint,
    service_name text,
    base_url     text,
    attempt      integer,
    resource     text,
    object       text,
    kind         text,
    sequence     bigint,
    occurred_at  timestamptz,
    payload      text
)
language plpgsql as $$
begin
    return query
    with slots as (
        select s.id, coalesce(f.free, p_default_free) as free, coalesce(f.probe, false) as probe
        from watchpump.services s
        left join unnest(p_service_ids, p_free, p_probe) as f (id, free, probe) on f.id = s.id
    ),
    picked as (
        select c.id
        from slots
        cross join lateral (
            select d.id
            from watchpump.deliveries d
            where d.service_id = slots.id
              and d.state = 'pending'
              and (slots.probe or d.next_attempt_at <= now())
            order by d.next_attempt_at
            limit greatest(slots.free, 0)
            for update skip locked
        ) c
    ),
    claimed as (
        update watchpump.deliveries d
        set state = 'in_flight', attempts = d.attempts + 1,
            lease_until = clock_timestamp() + p_lease, leased_by = p_pump
        from picked
        where d.id = picked.id
        returning d.id, d.change_id, d.watch_id, d.service_id, d.attempts
    )
    select c.id, c.change_id, c.watch_id, c.service_id, s.name, s.base_url, c.attempts,
           w.resource, ch.object, ch.kind, ch.sequence, ch.occurred_at, ch.payload::text
    from claimed c
    join watchpump.changes ch on ch.id = c.change_id
    join watchpump.watches w on w.id = c.watch_id
    join watchpump.services s on s.id = c.service_id;

    if found then
        delete from watchpump.sleepers where pump = p_pump;
    end if;
end
$$;

-- Say that this pump is going to sleep until a NOTIFY or its sweep.
create or replace function watchpump.sleep(p_pump text) returns void
language sql as $$
    insert into watchpump.sleepers (pump) values (p_pump)
    on conflict (pump) do update set since = now()
$$;

-- Record a batch of attempts and what became of each delivery.
-- p_outcomes: 'delivered' (2xx), 'gone' (410: drop the watch), or 'retry'
-- (anything else; p_next is when, computed by the pump's back-off).
-- A retry becomes 'superseded' when a newer delivery of the same (watch,
-- object) exists, 'dropped' when the watch was removed, 'failed' when the
-- next attempt would fall after the deadline. Only rows this pump still
-- holds (same lease holder and attempt) change: a pump whose lease ran out
-- and was taken over records its attempt but decides nothing.
create or replace function watchpump.complete(
    p_pump       text,
    p_ids        bigint[],
    p_attempts   integer[],
    p_outcomes   text[],
    p_statuses   integer[],
    p_errors     text[],
    p_started    timestamptz[],
    p_durations  double precision[],
    p_heads      text[],
    p_next       timestamptz[]
) returns table (delivery_id bigint, service_id bigint, state text)
language plpgsql as $$
begin
    insert into watchpump.attempts (delivery_id, attempt, started_at, duration_ms, status, error, response_head, pump)
    select o.id, o.attempt, o.started, o.duration, o.status, o.error, o.head, p_pump
    from unnest(p_ids, p_attempts, p_started, p_durations, p_statuses, p_errors, p_heads)
         as o (id, attempt, started, duration, status, error, head);

    return query
    with outcome as (
        select o.id, o.attempt, o.outcome, o.status, o.error, o.next
        from unnest(p_ids, p_attempts, p_outcomes, p_statuses, p_errors, p_next)
             as o (id, attempt, outcome, status, error, next)
    ),
    decided as (
        select d.id,
               case
                   when o.outcome = 'delivered' then 'delivered'
                   when o.outcome = 'gone' then 'dropped'
                   when newer.id is not null then 'superseded'
                   when w.removed_at is not null then 'dropped'
                   when o.next > d.deadline then 'failed'
                   else 'pending'
               end as state,
               newer.id as newer_id, o.status, o.error, o.next
        from outcome o
        join watchpump.deliveries d on d.id = o.id
        join watchpump.watches w on w.id = d.watch_id
        left join lateral (
            select max(n.id) as id
            from watchpump.deliveries n
            where n.watch_id = d.watch_id and n.object = d.object and n.id > d.id
            having max(n.id) is not null
        ) newer on o.outcome = 'retry'
        where d.state = 'in_flight' and d.leased_by = p_pump and d.attempts = o.attempt
    ),
    updated as (
        update watchpump.deliveries d
        set state = x.state,
            last_status = x.status,
            last_error = x.error,
            lease_until = null,
            leased_by = null,
            superseded_by = case when x.state = 'superseded' then x.newer_id else d.superseded_by end,
            next_attempt_at = case when x.state = 'pending' then x.next else d.next_attempt_at end,
            finished_at = case when x.state = 'pending' then null else clock_timestamp() end
        from decided x
        where d.id = x.id
        returning d.id, d.service_id, d.state, d.watch_id
    ),
    gone_watches as (
        update watchpump.watches w
        set removed_at = clock_timestamp(), removed_reason = 'gone: the consumer answered 410'
        where w.id in (select u.watch_id from updated u join outcome o on o.id = u.id where o.outcome = 'gone')
          and w.removed_at is null
        returning w.id
    ),
    dropped_siblings as (
        update watchpump.deliveries d
        set state = 'dropped', last_error = 'watch removed: the consumer answered 410',
            finished_at = clock_timestamp()
        where d.watch_id in (select g.id from gone_watches g)
          and d.state = 'pending'
        returning d.id, d.service_id, d.state
    )
    select u.id, u.service_id, u.state from updated u
    union all
    select s.id, s.service_id, s.state from dropped_siblings s;
end
$$;

-- Put claimed deliveries back (a pump shutting down before it sent them).
create or replace function watchpump.release(p_pump text, p_ids bigint[]) returns integer
language plpgsql as $$
declare
    v_count integer;
begin
    update watchpump.deliveries d
    set state = 'pending', attempts = d.attempts - 1, lease_until = null, leased_by = null,
        next_attempt_at = now()
    where d.id = any (p_ids) and d.state = 'in_flight' and d.leased_by = p_pump;
    get diagnostics v_count = row_count;
    if v_count > 0 then
        perform pg_notify('watchpump', '');
    end if;
    return v_count;
end
$$;

-- A consumer answered again after being down: its waiting deliveries are due
-- now, instead of each waiting out its own back-off.
create or replace function watchpump.release_backlog(p_service_id bigint) returns integer
language plpgsql as $$
declare
    v_count integer;
begin
    update watchpump.deliveries d
    set next_attempt_at = now()
    where d.service_id = p_service_id and d.state = 'pending' and d.next_attempt_at > now();
    get diagnostics v_count = row_count;
    return v_count;
end
$$;

-- The periodic backstop: deliveries whose lease ran out (their pump died or
-- hung) become due again, and pending deliveries past their deadline fail.
-- Also keeps this pump's sleeper row fresh and forgets sleepers of pumps that
-- stopped sweeping (killed without a chance to say so).
create or replace function watchpump.sweep(p_pump text)
returns table (service_id bigint, expired_leases integer, failed integer)
language plpgsql as $$
begin
    update watchpump.sleepers set since = now() where pump = p_pump;
    delete from watchpump.sleepers where since < now() - interval '1 minute';

    return query
    with expired as (
        update watchpump.deliveries d
        set state = 'pending', lease_until = null, leased_by = null, next_attempt_at = now(),
            last_error = 'lease expired: pump ' || d.leased_by || ' did not report the attempt'
        where d.state = 'in_flight' and d.lease_until < now()
        returning d.service_id
    ),
    overdue as (
        update watchpump.deliveries d
        set state = 'failed', finished_at = clock_timestamp(),
            last_error = 'deadline passed; last error: ' || coalesce(d.last_error, 'none')
        where d.state = 'pending' and d.deadline < now()
        returning d.service_id
    ),
    counted as (
        select e.service_id, 1 as expired, 0 as failed from expired e
        union all
        select o.service_id, 0, 1 from overdue o
    )
    select c.service_id, sum(c.expired)::integer, sum(c.failed)::integer
    from counted c
    group by c.service_id;
end
$$;
