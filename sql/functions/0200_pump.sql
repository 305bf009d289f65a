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
language plpgsql
-- JIT compiles for milliseconds what runs in microseconds here, and the
-- generic plans are right for every call (checked with EXPLAIN): planning
-- each call again cost more than running it.
set jit = off
set plan_cache_mode = force_generic_plan
as $$
declare
    v_ids bigint[];
begin
    -- Pick first, then update by id: an UPDATE joined to the picking CTE is
    -- planned for a CTE of unknown size and hash-joins the whole table.
    v_ids := array(
        select c.id
        from watchpump.services s
        left join unnest(p_service_ids, p_free, p_probe) as f (id, free, probe) on f.id = s.id
        cross join lateral (
            select d.id
            from watchpump.deliveries d
            where d.service_id = s.id
              and d.state = 'pending'
              and (coalesce(f.probe, false) or d.next_attempt_at <= now())
              -- One delivery per (watch, object) in flight at a time: the
              -- consumer sees an object's news in order, and a newer one
              -- waits (and is superseded by still newer ones) meanwhile.
              and not exists (
                  select 1 from watchpump.deliveries f2
                  where f2.watch_id = d.watch_id and f2.object = d.object and f2.state = 'in_flight'
                  -- OFFSET 0 keeps this a per-row index probe instead of an
                  -- anti-join against every in-flight row.
                  offset 0
              )
            order by d.next_attempt_at
            limit greatest(coalesce(f.free, p_default_free), 0)
            for update of d skip locked
        ) c
    );
    if cardinality(v_ids) = 0 then
        return;
    end if;

    return query
    with claimed as (
        update watchpump.deliveries d
        set state = 'in_flight', attempts = d.attempts + 1,
            lease_until = clock_timestamp() + p_lease, leased_by = p_pump
        where d.id = any (v_ids)
        returning d.id, d.change_id, d.watch_id, d.service_id, d.attempts
    )
    select c.id, c.change_id, c.watch_id, c.service_id, s.name, s.base_url, c.attempts,
           w.resource, ch.object, ch.kind, ch.sequence, ch.occurred_at, ch.payload::text
    from claimed c
    join watchpump.changes ch on ch.id = c.change_id
    join watchpump.watches w on w.id = c.watch_id
    join watchpump.services s on s.id = c.service_id;

    delete from watchpump.sleepers where pump = p_pump;
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
language plpgsql
-- JIT compiles for milliseconds what runs in microseconds here, and the
-- generic plans are right for every call (checked with EXPLAIN): planning
-- each call again cost more than running it.
set jit = off
set plan_cache_mode = force_generic_plan
as $$
begin
    insert into watchpump.attempts (delivery_id, attempt, started_at, duration_ms, status, error, response_head, pump)
    select o.id, o.attempt, o.started, o.duration, o.status, o.error, o.head, p_pump
    from unnest(p_ids, p_attempts, p_started, p_durations, p_statuses, p_errors, p_heads)
         as o (id, attempt, started, duration, status, error, head);

    -- Rows are found by `id = any (p_ids)` and matched to their outcome by
    -- position: joining to unnest() of the arrays made the planner loop over
    -- the arrays once per row (quadratic in the batch size).
    return query
    with reported as materialized (
        select cur.id, p_attempts[i] as attempt, p_outcomes[i] as outcome, p_statuses[i] as status,
               p_errors[i] as error, p_next[i] as next, cur.deadline, cur.watch_id, cur.object
        from watchpump.deliveries cur
        cross join lateral array_position(p_ids, cur.id) as i
        where cur.id = any (p_ids)
          -- Only what this pump still holds: same lease holder, same attempt.
          -- (coalesce hides the state test from the in-flight partial
          -- indexes, which would otherwise lure the planner away from the
          -- primary key.)
          and coalesce(cur.state, '') = 'in_flight' and cur.leased_by = p_pump and cur.attempts = p_attempts[i]
    ),
    decided as materialized (
        select r.id, r.attempt, r.status, r.error, r.next, newer.id as newer_id,
               case
                   when r.outcome = 'delivered' then 'delivered'
                   when r.outcome = 'gone' then 'dropped'
                   when newer.id is not null then 'superseded'
                   when w.removed_at is not null then 'dropped'
                   when r.next > r.deadline then 'failed'
                   else 'pending'
               end as state
        from reported r
        join watchpump.watches w on w.id = r.watch_id
        left join lateral (
            select n.id from watchpump.deliveries n
            where r.outcome = 'retry'
              and n.watch_id = r.watch_id and n.object = r.object
              and n.state = 'pending' and n.id > r.id
            order by n.id desc
            limit 1
        ) newer on true
    )
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
      -- Checked again on the row as it is now: a pump whose lease ran out
      -- while this statement ran must not overwrite the new holder's claim.
      and coalesce(d.state, '') = 'in_flight' and d.leased_by = p_pump and d.attempts = x.attempt
    returning d.id, d.service_id, d.state;

    -- 410: the consumer's resource is gone. Drop the watch and what it still
    -- had waiting.
    if 'gone' = any (p_outcomes) then
        return query
        with gone_watches as (
            update watchpump.watches w
            set removed_at = clock_timestamp(), removed_reason = 'gone: the consumer answered 410'
            from watchpump.deliveries d
            where d.id = any (p_ids) and d.state = 'dropped' and d.last_status = 410
              and w.id = d.watch_id and w.removed_at is null
            returning w.id
        )
        update watchpump.deliveries d
        set state = 'dropped', last_error = 'watch removed: the consumer answered 410',
            finished_at = clock_timestamp()
        where d.watch_id in (select g.id from gone_watches g)
          and d.state = 'pending'
        returning d.id, d.service_id, d.state;
    end if;
end
$$;

-- A consumer answered again after being down: its waiting deliveries are due
-- now, instead of each waiting out its own back-off.
create or replace function watchpump.release_backlog(p_service_id bigint) returns integer
language plpgsql
-- JIT compiles for milliseconds what runs in microseconds here, and the
-- generic plans are right for every call (checked with EXPLAIN): planning
-- each call again cost more than running it.
set jit = off
set plan_cache_mode = force_generic_plan
as $$
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
returns table (service_id bigint, service text, expired_leases integer, failed integer)
language plpgsql
-- JIT compiles for milliseconds what runs in microseconds here, and the
-- generic plans are right for every call (checked with EXPLAIN): planning
-- each call again cost more than running it.
set jit = off
set plan_cache_mode = force_generic_plan
as $$
begin
    update watchpump.sleepers set since = now() where pump = p_pump;
    delete from watchpump.sleepers where since < now() - interval '1 minute';

    return query
    with expired as (
        -- A delivery whose lease ran out goes back to pending, unless newer
        -- news of the same (watch, object) is waiting: then it is superseded,
        -- so that one (watch, object) never has two deliveries under way.
        update watchpump.deliveries d
        set state = case when newer.id is null then 'pending' else 'superseded' end,
            superseded_by = newer.id,
            finished_at = case when newer.id is null then null else clock_timestamp() end,
            lease_until = null, leased_by = null, next_attempt_at = now(),
            last_error = 'lease expired: pump ' || d.leased_by || ' did not report the attempt'
        from watchpump.deliveries cur
        left join lateral (
            select n.id from watchpump.deliveries n
            where n.watch_id = cur.watch_id and n.object = cur.object
              and n.state = 'pending' and n.id > cur.id
            order by n.id desc
            limit 1
        ) newer on true
        where cur.state = 'in_flight' and cur.lease_until < now()
          and d.id = cur.id and d.state = 'in_flight' 
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
    select c.service_id, s.name, sum(c.expired)::integer, sum(c.failed)::integer
    from counted c
    join watchpump.services s on s.id = c.service_id
    group by c.service_id, s.name;
end
$$;
