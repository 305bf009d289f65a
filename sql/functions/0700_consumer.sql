-- The consumer's own calls (issue 20; src/resources/deliveries/consumer.rs,
-- docs/protocol.md "The consumer's own view"). Each takes the calling
-- service's id and treats another service's delivery or watch as missing
-- (P0002, a 404 at the API): a service sees only its own.

-- Queue a settled delivery again under the same id (the consumer
-- de-duplicates by it), as retry() does for the operator, but for any
-- delivery the service has that was delivered, failed or dropped: GitHub's
-- "Redeliver". The order rule (0500_delivery.sql) holds: a superseded delivery,
-- or one whose (watch, object) has newer news sent or on its way
-- (newer_news()), is refused (55000, a 409), as is one still queued.
-- Bounded (docs/security.md, "Bounds"): one redelivery of a delivery per
-- REDELIVER_EVERY = 1 minute (54000, a 429, with the seconds to wait in
-- its detail), so that a delivery cannot be sent in a loop; the
-- service's token bucket (take_write_tokens()) bounds all of them.
-- Recorded as a 'retry' action by p_actor, which keeps the attempt that
-- delivered it (requeue() deletes the settled row that held it): the
-- delivery's record loses no attempt. Returns the state it had.
create or replace function watchpump.redeliver(p_service_id bigint, p_delivery_id bigint, p_actor text)
returns text
language plpgsql as $$
declare
    v_settled     watchpump.settled;
    v_state       text;
    v_newer       bigint;
    v_newer_state text;
    v_last        timestamptz;
begin
    select d.* into v_settled
    from watchpump.settled d
    where d.id = p_delivery_id and d.service_id = p_service_id
    for update;
    if not found then
        select case when watchpump.in_flight(q.lease_until) then 'in flight' else 'queued' end into v_state
        from watchpump.queue q
        where q.id = p_delivery_id and q.service_id = p_service_id;
        if not found then
            raise exception 'watchpump.redeliver: there is no delivery % for this service', p_delivery_id
                using errcode = 'P0002';
        end if;
        raise exception 'watchpump.redeliver: delivery % is % already', p_delivery_id, v_state
            using errcode = '55000';
    end if;
    if v_settled.state = 'superseded' then
        raise exception 'watchpump.redeliver: delivery % was superseded by delivery %, which carries newer news of the same object',
            p_delivery_id, v_settled.superseded_by
            using errcode = '55000';
    end if;
    select n.delivery_id, n.state into v_newer, v_newer_state
    from watchpump.newer_news(p_delivery_id) n;
    if found then
        raise exception 'watchpump.redeliver: delivery % of the same object, with newer news, was already sent or is on its way (it is %)',
            v_newer, v_newer_state
            using errcode = '55000';
    end if;
    -- After the refusals that waiting cannot change: a 429 says "later".
    select max(x.at) into v_last from watchpump.actions x where x.delivery_id = p_delivery_id;
    if v_last > now() - interval '1 minute' then
        raise exception 'watchpump.redeliver: delivery % was redelivered less than a minute ago; a delivery may be redelivered once a minute',
            p_delivery_id
            using errcode = '54000',
                  detail = 'retry_after=' || ceil(extract(epoch from v_last + interval '1 minute' - now()));
    end if;
    perform watchpump.requeue(array[p_delivery_id]);
    -- As retry() (0600_operator.sql): the ended event, and the attempt that
    -- made it, stay in the history after the delivery is queued again.
    insert into watchpump.actions (delivery_id, action, actor, from_state, note, ended_at, ended_detail,
                                   attempt, attempt_started_at, attempt_duration_ms, attempt_status,
                                   attempt_response_head, attempt_pump)
    select p_delivery_id, 'retry', p_actor, v_settled.state, 'redelivery asked for by the consumer',
           v_settled.finished_at, v_settled.last_error, a.*
    from watchpump.settled_attempt(v_settled) a;
    return v_settled.state;
end
$$;

-- A ping to one of the service's live watches: a change of kind
-- 'watchpump.ping' on the object 'watchpump.ping/<watch id>' (never a
-- producer's object, so it supersedes nothing but an older ping of the same
-- watch), and one delivery of it to that watch alone, queued like any
-- other: signed, retried, listed. Never through emit(): no other watch
-- receives it and strict mode does not apply. Bounded (docs/security.md, "Bounds"):
-- at most one ping per watch per p_every; a sooner one is refused with
-- 54000 (a 429). A removed watch is P0002 (404). Returns the delivery's id.
create or replace function watchpump.ping(p_service_id bigint, p_watch_id bigint, p_every interval)
returns bigint
language plpgsql as $$
declare
    v_removed  timestamptz;
    v_object   text := 'watchpump.ping/' || p_watch_id;
    v_last     timestamptz;
    v_sequence bigint;
    v_payload  jsonb;
    v_change   bigint;
    v_occurred timestamptz;
    v_id       bigint;
begin
    select w.removed_at into v_removed
    from watchpump.watches w
    where w.id = p_watch_id and w.service_id = p_service_id
    for update;
    if not found then
        raise exception 'watchpump.ping: there is no watch % for this service', p_watch_id
            using errcode = 'P0002';
    elsif v_removed is not null then
        raise exception 'watchpump.ping: watch % was removed', p_watch_id
            using errcode = 'P0002';
    end if;
    -- The watch's row lock above serialises pings of one watch.
    select max(d.created_at) into v_last
    from watchpump.deliveries d
    where d.watch_id = p_watch_id and d.object = v_object;
    if v_last > now() - p_every then
        raise exception 'watchpump.ping: watch % was pinged less than % ago', p_watch_id, p_every
            using errcode = '54000',
                  detail = 'retry_after=' || ceil(extract(epoch from v_last + p_every - now()));
    end if;
    -- Above this timeline's floor, as emit()'s (0023_timeline_floors.sql).
    insert into watchpump.objects as o (object, last_sequence)
    values (v_object, watchpump.id_floor() + 1)
    on conflict (object) do update set last_sequence = greatest(o.last_sequence, watchpump.id_floor()) + 1
    returning o.last_sequence into v_sequence;
    v_payload := jsonb_build_object('watch_id', p_watch_id, 'zen', 'pong');
    insert into watchpump.changes (object, kind, sequence, payload, payload_bytes)
    values (v_object, 'watchpump.ping', v_sequence, v_payload, octet_length(v_payload::text))
    returning id, occurred_at into v_change, v_occurred;
    -- The change's time, as emit() does: claim() finds a delivery's change
    -- by it, and retention keeps the two in one day.
    insert into watchpump.queue (change_id, watch_id, service_id, object, sequence, deadline, created_at)
    values (v_change, p_watch_id, p_service_id, v_object, v_sequence, now() + watchpump.delivery_window(),
            v_occurred)
    returning id into v_id;
    perform pg_notify('watchpump', '');
    return v_id;
end
$$;

-- RESYNC (docs/protocol.md "Resync"). For every object a watch covers, the
-- newest retained change that matches the watch's kinds and filter is
-- queued again for it, as an ordinary delivery with replay = true (its body
-- says "replay": true, with the change's own change_id and sequence).
--   - One resync per service at a time (issue 34: 300 resyncs of one
--     service's watches queued 600,000 replays): resync_start() takes the
--     watch's row in watchpump.resyncs, and refuses (54000, a 429) while a
--     resync of any watch of the service holds one; resync_finish() gives
--     it back. A row whose heartbeat is older than a minute was left by a
--     process that died, and is taken over.
--   - A daily replay budget per service, for the consumer's own resyncs
--     (consumer_resync_start()): a resync goes through at most as many
--     objects as the budget holds replays, and the replays it did not
--     queue are given back when it ends (give_back_replays()).
--   - Bounded: the caller (src/resync.rs) goes through at most
--     WATCHPUMP_RESYNC_MAX_OBJECTS objects, in batches of resync_batch(),
--     each its own short transaction.
--   - Off the producer's path: it reads changes and objects and writes
--     only queue rows; it takes no lock an emit() waits on (emit() never
--     takes the order rule's stream locks, and resync locks no row of
--     objects or changes).
--   - The order rule holds: each batch first takes the stream lock of
--     every (watch, object) it covers (claim() takes the same), and
--     only then, with a fresh snapshot, looks up each object's newest
--     change. So whatever was sent before is at most as new as the replay,
--     and whatever is committed later is queued beside the replay and,
--     carrying a higher sequence, supersedes it (the queue is ordered by
--     sequence: 0012_resync.sql). A replay is not queued where the queue
--     already holds the same or newer news of the (watch, object).

-- Takes the watch's resync slot. P0002 (404) for a watch the service does
-- not have live, 54000 (429) while another resync of it runs. Returns how
-- many objects the watch covers, at most p_max (truncated when there are
-- more), and the start of the oldest day of changes still kept: history
-- before it was pruned (null when the changes are not kept by day).
create or replace function watchpump.resync_start(p_service_id bigint, p_watch_id bigint, p_max integer,
                                                  out objects integer, out truncated boolean,
                                                  out history_from timestamptz)
language plpgsql as $$
declare
    v_object  text;
    v_covered integer;
    v_running bigint;
begin
    select w.object into v_object
    from watchpump.watches w
    where w.id = p_watch_id and w.service_id = p_service_id and w.removed_at is null;
    if not found then
        raise exception 'watchpump.resync_start: there is no live watch % for this service', p_watch_id
            using errcode = 'P0002';
    end if;
    -- One at a time per service: the check and the insert under a lock of
    -- the service's, so that two starts cannot both find none running.
    perform pg_advisory_xact_lock(watchpump.lock_class(), hashtext('watchpump.resync/' || p_service_id));
    select r.watch_id into v_running
    from watchpump.resyncs r
    where r.service_id = p_service_id and r.heartbeat_at >= now() - interval '1 minute'
    limit 1;
    if found then
        raise exception 'watchpump.resync_start: a resync of watch % of this service is running: one at a time per service', v_running
            using errcode = '54000', detail = 'retry_after=5';
    end if;
    -- What is left is stale: its process died.
    delete from watchpump.resyncs r where r.service_id = p_service_id;
    insert into watchpump.resyncs as r (watch_id, service_id)
    values (p_watch_id, p_service_id)
    on conflict (watch_id) do update
        set service_id = excluded.service_id, started_at = now(), heartbeat_at = now();
    select count(*)::integer into v_covered
    from (select 1 from watchpump.covered_objects(v_object, null, greatest(p_max, 0) + 1)) c;
    objects := least(v_covered, greatest(p_max, 0));
    truncated := v_covered > greatest(p_max, 0);
    select min(p.from_at) into history_from from watchpump.partitions p
    where p.parent = 'changes' and not p.kept;
end
$$;

-- The objects a watch's object covers (itself, or every object under it
-- when it ends in '/': emit()'s object_prefixes() the other way round),
-- after p_after in byte order, at most p_limit: a range scan of
-- objects_pattern (0012_resync.sql). Pings' own objects are not covered.
create or replace function watchpump.covered_objects(p_watch_object text, p_after text, p_limit integer)
returns table (object text)
language sql stable
set enable_seqscan = off
as $$
    select o.object from watchpump.objects o
    where right(p_watch_object, 1) = '/'
      and o.object ~>=~ p_watch_object
      -- '0' is the byte after '/': every object with the prefix sorts
      -- before the prefix with its '/' made a '0'.
      and o.object ~<~ (left(p_watch_object, -1) || '0')
      and (p_after is null or o.object ~>~ p_after)
      and o.object not like 'watchpump.ping/%'
    union all
    select o.object from watchpump.objects o
    where right(p_watch_object, 1) <> '/'
      and o.object = p_watch_object
      and (p_after is null or o.object ~>~ p_after)
    order by 1 using ~<~
    limit greatest(p_limit, 0)
$$;

-- One batch of a resync: the next p_limit objects after p_after that the
-- watch covers, each with its newest retained change that matches the
-- watch queued as a replay (unless the queue holds the same or newer news
-- of it). Looks at most RESYNC_DEPTH = 1000 of an object's newest changes
-- for one that matches: an object with more non-matching changes than that
-- on top is not replayed (a bound on what one consumer's filter may cost).
-- Returns the last object looked at (the next batch's p_after), how many
-- objects were looked at (fewer than p_limit: the last batch) and how many
-- replays were queued. Keeps the resync's heartbeat.
create or replace function watchpump.resync_batch(p_watch_id bigint, p_after text, p_limit integer,
                                                  out last_object text, out objects integer,
                                                  out queued integer)
language plpgsql
set jit = off
as $$
declare
    v_watch   watchpump.watches;
    v_objects text[];
begin
    select * into v_watch from watchpump.watches w where w.id = p_watch_id and w.removed_at is null;
    if not found then
        objects := 0; queued := 0;
        return;
    end if;
    update watchpump.resyncs set heartbeat_at = now() where watch_id = p_watch_id;
    -- 1. The objects, each (watch, object)'s stream lock taken (waiting for
    --    a claim deciding about it: claim() never waits, so this cannot
    --    deadlock with one).
    v_objects := array(
        select c.object
        from watchpump.covered_objects(v_watch.object, p_after, p_limit) c
        where pg_advisory_xact_lock(watchpump.lock_class(), watchpump.stream_key(p_watch_id, c.object)) is not null
    );
    objects := cardinality(v_objects);
    last_object := v_objects[objects];
    -- 2. A fresh snapshot, taken under the locks: each object's newest
    --    matching change, queued unless the same or newer news waits.
    insert into watchpump.queue (change_id, watch_id, service_id, object, sequence, deadline, created_at, replay)
    select ch.id, v_watch.id, v_watch.service_id, o.object, ch.sequence,
           now() + watchpump.delivery_window(),
           -- The change's time, as emit() does: retention keeps a queued
           -- delivery's change by its created_at (retire_partitions()).
           ch.occurred_at, true
    from unnest(v_objects) as o (object)
    cross join lateral (
        select c.id, c.sequence, c.occurred_at
        from (select c.id, c.sequence, c.occurred_at, c.kind, c.payload
              from watchpump.changes c
              where c.object = o.object
              order by c.sequence desc
              limit 1000) c
        where (v_watch.kinds is null or c.kind = any (v_watch.kinds))
          and (v_watch.match_path is null
               or watchpump.payload_matches(c.payload, v_watch.match_path, v_watch.match_is_predicate))
        order by c.sequence desc
        limit 1
    ) ch
    where not exists (
        select 1 from watchpump.queue q
        where q.watch_id = v_watch.id and q.object = o.object and q.sequence >= ch.sequence
    );
    get diagnostics queued = row_count;
    if queued > 0 then
        perform pg_notify('watchpump', '');
    end if;
end
$$;

-- Gives the watch's resync slot back (a finished or abandoned resync).
create or replace function watchpump.resync_finish(p_watch_id bigint) returns void
language sql as $$
    delete from watchpump.resyncs where watch_id = p_watch_id
$$;

-- The replay budget of the service's own resyncs: settings.replays_per_day
-- (null: 20,000) replays a day, a bucket that holds a day's worth and
-- refills over the day. Takes up to p_want replays: granted, what is left
-- after, the day's figure, and (when nothing could be granted) the
-- seconds until a batch of 200 (or the day's figure, if smaller) is there.
create or replace function watchpump.take_replays(p_service_id bigint, p_want integer,
                                                  out granted integer, out left_after integer,
                                                  out per_day integer, out wait_secs double precision)
language plpgsql as $$
declare
    v_now    timestamptz := clock_timestamp();
    v_rate   double precision;
    v_tokens double precision;
begin
    select coalesce(s.replays_per_day, 20000) into per_day from watchpump.settings s;
    v_rate := per_day / 86400.0;
    insert into watchpump.replay_buckets (service_id, tokens, refilled_at)
    values (p_service_id, per_day, v_now)
    on conflict do nothing;
    select least(per_day, b.tokens + v_rate * greatest(0, extract(epoch from v_now - b.refilled_at)))
    into v_tokens
    from watchpump.replay_buckets b where b.service_id = p_service_id
    for update;
    granted := least(greatest(p_want, 0), floor(v_tokens))::integer;
    update watchpump.replay_buckets b
    set tokens = v_tokens - granted, refilled_at = greatest(b.refilled_at, v_now)
    where b.service_id = p_service_id;
    left_after := floor(v_tokens - granted)::integer;
    wait_secs := case when granted > 0 then 0
                      else (least(200, per_day) - v_tokens) / v_rate end;
end
$$;

-- Gives replays a resync did not queue back to the service's budget.
create or replace function watchpump.give_back_replays(p_service_id bigint, p_unused integer) returns void
language sql as $$
    update watchpump.replay_buckets b
    set tokens = least(coalesce((select s.replays_per_day from watchpump.settings s), 20000),
                       b.tokens + greatest(p_unused, 0))
    where b.service_id = p_service_id
$$;

-- A consumer's resync (the API's): resync_start() within the service's
-- replay budget. The budget's replays are taken for every object the
-- resync will go through (at most what the budget holds: truncated when
-- the watch covers more), and the caller gives back what it did not queue
-- (give_back_replays()). An empty budget is 54000 (a 429) with the wait in
-- its detail, and takes no resync slot.
create or replace function watchpump.consumer_resync_start(p_service_id bigint, p_watch_id bigint, p_max integer,
                                                           out objects integer, out truncated boolean,
                                                           out history_from timestamptz,
                                                           out replays_left integer, out replays_per_day integer)
language plpgsql as $$
declare
    v_budget record;
    v_start  record;
begin
    -- What the budget holds, taken whole and the rest given back below,
    -- so that two resyncs cannot spend it twice (the second waits for the
    -- bucket's row lock, then finds the slot taken).
    select * into v_budget from watchpump.take_replays(p_service_id, greatest(p_max, 0));
    if v_budget.granted = 0 then
        raise exception 'watchpump.consumer_resync_start: this service''s resyncs have used up its replays for now: % a day',
            v_budget.per_day
            using errcode = '54000', detail = 'retry_after=' || ceil(v_budget.wait_secs);
    end if;
    select * into v_start from watchpump.resync_start(p_service_id, p_watch_id, v_budget.granted);
    objects := v_start.objects;
    truncated := v_start.truncated;
    history_from := v_start.history_from;
    perform watchpump.give_back_replays(p_service_id, v_budget.granted - objects);
    replays_left := v_budget.left_after + v_budget.granted - objects;
    replays_per_day := v_budget.per_day;
end
$$;
