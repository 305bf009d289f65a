-- The pump's side: claim due deliveries, record what became of them, sweep
-- up lost leases and passed deadlines. Each is one round trip per batch.
--
-- THE ORDER RULE. For each (watch, object):
--   1. at most one delivery is in flight;
--   2. a delivery is sent only while no newer delivery of the same (watch,
--      object) has been sent: the newest pending delivery carries the
--      object's news, and every older pending one is superseded by it;
--   3. one claim takes at most one delivery of a (watch, object).
-- It is decided in claim(), where it cannot be raced: claim takes a
-- transaction-level advisory lock per (watch, object) (stream_lock()) before
-- it decides, and decides with a snapshot taken after the lock, which sees
-- whatever the lock's previous holder committed. It claims the newest
-- pending delivery only together with superseding every older pending one,
-- and skips the (watch, object) for now if one of those is locked.
-- Supersession itself is supersede_older(), called by claim(), complete()
-- (a failed attempt with newer news waiting) and sweep() (an expired lease
-- with newer news waiting). emit() never touches an existing delivery, so a
-- producer's transaction never holds a lock a pump needs, nor waits on one;
-- retry() and retry_failed() (0300_operator.sql) refuse to requeue older
-- news once newer news of the object was sent or is on its way.
-- The advisory lock that serialises decisions about one (watch, object):
-- class 2003856752 ('wpmp'), so that it cannot meet a producer's own
-- single-key advisory locks.
create or replace function watchpump.stream_lock(p_watch_id bigint, p_object text) returns boolean
language sql volatile strict as $$
    select pg_try_advisory_xact_lock(2003856752, hashtext(p_watch_id::text || '/' || p_object))
$$;

-- The supersession rule, in one place: for each (watch, object) given, the
-- newest delivery that is pending or in flight carries the object's news,
-- and every older pending one is superseded by it (and never sent). Rows
-- another transaction holds are skipped, never waited for; the caller gets
-- back what it superseded, and claim() checks that nothing was skipped.
create or replace function watchpump.supersede_older(p_watch_ids bigint[], p_objects text[])
returns table (delivery_id bigint, service_id bigint, superseded_by bigint)
language plpgsql
-- JIT compiles for milliseconds what runs in microseconds here, and the
-- generic plans are right for every call (checked with EXPLAIN): planning
-- each call again cost more than running it.
set jit = off
set plan_cache_mode = force_generic_plan
as $$
begin
    return query
    with streams as (
        select k.watch_id, k.object,
               greatest(
                   (select max(p.id) from watchpump.deliveries p
                    where p.watch_id = k.watch_id and p.object = k.object and p.state = 'pending'),
                   (select max(f.id) from watchpump.deliveries f
                    where f.watch_id = k.watch_id and f.object = k.object and f.state = 'in_flight')
               ) as newest
        from (select distinct u.watch_id, u.object from unnest(p_watch_ids, p_objects) as u (watch_id, object)) k
    ),
    older as (
        select d.id, s.newest
        from streams s
        join watchpump.deliveries d
          on d.watch_id = s.watch_id and d.object = s.object and d.state = 'pending' and d.id < s.newest
        for update of d skip locked
    )
    update watchpump.deliveries d
    set state = 'superseded', superseded_by = o.newest, finished_at = clock_timestamp(),
        lease_until = null, leased_by = null
    from older o
    where d.id = o.id
    returning d.id, d.service_id, d.superseded_by;
end
$$;

-- Claim up to p_free due deliveries of each service (p_default_free for
-- services not listed), lock them with a lease, and return what the pump
-- needs to send them. A probing service (p_probe) gets its soonest pending
-- delivery even if that one's own retry is not due yet: the probe stands in
-- for the whole service's backlog. The lease fences a pump that died
-- mid-send. The order rule (top of this file) is decided here.
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
    -- services.version: pumps cache each service's signing keys by it.
    service_version integer,
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
    v_watch_ids bigint[];
    v_objects   text[];
    v_probes    boolean[];
    v_ids       bigint[];
    v_cleaned   bigint;
begin
    -- The rule needs a fresh snapshot per statement.
    if current_setting('transaction_isolation') <> 'read committed' then
        raise exception 'watchpump.claim must run at read committed, not %',
            current_setting('transaction_isolation') using errcode = '25000';
    end if;

    -- 1. Due (or probed) pending deliveries per service, oldest due first:
    --    up to its free slots of them, plus up to 256 more to clean up.
    --    A row with a newer pending sibling is stale (left behind while a
    --    pump was behind or its consumer down): it is superseded here, as
    --    the scan passes it, so that stale rows never pile up ahead of the
    --    news. The newest of each (watch, object) that nothing of it is in
    --    flight is a candidate, and this pump decides about it now if it
    --    gets its lock (stream_lock()).
    with scanned as materialized (
        select d.id, d.watch_id, d.object, d.service_id, d.next_attempt_at,
               coalesce(f.probe, false) as probe, greatest(coalesce(f.free, p_default_free), 0) as free,
               (select max(n.id) from watchpump.deliveries n
                where n.watch_id = d.watch_id and n.object = d.object and n.state = 'pending') as newest
        from watchpump.services s
        left join unnest(p_service_ids, p_free, p_probe) as f (id, free, probe) on f.id = s.id
        cross join lateral (
            select d.id, d.watch_id, d.object, d.service_id, d.next_attempt_at
            from watchpump.deliveries d
            where d.service_id = s.id
              and d.state = 'pending'
              and (coalesce(f.probe, false) or d.next_attempt_at <= now())
              and not exists (
                  select 1 from watchpump.deliveries f2
                  where f2.watch_id = d.watch_id and f2.object = d.object and f2.state = 'in_flight'
                  -- OFFSET 0 keeps this a per-row index probe instead of an
                  -- anti-join against every in-flight row.
                  offset 0
              )
            order by d.next_attempt_at
            limit case when coalesce(f.free, p_default_free) > 0
                       then coalesce(f.free, p_default_free) + case when coalesce(f.probe, false) then 0 else 256 end
                       else 0 end
        ) d
        where s.removed_at is null
    ),
    stale as (
        select d.id, x.newest
        from scanned x
        join watchpump.deliveries d on d.id = x.id and d.state = 'pending'
        where x.id < x.newest
        for update of d skip locked
    ),
    cleaned as (
        update watchpump.deliveries d
        set state = 'superseded', superseded_by = s.newest, finished_at = clock_timestamp()
        from stale s
        where d.id = s.id
        returning d.id
    ),
    candidates as materialized (
        select x.watch_id, x.object, x.probe,
               row_number() over (partition by x.service_id order by x.next_attempt_at) as nth, x.free
        from scanned x
        where x.id = x.newest
    )
    select coalesce(array_agg(k.watch_id), '{}'), coalesce(array_agg(k.object), '{}'),
           coalesce(array_agg(k.probe), '{}'), (select count(*) from cleaned)
    into v_watch_ids, v_objects, v_probes, v_cleaned
    from (select * from candidates c where c.nth <= c.free) k
    where watchpump.stream_lock(k.watch_id, k.object);
    if cardinality(v_watch_ids) = 0 then
        return;
    end if;

    -- 2. Under the locks, with this statement's fresh snapshot: the newest
    --    pending delivery of each, if it is due (or probed) and nothing of
    --    its (watch, object) is in flight. Then lock those rows, skipping
    --    any another transaction holds.
    v_ids := array(
        select n.id
        from unnest(v_watch_ids, v_objects, v_probes) as k (watch_id, object, probe)
        cross join lateral (
            select d.id, d.next_attempt_at
            from watchpump.deliveries d
            where d.watch_id = k.watch_id and d.object = k.object and d.state = 'pending'
            order by d.id desc
            limit 1
        ) n
        where (k.probe or n.next_attempt_at <= now())
          and not exists (
              select 1 from watchpump.deliveries f
              where f.watch_id = k.watch_id and f.object = k.object and f.state = 'in_flight'
              offset 0
          )
    );
    v_ids := array(
        select d.id from watchpump.deliveries d
        where d.id = any (v_ids) and d.state = 'pending'
        for update skip locked
    );
    -- 3. Every older pending delivery of those (watch, object)s must be
    --    superseded in this same transaction; where one is held by someone
    --    else, the (watch, object) waits for the next claim.
    select coalesce(array_agg(d.watch_id), '{}'), coalesce(array_agg(d.object), '{}')
    into v_watch_ids, v_objects
    from watchpump.deliveries d where d.id = any (v_ids);
    perform from watchpump.supersede_older(v_watch_ids, v_objects);
    v_ids := array(
        select c.id from watchpump.deliveries c
        where c.id = any (v_ids)
          and not exists (
              select 1 from watchpump.deliveries o
              where o.watch_id = c.watch_id and o.object = c.object and o.state = 'pending' and o.id < c.id
          )
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
    select c.id, c.change_id, c.watch_id, c.service_id, s.name, s.base_url, s.version, c.attempts,
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
-- A retry becomes 'dropped' when the watch was removed, 'superseded' when
-- newer news of its (watch, object) is waiting (supersede_older()), 'failed'
-- when the next attempt would fall after the deadline, and 'pending' again
-- otherwise. Only rows this pump still holds (same lease holder and attempt)
-- change: a pump whose lease ran out and was taken over records its attempt
-- but decides nothing.
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
declare
    v_ids        bigint[];
    v_services   bigint[];
    v_states     text[];
    v_retried    bigint[];
    v_superseded bigint[];
    v_failed     bigint[];
    v_watch_ids  bigint[];
    v_objects    text[];
begin
    insert into watchpump.attempts (delivery_id, attempt, started_at, duration_ms, status, error, response_head, pump)
    select o.id, o.attempt, o.started, o.duration, o.status, o.error, o.head, p_pump
    from unnest(p_ids, p_attempts, p_started, p_durations, p_statuses, p_errors, p_heads)
         as o (id, attempt, started, duration, status, error, head);

    -- Rows are found by `id = any (p_ids)` and matched to their outcome by
    -- position: joining to unnest() of the arrays made the planner loop over
    -- the arrays once per row (quadratic in the batch size).
    with reported as materialized (
        select cur.id, p_attempts[i] as attempt, p_outcomes[i] as outcome, p_statuses[i] as status,
               p_errors[i] as error, p_next[i] as next, cur.watch_id
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
        select r.id, r.attempt, r.status, r.error, r.next,
               case
                   when r.outcome = 'delivered' then 'delivered'
                   when r.outcome = 'gone' then 'dropped'
                   when w.removed_at is not null then 'dropped'
                   else 'pending'
               end as state
        from reported r
        join watchpump.watches w on w.id = r.watch_id
    ),
    settled as (
        update watchpump.deliveries d
        set state = x.state,
            last_status = x.status,
            last_error = x.error,
            lease_until = null,
            leased_by = null,
            next_attempt_at = case when x.state = 'pending' then x.next else d.next_attempt_at end,
            finished_at = case when x.state = 'pending' then null else clock_timestamp() end
        from decided x
        where d.id = x.id
          -- Checked again on the row as it is now: a pump whose lease ran out
          -- while this statement ran must not overwrite the new holder's claim.
          and coalesce(d.state, '') = 'in_flight' and d.leased_by = p_pump and d.attempts = x.attempt
        returning d.id, d.service_id, d.state
    )
    select coalesce(array_agg(x.id), '{}'), coalesce(array_agg(x.service_id), '{}'),
           coalesce(array_agg(x.state), '{}')
    into v_ids, v_services, v_states
    from settled x;

    -- Retries: newer news waiting supersedes them; past the deadline they fail.
    v_retried := array(select u.id from unnest(v_ids, v_states) as u (id, state) where u.state = 'pending');
    if cardinality(v_retried) > 0 then
        select array_agg(d.watch_id), array_agg(d.object) into v_watch_ids, v_objects
        from watchpump.deliveries d where d.id = any (v_retried);
        v_superseded := array(select s.delivery_id from watchpump.supersede_older(v_watch_ids, v_objects) s);
        with failed as (
            update watchpump.deliveries d
            set state = 'failed', finished_at = clock_timestamp()
            where d.id = any (v_retried) and d.state = 'pending' and d.next_attempt_at > d.deadline
            returning d.id
        )
        select array_agg(f.id) into v_failed from failed f;
    end if;

    return query
    select u.id, u.service_id,
           case
               when u.id = any (v_superseded) then 'superseded'
               when u.id = any (v_failed) then 'failed'
               else u.state
           end
    from unnest(v_ids, v_services, v_states) as u (id, service_id, state);

    -- 410: the consumer's resource is gone. Drop the watch and what it still
    -- had waiting.
    if 'gone' = any (p_outcomes) then
        return query
        select r.delivery_id, r.service_id, 'dropped'::text
        from (select distinct d.watch_id from watchpump.deliveries d
              where d.id = any (v_ids) and d.state = 'dropped' and d.last_status = 410) g
        cross join lateral watchpump.remove_watch(g.watch_id, 'gone: the consumer answered 410') r;
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
-- hung) become due again, unless newer news of their (watch, object) waits
-- (then they are superseded: supersede_older()), and pending deliveries past
-- their deadline fail. Also keeps this pump's sleeper row fresh and forgets
-- sleepers of pumps that stopped sweeping (killed without a chance to say so).
create or replace function watchpump.sweep(p_pump text)
returns table (service_id bigint, service text, expired_leases integer, failed integer)
language plpgsql
-- JIT compiles for milliseconds what runs in microseconds here, and the
-- generic plans are right for every call (checked with EXPLAIN): planning
-- each call again cost more than running it.
set jit = off
set plan_cache_mode = force_generic_plan
as $$
declare
    v_expired  bigint[];
    v_services bigint[];
    v_watch_ids bigint[];
    v_objects  text[];
begin
    update watchpump.sleepers set since = now() where pump = p_pump;
    delete from watchpump.sleepers where since < now() - interval '1 minute';

    with expired as (
        update watchpump.deliveries d
        set state = 'pending', lease_until = null, leased_by = null, next_attempt_at = now(),
            last_error = 'lease expired: pump ' || d.leased_by || ' did not report the attempt'
        where d.state = 'in_flight' and d.lease_until < now()
        returning d.id, d.service_id, d.watch_id, d.object
    )
    select coalesce(array_agg(e.id), '{}'), coalesce(array_agg(e.service_id), '{}'),
           coalesce(array_agg(e.watch_id), '{}'), coalesce(array_agg(e.object), '{}')
    into v_expired, v_services, v_watch_ids, v_objects
    from expired e;
    if cardinality(v_expired) > 0 then
        perform from watchpump.supersede_older(v_watch_ids, v_objects);
    end if;

    return query
    with overdue as (
        update watchpump.deliveries d
        set state = 'failed', finished_at = clock_timestamp(),
            last_error = 'deadline passed; last error: ' || coalesce(d.last_error, 'none')
        where d.state = 'pending' and d.deadline < now()
        returning d.service_id
    ),
    counted as (
        select e, 1 as expired, 0 as failed from unnest(v_services) as e
        union all
        select o.service_id, 0, 1 from overdue o
    )
    select c.e, s.name, sum(c.expired)::integer, sum(c.failed)::integer
    from counted c
    join watchpump.services s on s.id = c.e
    group by c.e, s.name;
end
$$;
