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
--     condition, 0500_delivery.sql);
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

-- held_until(), the time a held delivery is "due": the vocabulary
-- (0000_vocabulary.sql), as the rate's take (0250_rate.sql) reads it too.

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
    where pg_try_advisory_xact_lock_shared(watchpump.lock_class(), watchpump.pause_key(x.id));
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
          and not watchpump.in_flight(q.lease_until)
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
        continue when not pg_try_advisory_xact_lock_shared(watchpump.lock_class(), watchpump.pause_key(v_service));
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
    perform pg_advisory_xact_lock(watchpump.lock_class(), watchpump.pause_key(p_service_id));
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
    perform pg_advisory_xact_lock(watchpump.lock_class(), watchpump.pause_key(p_service_id));
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
        continue when not pg_try_advisory_xact_lock(watchpump.lock_class(), watchpump.pause_key(v_watch.service_id));
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
