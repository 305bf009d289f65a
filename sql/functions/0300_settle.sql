-- How a delivery leaves the queue, and how it comes back. watchpump.queue
-- holds what is not settled (pending, or in flight while a lease runs);
-- the history (watchpump.settled, 0200_history.sql) holds the rest
-- (0004_storage_v2.sql):
--   - settle() moves deliveries from the queue to the history, each with
--     how it ended (one watchpump.settle_outcome a delivery; settle_as()
--     makes one for a caller with no attempt to keep): the one place a
--     delivery is settled;
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

-- Moves deliveries from the queue to the history, each as its outcome
-- says (a watchpump.settle_outcome, 0026_settle_outcome.sql): its state
-- ('delivered', 'superseded', 'dropped' or 'failed'), and for a superseded
-- one the delivery that superseded it. The callers hold the rows (by lease
-- or by lock). The attempt that delivered (p_pump, and the outcome's
-- started_at, duration_ms and response_head) is kept on the settled row.
-- Failed deliveries are also noted for the warning to notify. The one
-- place a delivery is settled.
-- An outcome with its attempt is settled only while p_pump still holds
-- the lease of that attempt (complete()'s delivered ones: the delete checks
-- the lease as it takes the row lock); the others are left as they are,
-- and not returned.
create or replace function watchpump.settle(p_outcomes watchpump.settle_outcome[], p_pump text default null)
returns table (delivery_id bigint, service_id bigint, state text)
language plpgsql
set jit = off
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_mergejoin = off
as $$
declare
    v_failed bigint[];
begin
    return query
    with outcome as materialized (
        select o.* from unnest(p_outcomes) o
    ),
    moved as (
        delete from watchpump.queue q
        using outcome o
        where q.id = o.delivery_id
          and (o.attempt is null or (q.leased_by = p_pump and q.attempts = o.attempt))
        returning q.*, o.state, o.superseded_by as by, o.status, o.error, o.started_at as started,
                  o.duration_ms as duration, o.response_head as head
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
    v_failed := array(select o.delivery_id from unnest(p_outcomes) o where o.state = 'failed');
    if cardinality(v_failed) > 0 then
        perform watchpump.stage_failed(v_failed);
    end if;
end
$$;

-- The outcome of a delivery settled without an attempt to keep (its caller
-- holds it by a lock, or by a lease it checked): its state, the error the
-- settled row keeps (null: the queued row's last one), for a superseded
-- one the delivery that superseded it, and the answer the row keeps (null:
-- the queued row's last one).
create or replace function watchpump.settle_as(p_delivery_id bigint, p_state text, p_error text default null,
                                               p_superseded_by bigint default null,
                                               p_status integer default null)
returns watchpump.settle_outcome
language sql immutable parallel safe as $$
    select row(p_delivery_id, p_state, p_status, p_error, p_superseded_by, null, null, null,
               null)::watchpump.settle_outcome
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
    v_outcomes watchpump.settle_outcome[];
    v_share    integer;
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
    select coalesce(array_agg(watchpump.settle_as(o.id, 'superseded', null, o.newest)), '{}')
    into v_outcomes
    from older o;
    if cardinality(v_outcomes) = 0 then
        return;
    end if;
    return query
    select s.delivery_id, s.service_id, o.superseded_by
    from watchpump.settle(v_outcomes) s
    join unnest(v_outcomes) o on o.delivery_id = s.delivery_id;
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
