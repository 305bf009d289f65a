-- How a delivery leaves the queue, and how it comes back. watchpump.queue
-- holds what is not settled (pending, or in flight while a lease runs);
-- the history (watchpump.settled, 0200_history.sql) holds the rest
-- (0004_storage_v2.sql):
--   - settle() moves deliveries from the queue to the history, each with
--     how it ended: the one place a delivery is settled;
--   - supersede_older() is the order rule's supersession (the rule is at
--     the top of 0500_delivery.sql): older news is settled as superseded;
--   - requeue() moves settled deliveries back, for an operator's retry()
--     and a consumer's redeliver() (which check the order rule first).
-- Their callers are on the floors above: the registry's remove_watch()
-- (0400_registry.sql), the pump's claim(), complete() and sweep()
-- (0500_delivery.sql), and hold_paused_of() (0550_pause.sql).
--
-- Why settle() and supersede_older() set `jit = off`, `force_generic_plan`
-- and the rest: the note on plans at the top of 0150_emit.sql.

-- Moves deliveries from the queue to the history, each with its state
-- ('delivered', 'superseded', 'dropped' or 'failed'), and for a superseded
-- one the delivery that superseded it. The callers hold the rows (by lease
-- or by lock). The attempt that delivered (p_pump, p_started, p_durations,
-- p_heads) is kept on the settled row. Failed deliveries are also noted for
-- the warning to notify. The one place a delivery is settled.
-- With p_attempts, a delivery is settled only while p_pump still holds the
-- lease of that attempt (complete()'s delivered ones: the delete checks
-- the lease as it takes the row lock); the others are left as they are,
-- and not returned.
create or replace function watchpump.settle(
    p_ids           bigint[],
    p_states        text[],
    p_superseded_by bigint[],
    p_statuses      integer[],
    p_errors        text[],
    p_pump          text default null,
    p_started       timestamptz[] default null,
    p_durations     double precision[] default null,
    p_heads         text[] default null,
    p_attempts      integer[] default null
) returns table (delivery_id bigint, service_id bigint, state text)
language plpgsql
set jit = off
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_mergejoin = off
as $$
begin
    return query
    with outcome as materialized (
        select u.id, u.state, u.superseded_by, u.status, u.error, u.started, u.duration, u.head, u.attempt
        from unnest(p_ids, p_states, p_superseded_by, p_statuses, p_errors, p_started, p_durations, p_heads,
                    p_attempts)
             as u (id, state, superseded_by, status, error, started, duration, head, attempt)
    ),
    moved as (
        delete from watchpump.queue q
        using outcome o
        where q.id = o.id
          and (o.attempt is null or (q.leased_by = p_pump and q.attempts = o.attempt))
        returning q.*, o.state, o.superseded_by as by, o.status, o.error, o.started, o.duration, o.head
    ),
    written as (
        insert into watchpump.settled (id, change_id, watch_id, service_id, object, state, attempts,
                                       next_attempt_at, deadline, superseded_by, last_status,
                                       last_error, created_at, finished_at, last_started_at,
                                       last_duration_ms, last_response_head, last_pump, replay)
        select m.id, m.change_id, m.watch_id, m.service_id, m.object, m.state, m.attempts,
               m.next_attempt_at, m.deadline, m.by, coalesce(m.status, m.last_status),
               -- A delivered row shows its delivering answer, not an error
               -- an earlier attempt left (those stay in attempt_log).
               case m.state when 'superseded' then m.last_error
                            when 'delivered' then m.error
                            else coalesce(m.error, m.last_error) end,
               m.created_at, clock_timestamp(), m.started, m.duration, m.head,
               case when m.started is not null then p_pump end, m.replay
        from moved m
        returning settled.id, settled.service_id, settled.state, settled.created_at
    ),
    noted as (
        insert into watchpump.failure_inbox (delivery_id, service_id, created_at)
        select w.id, w.service_id, w.created_at from written w where w.state = 'failed'
    )
    select w.id, w.service_id, w.state from written w;
    -- Failures are kept longer than the rest of their day: written where
    -- retention keeps them, now (stage_failed(), 0200_history.sql).
    if 'failed' = any (p_states) then
        perform watchpump.stage_failed(array(select u.id from unnest(p_ids, p_states) as u (id, state)
                                             where u.state = 'failed'));
    end if;
end
$$;

-- The supersession rule, in one place: for each (watch, object) given, the
-- newest queued delivery carries the object's news, and every older one
-- not in flight is superseded by it (and never sent). Newer is is_newer()
-- (0000_vocabulary.sql): by the change's sequence, then by delivery id; the
-- walks below go in that order, the index's (a replayed delivery of an
-- older change may have a higher id than a live delivery of a newer one,
-- and the newer news wins). Rows another
-- transaction holds are skipped, never waited for; at most p_max rows are
-- superseded per call, oldest first (what is left waits for the next call:
-- a claim does not take the newest while older ones remain). The caller
-- gets back what it superseded.
--
-- Bounded by p_max, not by how deep a (watch, object) is (issue 33): each
-- (watch, object) is walked oldest first in its own index range and stops
-- at its share of p_max (an equal share each, at least one), so the rows
-- read are the rows superseded plus the few in flight that are stepped
-- over. A (watch, object) with more older news than its share is left
-- crowded for the next call.
create or replace function watchpump.supersede_older(p_watch_ids bigint[], p_objects text[], p_max integer)
returns table (delivery_id bigint, service_id bigint, superseded_by bigint)
language plpgsql
set jit = off
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_mergejoin = off
as $$
declare
    v_ids    bigint[];
    v_newest bigint[];
    v_share  integer;
begin
    if greatest(p_max, 0) = 0 or cardinality(p_watch_ids) = 0 then
        return;
    end if;
    v_share := greatest(p_max / cardinality(p_watch_ids), 1);
    with streams as (
        select k.watch_id, k.object, n.id as newest, n.sequence
        from (select distinct u.watch_id, u.object
              from unnest(p_watch_ids, p_objects) as u (watch_id, object)) k
        cross join lateral (
            select q.id, q.sequence from watchpump.queue q
            where q.watch_id = k.watch_id and q.object = k.object
            order by q.sequence desc, q.id desc
            limit 1
        ) n
    ),
    older as (
        select o.id, s.newest
        from streams s
        cross join lateral (
            select q.id from watchpump.queue q
            where q.watch_id = s.watch_id and q.object = s.object
              and watchpump.is_newer(s.sequence, s.newest, q.sequence, q.id)
              and not watchpump.in_flight(q.lease_until)
            order by q.sequence, q.id
            limit v_share
            for update of q skip locked
        ) o
        limit p_max
    )
    select coalesce(array_agg(o.id), '{}'), coalesce(array_agg(o.newest), '{}')
    into v_ids, v_newest
    from older o;
    if cardinality(v_ids) = 0 then
        return;
    end if;
    return query
    select s.delivery_id, s.service_id, n.newest
    from watchpump.settle(v_ids, array_fill('superseded'::text, array[cardinality(v_ids)]), v_newest,
                          array_fill(null::integer, array[cardinality(v_ids)]),
                          array_fill(null::text, array[cardinality(v_ids)])) s
    join unnest(v_ids, v_newest) as n (id, newest) on n.id = s.delivery_id;
end
$$;

-- Moves settled deliveries back to the queue: pending, due now, a fresh
-- deadline, the same id (the consumer still de-duplicates by it) and its
-- attempts so far; wakes the pumps. The callers have checked the order
-- rule. Returns how many moved.
create or replace function watchpump.requeue(p_ids bigint[]) returns integer
language plpgsql as $$
declare
    v_count integer;
begin
    with moved as (
        delete from watchpump.settled s where s.id = any (p_ids) returning s.*
    )
    insert into watchpump.queue (id, change_id, watch_id, service_id, object, attempts, next_attempt_at,
                                 deadline, last_status, last_error, created_at, sequence, replay)
    select m.id, m.change_id, m.watch_id, m.service_id, m.object, m.attempts, now(),
           now() + watchpump.delivery_window(), m.last_status, m.last_error, m.created_at,
           (select c.sequence from watchpump.changes c where c.id = m.change_id), m.replay
    from moved m;
    get diagnostics v_count = row_count;
    -- Out of the failures kept for retention (stage_failed()): it may fail
    -- again (written there again then) or be delivered. After the delete
    -- above, which waits for a retirement of its day under way.
    delete from watchpump.staged_settled s where s.id = any (p_ids);
    if v_count > 0 then
        perform pg_notify('watchpump', '');
    end if;
    return v_count;
end
$$;
