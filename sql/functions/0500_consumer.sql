-- The consumer's own calls (issue 20; src/api/deliveries.rs,
-- docs/protocol.md "The consumer's own view"). Each takes the calling
-- service's id and treats another service's delivery or watch as missing
-- (P0002, a 404 at the API): a service sees only its own.

-- Queue a settled delivery again under the same id (the consumer
-- de-duplicates by it), as retry() does for the operator, but for any
-- delivery the service has that was delivered, failed or dropped: GitHub's
-- "Redeliver". The order rule (0200_pump.sql) holds: a superseded delivery,
-- or one whose (watch, object) has newer news sent or on its way
-- (newer_news()), is refused (55000, a 409), as is one still queued.
-- Bounded (README, "Bounds"): one redelivery of a delivery per
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
        select case when q.lease_until > now() then 'in flight' else 'queued' end into v_state
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
    -- As retry() (0300_operator.sql): the ended event, and the attempt that
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

-- SELF-SERVICE WRITES (issue 34). Every write a consumer makes through
-- the API (creating a watch, a ping, a redelivery, a resync, a pause, a
-- resume) first takes a token from its service's bucket in write_buckets:
-- it fills at settings.self_service_rate tokens a second (null: 1) up to
-- settings.self_service_burst (null: 60). A call without a token is
-- refused at once with a 429 whose Retry-After is the wait for one
-- (src/api/limits.rs); it takes nothing. One bucket per service, so one
-- service's loop never slows another's; the row lock serialises only that
-- service's own writes.

-- The bucket's rate and burst.
create or replace function watchpump.write_rate(out rate double precision, out burst integer)
language sql stable as $$
    select coalesce(s.self_service_rate, 1), coalesce(s.self_service_burst, 60)
    from watchpump.settings s
$$;

-- Takes p_cost tokens from the service's bucket: wait_secs is 0 when they
-- were taken, else the seconds until they will be there (nothing taken);
-- with the rate and burst, for the refusal's message.
create or replace function watchpump.take_write_tokens(p_service_id bigint, p_cost integer,
                                                       out wait_secs double precision,
                                                       out rate double precision, out burst integer)
language plpgsql as $$
declare
    v_now    timestamptz := clock_timestamp();
    v_tokens double precision;
begin
    select r.rate, r.burst into rate, burst from watchpump.write_rate() r;
    insert into watchpump.write_buckets (service_id, tokens, refilled_at)
    values (p_service_id, burst, v_now)
    on conflict do nothing;
    select least(burst, b.tokens + rate * greatest(0, extract(epoch from v_now - b.refilled_at)))
    into v_tokens
    from watchpump.write_buckets b where b.service_id = p_service_id
    for update;
    if v_tokens >= p_cost then
        update watchpump.write_buckets b
        set tokens = v_tokens - p_cost, refilled_at = greatest(b.refilled_at, v_now)
        where b.service_id = p_service_id;
        wait_secs := 0;
    else
        wait_secs := (p_cost - v_tokens) / rate;
    end if;
end
$$;

-- A ping to one of the service's live watches: a change of kind
-- 'watchpump.ping' on the object 'watchpump.ping/<watch id>' (never a
-- producer's object, so it supersedes nothing but an older ping of the same
-- watch), and one delivery of it to that watch alone, queued like any
-- other: signed, retried, listed. Never through emit(): no other watch
-- receives it and strict mode does not apply. Bounded (README, "Bounds"):
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

-- PAUSE. A paused watch (watches.paused_at), or every watch of a paused
-- service (services.paused_at), sends nothing and fails nothing:
--   - its queued deliveries are held: next_attempt_at and deadline set to
--     held_until(), so that claim() does not find them due and neither
--     sweep() nor complete() finds a deadline passed;
--   - news keeps arriving (emit() is untouched) and keeps superseding: the
--     older queued deliveries of each held (watch, object) are superseded
--     by hold_paused(), so what waits stays one delivery per (watch,
--     object);
--   - what emit() queued since hold_paused() last ran is due at once, so
--     claim() also skips paused watches and services (its one pause
--     condition, 0200_pump.sql);
--   - resume gives every held delivery a fresh delivery window, due now, as
--     it releases it: the window restarts at its release. The pump then
--     sends the newest news of each (watch, object) in the order rule's
--     order.
-- A delivery already in flight when the pause begins finishes its attempt
-- (a failed one is then held like the rest).
--
-- What a pause or a resume costs is bounded (issue 34: 17 pauses and
-- resumes of a watch with 10,000 queued deliveries rewrote every row each
-- time, 254 MB of WAL in 20 s):
--   - a pause holds at most PAUSE_BATCH = 1,000 deliveries itself, and a
--     resume releases at most 1,000 (release_held()); the operator's task
--     holds the rest (hold_paused(), 10,000 a round) and releases the rest
--     (release_resumed(), 1,000 a watch and 10,000 a round), so a pause or
--     resume writes a bounded number of rows however much the watch holds;
--   - through the API, each takes a token of the service's bucket
--     (take_write_tokens()), and a watch resumed less than a minute ago is
--     not paused again (54000, a 429): what one watch's pauses rewrite is
--     at most twice what it holds, once a minute;
--   - a consumer's pause of a watch lasts at most settings.max_pause (7
--     days by default): then expire_pauses() resumes the watch and what it
--     held is sent (and fails at the end of its new window if the consumer
--     still does not take it), so that no pause keeps deliveries and the
--     changes they need forever. An operator's pause of a whole service
--     has no maximum: it is the operator's decision.

-- The time a held delivery is "due": far enough to never come, and a real
-- timestamp (not 'infinity', which clients' date types cannot hold).
create or replace function watchpump.held_until() returns timestamptz
language sql immutable as $$
    select timestamptz '9999-12-31 00:00:00+00'
$$;

-- Whether deliveries of the watch are held by a pause (of the watch, or of
-- its service).
create or replace function watchpump.is_paused(p_watch_id bigint) returns boolean
language sql stable as $$
    select exists (
        select 1 from watchpump.watches w
        join watchpump.services s on s.id = w.service_id
        where w.id = p_watch_id and (w.paused_at is not null or s.paused_at is not null)
    )
$$;

-- The advisory lock of a service's pauses, in the class of claim()'s
-- locks: pausing or resuming (set_watch_paused(), set_service_paused())
-- takes it exclusively, holding the paused watches' deliveries
-- (hold_paused()) shared, until the transaction ends. Without it, a
-- hold_paused() that read a watch as paused just before its resume
-- committed held what that resume had not seen, and nothing released it.
-- One lock per service: a consumer pausing and resuming in a loop delays
-- only its own pauses, never another service's.
create or replace function watchpump.pause_key(p_service_id bigint) returns integer
language sql immutable as $$
    select hashtext('watchpump.pause/' || p_service_id)
$$;

-- The paused watches of the services `p_service_ids`: paused themselves, or
-- with their whole service.
create or replace function watchpump.paused_watches(p_service_ids bigint[]) returns setof bigint
language sql stable as $$
    select w.id from watchpump.watches w
    where w.paused_at is not null and w.service_id = any (p_service_ids)
    union
    select w.id from watchpump.services s
    join watchpump.watches w on w.service_id = s.id
    where s.paused_at is not null and s.id = any (p_service_ids)
$$;

-- Holds the queued deliveries of paused watches and services, and lets
-- news supersede among them: the operator's periodic task
-- (src/operator/worker.rs) calls it. It takes the pause locks of at most
-- HOLD_SERVICES = 32 services with a paused watch, chosen at random, and
-- only those free: a service being paused or resumed right now is left to
-- a later round (its pause holds its own deliveries at once:
-- hold_paused_of()), so that no consumer can keep the task waiting, and
-- however many services are paused, a round holds at most 32 locks.
-- Bounded: at most p_max deliveries superseded and p_max held per call
-- (the rest at the next). Returns (superseded, held).
create or replace function watchpump.hold_paused(p_max integer)
returns table (superseded integer, held integer)
language plpgsql
set jit = off
as $$
declare
    v_services bigint[];
begin
    -- Which watches are paused is read by hold_paused_of() after taking
    -- these locks: a resume under way has committed by then, and none
    -- commits until this has.
    select coalesce(array_agg(x.id), '{}') into v_services
    from (select p.id
          from (select w.service_id as id from watchpump.watches w where w.paused_at is not null
                union
                select s.id from watchpump.services s where s.paused_at is not null) p
          order by random()
          limit 32) x
    where pg_try_advisory_xact_lock_shared(2003856752, watchpump.pause_key(x.id));
    return query select * from watchpump.hold_paused_of(v_services, p_max);
end
$$;

-- hold_paused() for the services `p_service_ids`, whose pause locks the
-- caller holds. Skips, never waits for, what another transaction holds.
create or replace function watchpump.hold_paused_of(p_service_ids bigint[], p_max integer)
returns table (superseded integer, held integer)
language plpgsql
set jit = off
as $$
declare
    v_watch_ids  bigint[];
    v_objects    text[];
    v_superseded integer := 0;
    v_held       integer := 0;
begin
    -- The (watch, object)s of paused watches with more than one delivery
    -- queued, under the order rule's lock (claim() takes the same).
    with crowded as (
        select q.watch_id, q.object
        from watchpump.paused_watches(p_service_ids) as p (id)
        join watchpump.queue q on q.watch_id = p.id
        group by q.watch_id, q.object
        having count(*) > 1
        limit greatest(p_max, 0)
    )
    select coalesce(array_agg(c.watch_id), '{}'), coalesce(array_agg(c.object), '{}')
    into v_watch_ids, v_objects
    from crowded c
    where watchpump.stream_lock(c.watch_id, c.object);
    if cardinality(v_watch_ids) > 0 then
        select count(*)::integer into v_superseded
        from watchpump.supersede_older(v_watch_ids, v_objects, p_max);
    end if;

    with due as (
        select q.id
        from watchpump.paused_watches(p_service_ids) as p (id)
        join watchpump.queue q on q.watch_id = p.id
        where q.next_attempt_at <> watchpump.held_until()
          and not coalesce(q.lease_until > now(), false)
        limit greatest(p_max, 0)
        for update of q skip locked
    )
    update watchpump.queue q
    set next_attempt_at = watchpump.held_until(), deadline = watchpump.held_until()
    from due d
    where q.id = d.id;
    get diagnostics v_held = row_count;
    return query select v_superseded, v_held;
end
$$;

-- Releases at most p_max held deliveries of each of the given watches that
-- no pause holds any more, oldest first: due now, with a fresh delivery
-- window. Walks the partial index queue_held (0022_consumer_shares.sql),
-- one watch at a time, so it reads what it releases. Rows another
-- transaction holds are skipped (a later batch takes them). Wakes the
-- pumps. Returns how many it released.
create or replace function watchpump.release_held(p_watch_ids bigint[], p_max integer) returns integer
language plpgsql as $$
declare
    v_watch bigint;
    v_n     integer;
    v_count integer := 0;
begin
    foreach v_watch in array coalesce(p_watch_ids, '{}') loop
        continue when watchpump.is_paused(v_watch);
        update watchpump.queue q
        set next_attempt_at = now(), deadline = now() + watchpump.delivery_window()
        where q.id = any (array(
                  select h.id from watchpump.queue h
                  where h.watch_id = v_watch and h.next_attempt_at = watchpump.held_until()
                  order by h.id
                  limit greatest(p_max, 0)
                  for update skip locked));
        get diagnostics v_n = row_count;
        v_count := v_count + v_n;
    end loop;
    if v_count > 0 then
        perform pg_notify('watchpump', '');
    end if;
    return v_count;
end
$$;

-- Whether a watch still has held deliveries (the index queue_held).
create or replace function watchpump.holds_any(p_watch_id bigint) returns boolean
language sql stable as $$
    select exists (select 1 from watchpump.queue h
                   where h.watch_id = p_watch_id and h.next_attempt_at = watchpump.held_until())
$$;

-- Resumed watches release what they hold a batch at a time: the resume
-- itself one batch (set_watch_paused(), set_service_paused()), this the
-- rest, from the operator's periodic task. The watches of watchpump.
-- releasing of up to 32 services a round, chosen at random, each service
-- only while its pause lock is free (a pause or resume under way is left
-- to a later round, as in hold_paused(); a round holds at most 32 locks),
-- and up to 1,000 watches a service; at most p_per_watch deliveries a
-- watch and p_max in all. A watch with nothing held left, or paused again,
-- leaves the list. Returns how many deliveries it released.
create or replace function watchpump.release_resumed(p_per_watch integer, p_max integer)
returns integer
language plpgsql
set jit = off
as $$
declare
    v_service bigint;
    v_watch   bigint;
    v_count   integer := 0;
begin
    <<services>>
    for v_service in
        select x.service_id from (select distinct r.service_id from watchpump.releasing r) x
        order by random() limit 32
    loop
        continue when not pg_try_advisory_xact_lock_shared(2003856752, watchpump.pause_key(v_service));
        for v_watch in
            select r.watch_id from watchpump.releasing r where r.service_id = v_service
            order by r.watch_id limit 1000
        loop
            exit services when v_count >= p_max;
            if not watchpump.is_paused(v_watch) then
                v_count := v_count + watchpump.release_held(array[v_watch], least(p_per_watch, p_max - v_count));
            end if;
            if watchpump.is_paused(v_watch) or not watchpump.holds_any(v_watch) then
                delete from watchpump.releasing where watch_id = v_watch;
            end if;
        end loop;
    end loop;
    return v_count;
end
$$;

-- Releases one batch of the watch's held deliveries now and, when more are
-- held, puts it on the list the operator's task releases from.
create or replace function watchpump.start_release(p_watch_id bigint, p_service_id bigint) returns void
language plpgsql as $$
begin
    perform watchpump.release_held(array[p_watch_id], 1000);
    if watchpump.holds_any(p_watch_id) then
        insert into watchpump.releasing (watch_id, service_id) values (p_watch_id, p_service_id)
        on conflict do nothing;
    end if;
end
$$;

-- Pauses (p_paused) or resumes one of the service's live watches. Returns
-- whether it changed anything: a repeated pause or resume is a no-op.
-- Another service's watch, or a removed one, is P0002. With
-- p_repause_after (the API's: a minute), a pause of a watch resumed less
-- than that ago is refused (54000, with the seconds to wait in its
-- detail); the operator's CLI passes none.
create or replace function watchpump.set_watch_paused(p_service_id bigint, p_watch_id bigint, p_paused boolean,
                                                      p_repause_after interval default null)
returns boolean
language plpgsql as $$
declare
    v_paused_at  timestamptz;
    v_resumed_at timestamptz;
begin
    perform pg_advisory_xact_lock(2003856752, watchpump.pause_key(p_service_id));
    select w.paused_at, w.resumed_at into v_paused_at, v_resumed_at
    from watchpump.watches w
    where w.id = p_watch_id and w.service_id = p_service_id and w.removed_at is null
    for update;
    if not found then
        raise exception 'watchpump.set_watch_paused: there is no live watch % for this service', p_watch_id
            using errcode = 'P0002';
    end if;
    if (v_paused_at is not null) = p_paused then
        return false;
    end if;
    if p_paused and v_resumed_at > now() - p_repause_after then
        raise exception 'watchpump.set_watch_paused: watch % was resumed less than % s ago: a watch is paused again % s after its resume at the soonest',
            p_watch_id, extract(epoch from p_repause_after)::bigint, extract(epoch from p_repause_after)::bigint
            using errcode = '54000',
                  detail = 'retry_after=' || ceil(extract(epoch from v_resumed_at + p_repause_after - now()));
    end if;
    update watchpump.watches
    set paused_at = case when p_paused then now() end,
        resumed_at = case when p_paused then resumed_at else now() end
    where id = p_watch_id;
    if p_paused then
        delete from watchpump.releasing where watch_id = p_watch_id;
        perform watchpump.hold_paused_of(array[p_service_id], 1000);
    else
        perform watchpump.start_release(p_watch_id, p_service_id);
    end if;
    return true;
end
$$;

-- Pauses or resumes every watch of a live service (its own pauses of
-- single watches stay). Returns whether it changed anything. An unknown
-- service is P0002. The operator's (`watchpump services pause`): no
-- token, no minimum between pauses, no maximum pause; bounded all the
-- same, a batch at once and the rest by the operator's task.
create or replace function watchpump.set_service_paused(p_service_id bigint, p_paused boolean)
returns boolean
language plpgsql as $$
declare
    v_paused_at timestamptz;
    v_watch     bigint;
    v_left      integer := 1000;
begin
    perform pg_advisory_xact_lock(2003856752, watchpump.pause_key(p_service_id));
    select s.paused_at into v_paused_at
    from watchpump.services s
    where s.id = p_service_id and s.removed_at is null
    for update;
    if not found then
        raise exception 'watchpump.set_service_paused: there is no service %', p_service_id
            using errcode = 'P0002';
    end if;
    if (v_paused_at is not null) = p_paused then
        return false;
    end if;
    update watchpump.services set paused_at = case when p_paused then now() end where id = p_service_id;
    if p_paused then
        delete from watchpump.releasing where service_id = p_service_id;
        perform watchpump.hold_paused_of(array[p_service_id], 1000);
    else
        -- Every live watch not paused on its own that holds something goes
        -- on the list (at most MAX_WATCHES_PER_SERVICE rows), and one
        -- batch of them is released now.
        insert into watchpump.releasing (watch_id, service_id)
        select w.id, w.service_id from watchpump.watches w
        where w.service_id = p_service_id and w.removed_at is null and w.paused_at is null
          and watchpump.holds_any(w.id)
        on conflict do nothing;
        for v_watch in
            select r.watch_id from watchpump.releasing r where r.service_id = p_service_id order by r.watch_id
        loop
            exit when v_left <= 0;
            v_left := v_left - watchpump.release_held(array[v_watch], v_left);
        end loop;
        perform pg_notify('watchpump', '');
    end if;
    return true;
end
$$;

-- Ends the consumers' pauses of watches older than settings.max_pause (7
-- days by default): each is resumed, as by the consumer (its held news is
-- released and sent), at most p_max a call, those of a service whose
-- pause is under way left to the next call. Returns the watches resumed,
-- with their service, for the log and the metric
-- watchpump_pauses_expired_total.
create or replace function watchpump.expire_pauses(p_max integer)
returns table (service text, watch_id bigint)
language plpgsql as $$
declare
    v_max   interval;
    v_watch record;
begin
    select coalesce(s.max_pause, interval '7 days') into v_max from watchpump.settings s;
    for v_watch in
        select w.id, w.service_id, v.name
        from watchpump.watches w
        join watchpump.services v on v.id = w.service_id
        where w.paused_at is not null and w.paused_at < now() - v_max and w.removed_at is null
        order by w.paused_at
        limit greatest(p_max, 0)
    loop
        continue when not pg_try_advisory_xact_lock(2003856752, watchpump.pause_key(v_watch.service_id));
        update watchpump.watches w set paused_at = null, resumed_at = now()
        where w.id = v_watch.id and w.paused_at < now() - v_max;
        continue when not found;
        perform watchpump.start_release(v_watch.id, v_watch.service_id);
        service := v_watch.name;
        watch_id := v_watch.id;
        return next;
    end loop;
end
$$;

-- RATE. A service's rate (services.max_rate, consumer_rate: the lower
-- holds) is a token bucket in rate_buckets, shared by every pump: it fills
-- at `rate` tokens a second up to a burst of rate / 20 (at least 1), and
-- each delivery claimed takes a token. The burst is small on purpose: in
-- any second a consumer gets at most rate + burst deliveries (50/s: at
-- most 52, tests/consumer_rate.rs). The pump takes tokens in one call
-- before its claim (src/pump/rate.rs) and claims at most the granted count
-- per service (claim()'s per-service free slots: claim() is unchanged),
-- then gives back what it did not use. A delivery without a token waits in
-- the queue: the rate holds deliveries, never drops them.

-- The rate that holds for a service: the lower of the two, null for none.
create or replace function watchpump.effective_rate(p_max_rate integer, p_consumer_rate integer)
returns integer
language sql immutable as $$
    select least(coalesce(p_max_rate, p_consumer_rate), coalesce(p_consumer_rate, p_max_rate))
$$;

create or replace function watchpump.rate_burst(p_rate integer) returns double precision
language sql immutable as $$
    select greatest(1, p_rate / 20.0)::double precision
$$;

-- Takes tokens for a claim: for each rate-limited live service, at most
-- the pump's free slots for it (p_wanted, or p_default for a service it
-- has not listed). Returns only rate-limited services, each with what it
-- may claim now; services without a rate are not listed (their slots
-- stand). One row lock per limited service, held for this statement only.
create or replace function watchpump.take_tokens(p_service_ids bigint[], p_wanted integer[], p_default integer)
returns table (service_id bigint, granted integer)
language plpgsql
set jit = off
as $$
declare
    v_now timestamptz := clock_timestamp();
begin
    insert into watchpump.rate_buckets as b (service_id, tokens, refilled_at)
    select s.id, watchpump.rate_burst(watchpump.effective_rate(s.max_rate, s.consumer_rate)), v_now
    from watchpump.services s
    where s.removed_at is null and (s.max_rate is not null or s.consumer_rate is not null)
    on conflict do nothing;

    -- Each SET expression reads the same (newest, once locked) row: a
    -- concurrent pump's take is seen, and time since refilled_at is
    -- counted once (refilled_at never goes back).
    return query
    with limited as (
        select s.id, watchpump.effective_rate(s.max_rate, s.consumer_rate) as rate,
               greatest(coalesce(u.wanted, p_default), 0) as wanted
        from watchpump.services s
        left join unnest(p_service_ids, p_wanted) as u (id, wanted) on u.id = s.id
        where s.removed_at is null and (s.max_rate is not null or s.consumer_rate is not null)
    )
    update watchpump.rate_buckets b
    set granted = least(l.wanted, floor(least(watchpump.rate_burst(l.rate),
                          b.tokens + l.rate * greatest(0, extract(epoch from v_now - b.refilled_at)))))::integer,
        tokens = least(watchpump.rate_burst(l.rate),
                       b.tokens + l.rate * greatest(0, extract(epoch from v_now - b.refilled_at)))
                 - least(l.wanted, floor(least(watchpump.rate_burst(l.rate),
                          b.tokens + l.rate * greatest(0, extract(epoch from v_now - b.refilled_at))))),
        refilled_at = greatest(b.refilled_at, v_now)
    from limited l
    where b.service_id = l.id
    returning b.service_id, b.granted;
end
$$;

-- Gives back tokens a claim took but did not use (its services had fewer
-- deliveries due), up to the burst.
create or replace function watchpump.give_back_tokens(p_service_ids bigint[], p_unused integer[])
returns void
language sql as $$
    update watchpump.rate_buckets b
    set tokens = least(watchpump.rate_burst(watchpump.effective_rate(s.max_rate, s.consumer_rate)),
                       b.tokens + u.unused)
    from unnest(p_service_ids, p_unused) as u (id, unused)
    join watchpump.services s on s.id = u.id
    where b.service_id = u.id and u.unused > 0
      and (s.max_rate is not null or s.consumer_rate is not null)
$$;

-- The operator sets a service's maximum rate (null: none). The consumer's
-- own rate, if higher, is lowered to it. An unknown service is P0002, a
-- rate below 1 is 22023.
create or replace function watchpump.set_max_rate(p_service text, p_rate integer)
returns void
language plpgsql as $$
begin
    if p_rate is not null and p_rate < 1 then
        raise exception 'watchpump.set_max_rate: a rate is a whole number of deliveries a second, at least 1, not %', p_rate
            using errcode = '22023';
    end if;
    update watchpump.services
    set max_rate = p_rate, consumer_rate = least(consumer_rate, p_rate)
    where name = p_service and removed_at is null;
    if not found then
        raise exception 'watchpump.set_max_rate: there is no service %', p_service using errcode = 'P0002';
    end if;
end
$$;

-- The consumer sets its own rate (null: none but the operator's); it may
-- only lower what the operator allows (22023 otherwise).
create or replace function watchpump.set_consumer_rate(p_service_id bigint, p_rate integer)
returns table (rate integer, max_rate integer, consumer_rate integer)
language plpgsql as $$
declare
    v_max integer;
begin
    if p_rate is not null and p_rate < 1 then
        raise exception 'watchpump.set_consumer_rate: a rate is a whole number of deliveries a second, at least 1, not %', p_rate
            using errcode = '22023';
    end if;
    select s.max_rate into v_max from watchpump.services s where s.id = p_service_id for update;
    if p_rate > v_max then
        raise exception 'watchpump.set_consumer_rate: the producer allows this service at most % deliveries a second; a consumer may only lower it', v_max
            using errcode = '22023';
    end if;
    update watchpump.services s set consumer_rate = p_rate where s.id = p_service_id;
    return query
    select watchpump.effective_rate(s.max_rate, s.consumer_rate), s.max_rate, s.consumer_rate
    from watchpump.services s where s.id = p_service_id;
end
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
--     every (watch, object) it covers (claim() takes the same, 0200), and
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
    perform pg_advisory_xact_lock(2003856752, hashtext('watchpump.resync/' || p_service_id));
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
        where pg_advisory_xact_lock(2003856752, hashtext(p_watch_id::text || '/' || c.object)) is not null
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
