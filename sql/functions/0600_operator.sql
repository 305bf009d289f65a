-- The operator's side in SQL: views to answer "what happened to push X?"
-- from psql, retry functions, the folding of failures into warnings to
-- notify, and the counts behind the metrics' gauges.
-- docs/operator.md ("From psql") has a session to paste. Pruning is the history's
-- (0200_history.sql).
--
-- Errors raised here carry SQLSTATEs the admin API maps to HTTP statuses:
-- P0002 (no such delivery or service) -> 404, 55000 (not in a state that
-- allows it) -> 409, 22023 / 22004 (bad argument) -> 422.

-- Every delivery, queued or settled, with the columns the single table of
-- before had (0004_storage_v2.sql): what operators' own queries read.
-- `state` of a queued delivery is 'in_flight' while its lease runs and
-- 'pending' otherwise. Filters on state reach only the table that can hold
-- it (the settled table's check constraint excludes the open states).
create or replace view watchpump.deliveries as
select q.id, q.change_id, q.watch_id, q.service_id, q.object,
       case when watchpump.in_flight(q.lease_until) then 'in_flight' else 'pending' end as state,
       q.attempts, q.next_attempt_at,
       case when watchpump.in_flight(q.lease_until) then q.lease_until end as lease_until,
       case when watchpump.in_flight(q.lease_until) then q.leased_by end as leased_by,
       q.deadline, null::bigint as superseded_by, q.last_status, q.last_error, q.created_at,
       null::timestamptz as finished_at, q.replay
from watchpump.queue q
union all
select s.id, s.change_id, s.watch_id, s.service_id, s.object, s.state, s.attempts, s.next_attempt_at,
       null::timestamptz, null::text, s.deadline, s.superseded_by, s.last_status, s.last_error,
       s.created_at, s.finished_at, s.replay
from watchpump.settled s;

-- Every attempt to send a delivery, as the table of that name held them
-- before 0004_storage_v2.sql: the log of attempts that did not deliver, the
-- delivering attempt kept on its settled row, and a delivering attempt
-- kept on the action that queued its delivery again (a redelivery or a
-- retry deletes the settled row: 0022_consumer_shares.sql). A row of the
-- log stands for `repeats` attempts in a row (attempt .. attempt + repeats
-- - 1): status and error are the last one's, first_status and first_error
-- the first one's, statuses counts the answers ({"503": 4, "no answer": 2}).
create or replace view watchpump.attempts as
select a.id, a.delivery_id, a.attempt, a.started_at, a.duration_ms, a.status, a.error,
       a.response_head, a.pump, a.repeats, a.last_started_at, a.first_status, a.first_error,
       a.statuses
from watchpump.attempt_log a
union all
select null::bigint, s.id, s.attempts, s.last_started_at, s.last_duration_ms, s.last_status, null::text,
       s.last_response_head, s.last_pump, 1, null::timestamptz, s.last_status, null::text,
       jsonb_build_object(s.last_status::text, 1)
from watchpump.settled s
where s.last_pump is not null
union all
select null::bigint, x.delivery_id, x.attempt, x.attempt_started_at, x.attempt_duration_ms,
       x.attempt_status, null::text, x.attempt_response_head, x.attempt_pump, 1, null::timestamptz,
       x.attempt_status, null::text,
       jsonb_build_object(coalesce(x.attempt_status::text, 'no answer'), 1)
from watchpump.actions x
where x.attempt is not null;

-- What each live consumer service has waiting, on its way and failed: the
-- counts that the operator's view watchpump.backlog shows and the gauges
-- export (backlog_counts()), defined once.
--   pending             deliveries waiting to be sent, scheduled retries included
--   in_flight           deliveries a pump has claimed and is sending
--   due_now             pending deliveries whose next attempt is due
--   oldest_due_at       when the oldest due delivery became due (null: none)
--   retrying            pending deliveries that were attempted before
--   oldest_retrying_at  when the oldest of those was created (null: none)
--   failed_24h          deliveries that ended 'failed' in the last 24 hours
-- Each service's part of the queue (which holds only what is not settled)
-- is read through queue_due, so one service's row costs its own backlog.
-- The failures of the last day are counted in one pass of the partial
-- index of failures by time, grouped by service: that index is not by
-- service, and a count per service re-read every service's failures
-- (services x failures at each refresh of the gauges). A view, not a
-- function: the backlog view reads it with its owner's rights, so its
-- readers need no right on the tables.
create or replace view watchpump.service_backlog as
select s.id as service_id,
       s.name as service,
       q.pending,
       q.in_flight,
       q.due_now,
       q.oldest_due_at,
       q.retrying,
       q.oldest_retrying_at,
       coalesce(f.failed_24h, 0) as failed_24h
from watchpump.services s
cross join lateral (
    select count(*) filter (where not watchpump.in_flight(d.lease_until)) as pending,
           count(*) filter (where watchpump.in_flight(d.lease_until)) as in_flight,
           count(*) filter (where not watchpump.in_flight(d.lease_until)
                              and d.next_attempt_at <= now()) as due_now,
           min(d.next_attempt_at) filter (where not watchpump.in_flight(d.lease_until)
                                            and d.next_attempt_at <= now()) as oldest_due_at,
           -- Waiting for a retry, not on the wire: a claim counts the
           -- attempt it starts, so an in-flight first attempt has attempts = 1.
           count(*) filter (where d.attempts > 0 and not watchpump.in_flight(d.lease_until)) as retrying,
           min(d.created_at) filter (where d.attempts > 0
                                       and not watchpump.in_flight(d.lease_until)) as oldest_retrying_at
    from watchpump.queue d
    where d.service_id = s.id
) q
left join (
    select d.service_id, count(*) as failed_24h
    from watchpump.settled d
    where d.state = 'failed' and d.finished_at > now() - interval '24 hours'
    group by d.service_id
) f on f.service_id = s.id
where s.removed_at is null;

-- One row per consumer service: what waits, what is on its way, what failed.
-- `looks_down`: deliveries are being retried (or failed) and nothing was
-- delivered to the service since the oldest of them was created (or since
-- the last failure).
create or replace view watchpump.backlog as
select s.id as service_id,
       s.name as service,
       q.pending,
       q.in_flight,
       q.due_now,
       q.failed_24h,
       date_trunc('second', now() - q.oldest_due_at) as oldest_due_age,
       l.last_delivered_at,
       lf.last_failed_at,
       q.retrying,
       coalesce(
           (q.oldest_retrying_at is not null
            and coalesce(l.last_delivered_at, '-infinity') < q.oldest_retrying_at)
           or (lf.last_failed_at is not null
               and coalesce(l.last_delivered_at, '-infinity') < lf.last_failed_at),
           false) as looks_down,
       -- Paused (issue 20, 0550_pause.sql): the whole service, or how
       -- many of its live watches; their deliveries wait, held.
       s.paused_at is not null as paused,
       (select count(*) from watchpump.watches pw
        where pw.service_id = s.id and pw.paused_at is not null and pw.removed_at is null) as paused_watches,
       -- Deliveries a second it may get, all pumps together (null: no limit).
       least(coalesce(s.max_rate, s.consumer_rate), coalesce(s.consumer_rate, s.max_rate)) as rate
from watchpump.service_backlog q
join watchpump.services s on s.id = q.service_id
-- The last failure and the last delivery: the newest of each by id (one
-- probe of each day's partial index of a service's failures, where
-- max(finished_at) read every failure the service ever had: 96 ms at
-- 1 M deliveries).
left join lateral (
    select d.finished_at as last_failed_at
    from watchpump.settled d
    where d.service_id = s.id and d.state = 'failed'
    order by d.id desc
    limit 1
) lf on true
left join lateral (
    select d.finished_at as last_delivered_at
    from watchpump.settled d
    where d.service_id = s.id and d.state = 'delivered'
    order by d.id desc
    limit 1
) l on true;

-- One readable row per delivery: its watch, its change, where it stands,
-- and the last thing a person did to it. Filter it like a table:
--   select * from watchpump.delivery_log where service = 'deploy' and state = 'failed'
--   order by delivery_id desc limit 20;
create or replace view watchpump.delivery_log as
select d.id as delivery_id,
       d.created_at,
       s.name as service,
       d.watch_id,
       w.resource,
       w.object as watch_object,
       d.object,
       c.kind,
       d.change_id,
       c.sequence,
       d.state,
       d.attempts,
       d.next_attempt_at,
       d.deadline,
       d.finished_at,
       d.last_status,
       d.last_error,
       d.superseded_by,
       a.last_action,
       d.service_id
from watchpump.deliveries d
join watchpump.services s on s.id = d.service_id
join watchpump.watches w on w.id = d.watch_id
cross join lateral (
    -- The delivery's change, in the one day of `changes` that holds it. A
    -- delivery is created at its change's time (emit()), so `created_at`
    -- names the change's day and the first branch reads one partition
    -- (pruned at run time, once per delivery); a delivery created later
    -- than its change (a ping's) finds it in the second branch, which
    -- probes every day and runs only when the first found nothing (LIMIT 1
    -- stops the Append). A lateral subquery with LIMIT, so that the planner
    -- cannot make it a join that hashes the whole of `changes` (it did: 2 s
    -- for a page of 50 at 1 M rows). Written out here rather than as a
    -- function: the views' readers may not read `changes` themselves.
    select x.kind, x.sequence, x.object
    from (select ch.kind, ch.sequence, ch.object from watchpump.changes ch
          where ch.id = d.change_id and ch.occurred_at = d.created_at
          union all
          select ch.kind, ch.sequence, ch.object from watchpump.changes ch
          where ch.id = d.change_id) x
    limit 1
) c
left join lateral (
    select x.action || ' by ' || x.actor || ' at '
           || to_char(x.at at time zone 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC' as last_action
    from watchpump.actions x
    where x.delivery_id = d.id
    order by x.id desc
    limit 1
) a on true;

-- Every watch, live or removed, with its owner and filters.
create or replace view watchpump.watch_list as
select w.id as watch_id,
       s.name as service,
       w.resource,
       w.object,
       w.kinds,
       w.filters ->> 'match' as match,
       w.filters,
       w.created_at,
       w.removed_at,
       w.removed_reason,
       w.removed_at is null as live,
       w.service_id
from watchpump.watches w
join watchpump.services s on s.id = w.service_id;

-- A delivery's life, one event per row: created, each attempt (identical
-- failures in a row as one event, "attempt 3-9"), each action (retry), and
-- how it ended. Read it with
--   select * from watchpump.delivery_history where delivery_id = 42 order by at, seq;
-- An ending that a retry undid keeps its event (kept on the retry's action:
-- ended_at, ended_detail), before the retry's own.
create or replace view watchpump.delivery_history as
select d.id as delivery_id, d.created_at as at, 0 as seq, 'created' as event,
       format('change %s (%s of %s, sequence %s) for watch %s', d.change_id, c.kind, c.object,
              c.sequence, d.watch_id)
       || case when d.replay then ', a replay asked for by a resync' else '' end as detail
from watchpump.deliveries d
cross join lateral (
    -- As in delivery_log: the change in its day.
    select x.kind, x.sequence, x.object
    from (select ch.kind, ch.sequence, ch.object from watchpump.changes ch
          where ch.id = d.change_id and ch.occurred_at = d.created_at
          union all
          select ch.kind, ch.sequence, ch.object from watchpump.changes ch
          where ch.id = d.change_id) x
    limit 1
) c
union all
select a.delivery_id, a.started_at, 1,
       'attempt ' || a.attempt || case when a.repeats > 1
                                       then '-' || (a.attempt + a.repeats - 1) else '' end,
       coalesce(a.error, 'HTTP ' || a.status)
       || format(' after %s ms, by pump %s', round(a.duration_ms::numeric, 1), a.pump)
       || case when a.repeats > 1
               then format(' (%s attempts: %s; the last at %s UTC)', a.repeats,
                           (select string_agg(case when e.key ~ '^[0-9]+$' then 'HTTP ' || e.key
                                                   else e.key end || ' x' || e.value,
                                              ', ' order by e.value::integer desc, e.key)
                            from jsonb_each_text(coalesce(a.statuses,
                                                          jsonb_build_object('?', a.repeats))) e),
                           to_char(a.last_started_at at time zone 'UTC', 'YYYY-MM-DD HH24:MI:SS'))
               else '' end
from watchpump.attempts a
union all
select x.delivery_id, x.at, 2, x.action,
       format('by %s; it was %s', x.actor, x.from_state) || coalesce(' (' || x.note || ')', '')
from watchpump.actions x
union all
select x.delivery_id, x.ended_at, 3, x.from_state, x.ended_detail
from watchpump.actions x
where x.ended_at is not null
union all
select d.id, d.finished_at, 3, d.state,
       case d.state
           when 'superseded' then 'by delivery ' || d.superseded_by
           else d.last_error
       end
from watchpump.settled d;

-- Newer news of a delivery's (watch, object) that was sent or is on its
-- way: requeueing the delivery would send older news after it, which the
-- order rule (0500_delivery.sql) forbids. The newest such delivery, if any.
--
-- Newer is is_newer() (0000_vocabulary.sql), of another change: a copy of
-- the same change (a resync's replay of it, or the live delivery a replay
-- repeats) carries the same news, and does not stand in the way. Queued
-- rows carry their sequence; in the history the candidates are the newest
-- sent live row and the newest sent replay (a later resync replays the
-- same or newer news), compared by their change's sequence, except a live
-- row with a live one: live deliveries of one (watch, object) are created
-- in sequence order (emit() numbers them under the object's row lock), so
-- among them is_newer()'s order is their ids', and no change is read.
create or replace function watchpump.newer_news(p_delivery_id bigint)
returns table (delivery_id bigint, state text)
language sql stable as $$
    with d as (
        select x.watch_id, x.object, x.replay, x.change_id, x.sequence
        from (select q.watch_id, q.object, q.replay, q.change_id, q.sequence
              from watchpump.queue q where q.id = p_delivery_id
              union all
              select s.watch_id, s.object, s.replay, s.change_id,
                     (select c.sequence from watchpump.changes c where c.id = s.change_id)
              from watchpump.settled s where s.id = p_delivery_id) x
        limit 1
    )
    select n.id, n.state
    from d
    cross join lateral (
        -- Queued or on its way.
        (select q.id, case when watchpump.in_flight(q.lease_until) then 'in_flight' else 'pending' end as state
         from watchpump.queue q
         where q.watch_id = d.watch_id and q.object = d.object
           and watchpump.is_newer(q.sequence, q.id, d.sequence, p_delivery_id)
           and q.change_id <> d.change_id
         order by q.sequence desc, q.id desc limit 1)
        union all
        -- Sent, live: a later id (for a live delivery), or the newest one,
        -- if newer (for a replay).
        (select l.id, l.state
         from (select s.id, s.state, s.change_id
               from watchpump.settled s
               where s.object = d.object and s.watch_id = d.watch_id and not s.replay
                 and s.id <> p_delivery_id
                 and (d.replay or s.id > p_delivery_id)
                 and (s.state in ('delivered', 'failed') or s.attempts > 0)
               order by s.id desc limit 1) l
         where not d.replay
            or (l.change_id <> d.change_id
                and watchpump.is_newer((select c.sequence from watchpump.changes c where c.id = l.change_id), l.id,
                                       d.sequence, p_delivery_id)))
        union all
        -- Sent, a replay: the newest one, if newer.
        (select r.id, r.state
         from (select s.id, s.state, s.change_id
               from watchpump.settled s
               where s.object = d.object and s.watch_id = d.watch_id and s.replay
                 and s.id <> p_delivery_id
                 and (s.state in ('delivered', 'failed') or s.attempts > 0)
               order by s.id desc limit 1) r
         where r.change_id <> d.change_id
           and watchpump.is_newer((select c.sequence from watchpump.changes c where c.id = r.change_id), r.id,
                                  d.sequence, p_delivery_id))
    ) n
    order by n.id desc
    limit 1
$$;

-- The attempt a settled delivery keeps on its row (the one that delivered
-- it), as the action that queues it again keeps it: one row, all null when
-- the row keeps none (a failed or dropped delivery's attempts are all in
-- attempt_log).
create or replace function watchpump.settled_attempt(p_settled watchpump.settled)
returns table (attempt integer, started_at timestamptz, duration_ms double precision, status integer,
               response_head text, pump text)
language sql immutable as $$
    select case when p_settled.last_pump is not null then p_settled.attempts end,
           case when p_settled.last_pump is not null then p_settled.last_started_at end,
           case when p_settled.last_pump is not null then p_settled.last_duration_ms end,
           case when p_settled.last_pump is not null then p_settled.last_status end,
           case when p_settled.last_pump is not null then p_settled.last_response_head end,
           p_settled.last_pump
$$;

-- Requeue a failed or dropped delivery: pending, due now, a fresh deadline,
-- the same id (the consumer still de-duplicates by it). Records who did it
-- and wakes the pumps. Returns the state the delivery had.
-- A dropped delivery whose watch is still removed gets one attempt: it is
-- delivered if the consumer takes it, dropped again otherwise.
create or replace function watchpump.retry(p_delivery_id bigint, p_actor text default null)
returns text
language plpgsql as $$
declare
    v_settled       watchpump.settled;
    v_state         text;
    v_error         text;
    v_superseded_by bigint;
    v_newer_state   text;
    v_ended_at      timestamptz;
begin
    select d.* into v_settled
    from watchpump.settled d
    where d.id = p_delivery_id
    for update;
    v_state := v_settled.state;
    v_error := v_settled.last_error;
    v_superseded_by := v_settled.superseded_by;
    v_ended_at := v_settled.finished_at;
    if not found then
        select d.state into v_state from watchpump.deliveries d where d.id = p_delivery_id;
        if not found then
            raise exception 'watchpump.retry: there is no delivery %', p_delivery_id
                using errcode = 'P0002';
        end if;
    end if;
    if v_state = 'superseded' then
        raise exception 'watchpump.retry: delivery % was superseded by delivery %, which carries newer news of the same object',
            p_delivery_id, v_superseded_by
            using errcode = '55000', hint = 'retry the newer delivery instead';
    elsif v_state not in ('failed', 'dropped') then
        raise exception 'watchpump.retry: delivery % is %; only failed or dropped deliveries can be retried',
            p_delivery_id, v_state
            using errcode = '55000';
    end if;
    -- Newer news of the same (watch, object), sent or on its way, would be
    -- overtaken by this older one.
    select n.delivery_id, n.state into v_superseded_by, v_newer_state
    from watchpump.newer_news(p_delivery_id) n;
    if found and v_newer_state in ('pending', 'in_flight') then
        raise exception 'watchpump.retry: delivery % of the same object, with newer news, is already on its way',
            v_superseded_by
            using errcode = '55000', hint = 'nothing to retry: the newer delivery carries the object''s news';
    elsif found then
        raise exception 'watchpump.retry: delivery % of the same object, with newer news, was already sent (it is %)',
            v_superseded_by, v_newer_state
            using errcode = '55000', hint = 'retry the newer delivery instead';
    end if;

    perform watchpump.requeue(array[p_delivery_id]);
    -- The action keeps the ending and the attempt the settled row held.
    insert into watchpump.actions (delivery_id, action, actor, from_state, note, ended_at, ended_detail,
                                   attempt, attempt_started_at, attempt_duration_ms, attempt_status,
                                   attempt_response_head, attempt_pump)
    select p_delivery_id, 'retry', watchpump.actor(p_actor), v_state, v_error, v_ended_at, v_error, a.*
    from watchpump.settled_attempt(v_settled) a;
    return v_state;
end
$$;

-- Requeue every delivery to `p_service` that failed at or after `p_since`
-- (the "recover" of Svix and Convoy), the newest of each object: older news
-- of an object stays failed. Returns how many were requeued.
create or replace function watchpump.retry_failed(p_service text, p_since timestamptz, p_actor text default null)
returns integer
language plpgsql as $$
declare
    v_service_id bigint;
    v_ids        bigint[];
begin
    if p_since is null then
        raise exception 'watchpump.retry_failed: since must be a time, e.g. now() - interval ''1 day'''
            using errcode = '22004';
    end if;
    select s.id into v_service_id from watchpump.services s where s.name = p_service and s.removed_at is null;
    if not found then
        raise exception 'watchpump.retry_failed: there is no service %', coalesce(quote_literal(p_service), 'null')
            using errcode = 'P0002';
    end if;

    -- Only the newest failed delivery of each (watch, object), and only when
    -- no newer one was sent or is under way (newer_news()): older news stays
    -- failed rather than overtaking newer news of the same object.
    with candidates as (
        select d.id,
               row_number() over (partition by d.watch_id, d.object order by d.id desc) as newest_first
        from watchpump.settled d
        where d.service_id = v_service_id and d.state = 'failed' and d.finished_at >= p_since
    )
    select coalesce(array_agg(c.id), '{}') into v_ids
    from candidates c
    where c.newest_first = 1
      and not exists (select 1 from watchpump.newer_news(c.id));

    insert into watchpump.actions (delivery_id, action, actor, from_state, note, ended_at, ended_detail,
                                   attempt, attempt_started_at, attempt_duration_ms, attempt_status,
                                   attempt_response_head, attempt_pump)
    select d.id, 'retry', watchpump.actor(p_actor),
           'failed', 'all failed since ' || p_since::text || coalesce('; ' || d.last_error, ''),
           d.finished_at, d.last_error, a.*
    from watchpump.settled d
    cross join lateral watchpump.settled_attempt(d) a
    where d.id = any (v_ids);
    return watchpump.requeue(v_ids);
end
$$;

-- Drain failure_inbox into warnings, one row per service in the result.
-- Failures join the service's pending warning if it has one (they are
-- folded: counted, not announced again); otherwise they open a new warning,
-- to be sent now, or `p_every` after the service's previous warning was
-- sent: at most one warning per service per `p_every`.
create or replace function watchpump.fold_failures(p_every interval, p_deadline interval)
returns table (warning_id bigint, service_id bigint, service text, added integer, opened boolean)
language plpgsql as $$
declare
    r           record;
    v_open      bigint;
    v_previous  timestamptz;
    v_send_at   timestamptz;
begin
    for r in
        with drained as (
            delete from watchpump.failure_inbox returning *
        )
        select x.service_id, s.name, count(*)::integer as n, min(x.created_at) as oldest,
               min(x.failed_at) as first_at, max(x.failed_at) as last_at
        from drained x
        join watchpump.services s on s.id = x.service_id
        group by x.service_id, s.name
        order by x.service_id
    loop
        select w.id into v_open
        from watchpump.warnings w
        where w.service_id = r.service_id and w.state = 'pending'
        for update;
        if found then
            update watchpump.warnings w
            set failed = w.failed + r.n, folded = w.folded + r.n,
                oldest_created_at = least(w.oldest_created_at, r.oldest),
                last_failed_at = greatest(w.last_failed_at, r.last_at)
            where w.id = v_open;
            return query select v_open, r.service_id, r.name::text, r.n, false;
        else
            select max(coalesce(w.finished_at, w.created_at)) into v_previous
            from watchpump.warnings w
            where w.service_id = r.service_id;
            v_send_at := greatest(now(), coalesce(v_previous + p_every, now()));
            insert into watchpump.warnings (service_id, failed, oldest_created_at, first_failed_at,
                                            last_failed_at, send_after, deadline, next_attempt_at)
            values (r.service_id, r.n, r.oldest, r.first_at, r.last_at, v_send_at,
                    v_send_at + p_deadline, v_send_at)
            returning id into v_open;
            return query select v_open, r.service_id, r.name::text, r.n, true;
        end if;
    end loop;
end
$$;

-- Record an attempt to hand a warning to notify: 'sent', 'logged' (no
-- notify configured), or 'retry' at p_next ('failed' once past its deadline).
-- Returns the warning's new state.
create or replace function watchpump.warning_attempted(
    p_id bigint, p_outcome text, p_status integer, p_error text, p_next timestamptz
) returns text
language plpgsql as $$
declare
    v_state text;
begin
    if p_outcome not in ('sent', 'logged', 'retry') then
        raise exception 'watchpump.warning_attempted: outcome % is not sent, logged or retry', p_outcome
            using errcode = '22023';
    end if;
    update watchpump.warnings w
    set attempts = w.attempts + 1,
        last_status = p_status,
        last_error = p_error,
        state = case
                    when p_outcome <> 'retry' then p_outcome
                    when p_next > w.deadline then 'failed'
                    else 'pending'
                end,
        next_attempt_at = case when p_outcome = 'retry' then p_next else w.next_attempt_at end,
        finished_at = case
                          when p_outcome <> 'retry' or p_next > w.deadline then clock_timestamp()
                      end
    where w.id = p_id and w.state = 'pending'
    returning w.state into v_state;
    return v_state;
end
$$;

-- The numbers behind the backlog gauges (src/metrics/backlog.rs): one row
-- per consumer service, every service included even when it has nothing
-- waiting, so that dashboards show a 0 rather than no data.
--
-- The counts are the view watchpump.service_backlog's, as the view
-- watchpump.backlog shows them; oldest_due_age is in seconds (0 when
-- nothing is due). One pump calls this every few seconds.
create or replace function watchpump.backlog_counts()
returns table (
    service         text,
    pending         bigint,
    in_flight       bigint,
    due_now         bigint,
    failed_24h      bigint,
    oldest_due_age  double precision
)
language sql stable as $$
    select b.service, b.pending, b.in_flight, b.due_now, b.failed_24h,
           coalesce(extract(epoch from now() - b.oldest_due_at), 0)::double precision
    from watchpump.service_backlog b
    order by b.service
$$;

-- Per live service, how many of its live watches a pause holds (all of
-- them while the service is paused), and the rate that holds for it (null:
-- none): the gauges watchpump_paused_watches and watchpump_rate_limit
-- (src/metrics/backlog.rs). Reads watches through watches_paused and
-- watches_service only.
create or replace function watchpump.consumer_gauges()
returns table (service text, paused_watches bigint, rate integer)
language sql stable as $$
    select s.name,
           case when s.paused_at is not null
                then (select count(*) from watchpump.watches w
                      where w.service_id = s.id and w.removed_at is null)
                else (select count(*) from watchpump.watches w
                      where w.service_id = s.id and w.paused_at is not null and w.removed_at is null)
           end,
           watchpump.effective_rate(s.max_rate, s.consumer_rate)
    from watchpump.services s
    where s.removed_at is null
    order by s.name
$$;
