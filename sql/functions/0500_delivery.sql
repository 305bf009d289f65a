-- The pump's side: claim due deliveries, record what became of them, check
-- deadlines. Each is one round trip per batch. Storage (0004_storage_v2.sql):
-- watchpump.queue holds what is not settled (pending, or in flight while a
-- lease runs); settle() (0300_settle.sql) moves a delivery to
-- watchpump.settled, the history.
--
-- THE ORDER RULE. For each (watch, object):
--   1. at most one delivery is in flight;
--   2. a delivery is sent only while no newer delivery of the same (watch,
--      object) has been sent: the newest queued delivery carries the
--      object's news, and every older one is superseded by it. Newer is
--      is_newer() (0000_vocabulary.sql): a higher sequence of the change,
--      then, for two deliveries of one change, a higher delivery id;
--   3. one claim takes at most one delivery of a (watch, object).
-- It is decided in claim(), where it cannot be raced: claim takes a
-- transaction-level advisory lock per (watch, object) (stream_lock(),
-- 0000_vocabulary.sql) before
-- it decides, and decides with a snapshot taken after the lock, which sees
-- whatever the lock's previous holder committed. It claims the newest
-- queued delivery only together with superseding every older one, and skips
-- the (watch, object) for now if one of those is locked by someone else.
-- Supersession itself is supersede_older() (0300_settle.sql), called by claim() and by
-- complete() (a failed attempt with newer news waiting). emit() never
-- touches an existing delivery, so a producer's transaction never holds a
-- lock a pump needs, nor waits on one; retry() and retry_failed()
-- (0600_operator.sql) refuse to requeue older news once newer news of the
-- object was sent or is on its way.
--
-- FENCING: why rule 1 holds at the consumer, not only in this table.
-- A lease is the only thing that keeps another pump off a (watch, object)
-- while a request is out, so a pump must never be on the wire once its
-- lease may have run out, even when it cannot reach this database:
--   a. claim() sets lease_until = now() + lease with now() the start of
--      its transaction, after the pump asked; so by the pump's own
--      monotonic clock the lease ends no sooner than (asked + lease). The
--      claim commits durably (synchronous_commit = on, also to a
--      synchronous standby) before the pump sees it, so a crash or a
--      failover cannot forget a lease a request was started under;
--      outcomes may be lost (the lease then runs out: a duplicate, never
--      an overlap);
--   b. the pump starts a request only while asked + lease >= now +
--      request timeout + hold (src/pump/fence.rs), and abandons it unsent
--      otherwise; its HTTP client ends every request within the request
--      timeout. So its requests end a hold before its leases do, recorded
--      or not (a pump cut off from here stops claiming and its requests
--      still end in time);
--   c. after an attempt with no answer, complete() keeps lease_until a
--      hold ahead (no leaseholder), counted from when the request timeout
--      would have ended the request (a broken connection ends it sooner):
--      neither the retry nor newer news of the (watch, object) goes before
--      a consumer still busy with the abandoned request has had its
--      request timeout and that hold to finish.
-- The promise that follows is in docs/protocol.md ("One at a time").
--
-- Why each function here sets `jit = off` and `force_generic_plan`: the
-- note on plans at the top of 0150_emit.sql.

-- Claim due deliveries for this pump, lease them, and return what the pump
-- needs to send them. Per service at most its slot's `free` of them
-- (p_default_free for services not listed); a probing service (its slot's
-- `probe`) gets its soonest pending delivery even if that one's own retry
-- is not due yet: the probe stands in for the whole service's backlog.
-- A pump asks for more than it has requests free: what it claims ahead
-- waits in the pump, under the same lease, for a request to free up
-- (src/pump/queue.rs); release() gives back what it did not send.
--
-- Bounded whatever the backlog (docs/security.md, "Bounds"): at most p_max_rows
-- deliveries, taken round-robin across the services (each service's
-- soonest due first), and at most p_max_bytes of payload, each change's
-- payload counted once however many of its deliveries are claimed (the
-- first change always goes, however large: a claim always makes progress).
-- Each change's payload is returned once, on the first of its rows (its
-- other rows carry null and the pump shares the text between them).
--
-- And its cost does not grow with the backlog (issue 33): every statement
-- is a bounded index walk whose rows read are proportional to the rows it
-- returns. Step 1 walks each service's due deliveries in due order and
-- stops at its free slots; the rows it steps over are those in flight
-- (bounded by the pumps' slots) and those of a paused watch not yet held
-- (hold_paused(), 0550_pause.sql), and the walk stops at WALK_SLACK =
-- 1,024 rows beyond the free slots whatever it steps over. Steps 2 and 3
-- read two rows of each (watch, object), and supersession is bounded by
-- p_max_rows (supersede_older()). tests/claim_depth.rs holds it to that
-- on a backlog of 200,000 (buffers a returned row against a backlog of
-- 200).
--
-- The lease fences a pump that died mid-send; a delivery whose lease ran
-- out is claimed again like any pending one (expired_lease_of names the
-- pump that lost it). The order rule (top of this file) is decided here:
-- a (watch, object)'s delivery is claimed only while it is the only one
-- queued (none in flight, none older left after supersession).
-- Each row is a watchpump.claimed_message (0008_storage_v3.sql): its
-- attributes but service_id, service_version and expired_lease_of are the
-- message a consumer receives (src/delivery/mod.rs); message() below lists
-- them for the panel: a field of the body is added to the type, here, and
-- there.
create or replace function watchpump.claim(
    p_pump         text,
    p_slots        watchpump.claim_slot[],
    p_default_free integer,
    p_lease        interval,
    p_max_rows     integer default 1000,
    p_max_bytes    bigint default 67108864
) returns setof watchpump.claimed_message
language plpgsql
set jit = off
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_mergejoin = off
as $$
declare
    v_watch_ids    bigint[];
    v_objects      text[];
    v_probes       boolean[];
    v_crowded_w    bigint[];
    v_crowded_o    text[];
    v_crowded_p    boolean[];
    v_ids          bigint[] := '{}';
    -- Beside v_ids, each delivery's change, created_at and payload bytes
    -- (null when its queue row has none), as step 2 read them: steps 4
    -- and 5 need them without reading the rows again.
    v_changes      bigint[] := '{}';
    v_created      timestamptz[] := '{}';
    v_bytes        integer[] := '{}';
    v_locked       bigint[];
    v_from         timestamptz;
    v_to           timestamptz;
    v_missing      boolean;
begin
    -- The rule needs a fresh snapshot per statement.
    if current_setting('transaction_isolation') <> 'read committed' then
        raise exception 'watchpump.claim must run at read committed, not %',
            current_setting('transaction_isolation') using errcode = '25000';
    end if;
    if coalesce(p_max_rows, 0) < 1 then
        return;
    end if;
    -- FENCING (issue 19): the leases this claim writes are what keeps other
    -- pumps off while the requests are on the wire, so they must survive a
    -- crash or a failover to a synchronous standby: this transaction
    -- commits durably whatever the pump's connection says (it runs with
    -- synchronous_commit = off for everything else, src/pump/mod.rs).
    perform set_config('synchronous_commit', 'on', true);

    -- 1. Due (or probed) deliveries per service, oldest due first, as many
    --    as its free slots, and p_max_rows in all, taking each service's
    --    first, then each one's second, and so on. This pump decides about
    --    each of their (watch, object)s now if it gets its lock.
    --    The walk is the index queue_due in order, stopped by the limit:
    --    the due bound is an index condition (a probe's is infinity), and
    --    the lease and the paused-watch checks are filters on each row
    --    read, the latter a scalar subquery (one probe of the tiny partial
    --    index watches_paused), which the planner cannot turn into a join
    --    that reads the whole due range first (a hash anti join and a sort
    --    did, on a backlog of 1,000,000 planned from its statistics).
    with per_service as materialized (
        select s.id as service_id, d.watch_id, d.object, coalesce(f.probe, false) as probe,
               d.next_attempt_at
        from watchpump.services s
        left join unnest(p_slots) as f on f.service_id = s.id
        cross join lateral (
            select w.watch_id, w.object, w.next_attempt_at
            from (
                select q.watch_id, q.object, q.next_attempt_at, q.lease_until
                from watchpump.queue q
                where q.service_id = s.id
                  and q.next_attempt_at <= case when coalesce(f.probe, false) then timestamptz 'infinity'
                                                else now() end
                order by q.next_attempt_at
                -- WALK_SLACK: the most rows stepped over (see above).
                limit least(greatest(coalesce(f.free, p_default_free), 0), p_max_rows) + 1024
            ) w
            where not watchpump.in_flight(w.lease_until)
              and (select count(*) from watchpump.watches pw
                   where pw.id = w.watch_id and pw.paused_at is not null) = 0
            limit least(greatest(coalesce(f.free, p_default_free), 0), p_max_rows)
        ) d
        where s.removed_at is null and s.paused_at is null
    ),
    scanned as materialized (
        -- Numbered outside the per-service scan: a window function inside
        -- it would read every due row of the service before the limit.
        select p.watch_id, p.object, p.probe
        from (select p.*, row_number() over (partition by p.service_id order by p.next_attempt_at) as turn
              from per_service p) p
        order by p.turn, p.next_attempt_at
        limit p_max_rows
    ),
    streams as (
        select k.watch_id, k.object, bool_or(k.probe) as probe from scanned k
        group by k.watch_id, k.object
    )
    select coalesce(array_agg(k.watch_id), '{}'), coalesce(array_agg(k.object), '{}'),
           coalesce(array_agg(k.probe), '{}')
    into v_watch_ids, v_objects, v_probes
    from streams k
    where watchpump.stream_lock(k.watch_id, k.object);

    -- 2. Under the locks, with this statement's fresh snapshot (which sees
    --    whatever the locks' previous holders committed): each (watch,
    --    object)'s oldest queued delivery, and whether another is queued
    --    behind it. Alone, not in flight and due (or probed), it is the
    --    object's newest news and nothing of its (watch, object) is on the
    --    wire: it is claimed. With another behind it, the (watch, object)
    --    is crowded: step 3 supersedes its older news and asks again.
    --    Two index entries read per (watch, object), however deep it is.
    for v_pass in 1..2 loop
        exit when cardinality(v_watch_ids) = 0;
        with firsts as materialized (
            select k.watch_id, k.object, k.probe, f.id, f.change_id, f.next_attempt_at, f.lease_until,
                   f.created_at, f.payload_bytes,
                   exists (select 1 from watchpump.queue b
                           where b.watch_id = k.watch_id and b.object = k.object
                             and watchpump.is_newer(b.sequence, b.id, f.sequence, f.id)) as crowded
            from unnest(v_watch_ids, v_objects, v_probes) as k (watch_id, object, probe)
            cross join lateral (
                select q.id, q.change_id, q.sequence, q.next_attempt_at, q.lease_until, q.created_at,
                       q.payload_bytes
                from watchpump.queue q
                where q.watch_id = k.watch_id and q.object = k.object
                order by q.sequence, q.id
                limit 1
            ) f
        )
        select v_ids || coalesce(array_agg(f.id) filter (where not f.crowded), '{}'),
               v_changes || coalesce(array_agg(f.change_id) filter (where not f.crowded), '{}'),
               v_created || coalesce(array_agg(f.created_at) filter (where not f.crowded), '{}'),
               v_bytes || coalesce(array_agg(f.payload_bytes) filter (where not f.crowded), '{}'),
               coalesce(array_agg(f.watch_id) filter (where f.crowded), '{}'),
               coalesce(array_agg(f.object) filter (where f.crowded), '{}'),
               coalesce(array_agg(f.probe) filter (where f.crowded), '{}')
        into v_ids, v_changes, v_created, v_bytes, v_crowded_w, v_crowded_o, v_crowded_p
        from firsts f
        where f.crowded
           or (not watchpump.in_flight(f.lease_until) and (f.probe or f.next_attempt_at <= now()));
        -- 3. Older news of the crowded (watch, object)s is superseded in
        --    this same transaction, p_max_rows at most; the second pass
        --    claims those left with their newest alone.
        exit when v_pass = 2 or cardinality(v_crowded_w) = 0;
        perform from watchpump.supersede_older(v_crowded_w, v_crowded_o, p_max_rows);
        v_watch_ids := v_crowded_w;
        v_objects := v_crowded_o;
        v_probes := v_crowded_p;
    end loop;
    if cardinality(v_ids) = 0 then
        return;
    end if;
    select min(t), max(t) into v_from, v_to from unnest(v_created) as t;

    -- 4. The payload bytes: whole changes, oldest first, while the bytes
    --    before each stay under p_max_bytes (so the first always goes).
    --    A delivery left out stays pending; its older news, if any, was
    --    superseded by it above, which the order rule allows.
    --
    --    Each change is looked up by id and time: a delivery's created_at
    --    is its change's occurred_at (emit(), ping(), a replay), so the
    --    look-up reads that day's partition only. The days the claimed
    --    deliveries span (v_from, v_to) are given to this statement and
    --    step 5's as values known when each starts: PostgreSQL then prunes
    --    the other days' partitions before it starts a scan of them.
    --    Pruned at run time alone (by each row's time), every day's index
    --    scan was started for each look-up: a claim and write-back of one
    --    row at 13 days of partitions took a median of 756 us, 683 us
    --    pruned so (BENCHMARKS.md, issue 18, fourth session). A null
    --    payload_bytes (never null in changes) is a change not found.
    --    A delivery emit() or emit_many() queued carries its payload's
    --    bytes (queue.payload_bytes, 0025_queue_payload_bytes.sql): its
    --    change is not looked up here, only in step 5 for its payload.
    --
    --    A delivery whose change is not at its created_at (a v2 row,
    --    queued before that rule) is found missing here: its created_at is
    --    set to its change's time (the day retention keeps the two in), by
    --    a look-up by id in every day that runs only then, and the step is
    --    done again. A change still not found leaves its delivery out, to
    --    its deadline, as before.
    v_locked := v_ids;
    for v_pass in 1..2 loop
        with per_change as (
            select q.change_id, min(q.created_at) as occurred_at, min(q.id) as first_id,
                   array_agg(q.id) as ids, min(q.bytes) as bytes
            from unnest(v_locked, v_changes, v_created, v_bytes) as q (id, change_id, created_at, bytes)
            group by q.change_id
        ),
        found as materialized (
            select p.ids, p.first_id, coalesce(p.bytes, ch.payload_bytes) as payload_bytes
            from per_change p
            left join lateral (
                select c.payload_bytes from watchpump.changes c
                where p.bytes is null
                  and c.id = p.change_id and c.occurred_at = p.occurred_at
                  and c.occurred_at >= v_from and c.occurred_at <= v_to
            ) ch on true
        ),
        weighed as (
            select f.ids,
                   coalesce(sum(f.payload_bytes) over (order by f.first_id
                            rows between unbounded preceding and 1 preceding), 0) as bytes_before
            from found f
            where f.payload_bytes is not null
        )
        select coalesce((select array_agg(i.id) from weighed w cross join unnest(w.ids) as i (id)
                         where w.bytes_before < greatest(p_max_bytes, 1)), '{}'),
               exists (select 1 from found f where f.payload_bytes is null)
        into v_ids, v_missing;
        exit when not v_missing or v_pass = 2;
        update watchpump.queue q set created_at = c.occurred_at
        from watchpump.changes c
        where q.id = any (v_locked) and c.id = q.change_id and c.occurred_at <> q.created_at;
        select coalesce(array_agg(q.id), '{}'), coalesce(array_agg(q.change_id), '{}'),
               coalesce(array_agg(q.created_at), '{}'), coalesce(array_agg(null::integer), '{}'),
               min(q.created_at), max(q.created_at)
        into v_locked, v_changes, v_created, v_bytes, v_from, v_to
        from watchpump.queue q where q.id = any (v_locked);
    end loop;
    if cardinality(v_ids) = 0 then
        return;
    end if;

    -- 5. The lease, on the rows no other transaction holds (skipped, never
    --    waited for) and still not leased, whose change is found: a HOT
    --    update (no indexed column changes). Each change is read here once,
    --    by id and time in the days step 4 found them in; a delivery whose
    --    change is not there is not leased and stays pending (never held
    --    under a lease with nothing sent).
    return query
    with free as materialized (
        select q.id, q.leased_by, ch.object, ch.kind, ch.sequence, ch.occurred_at, ch.payload,
               ch.traceparent, ch.tracestate
        from watchpump.queue q
        cross join lateral (
            select x.object, x.kind, x.sequence, x.occurred_at, x.payload, x.traceparent, x.tracestate
            from watchpump.changes x
            where x.id = q.change_id and x.occurred_at = q.created_at
              and x.occurred_at >= v_from and x.occurred_at <= v_to
        ) ch
        where q.id = any (v_ids) and not watchpump.in_flight(q.lease_until)
        for update of q skip locked
    ),
    claimed as (
        update watchpump.queue q
        set attempts = q.attempts + 1, lease_until = clock_timestamp() + p_lease, leased_by = p_pump
        from free f
        where q.id = f.id
        returning q.id, q.change_id, q.watch_id, q.service_id, q.attempts, q.replay,
                  f.leased_by as expired, f.object, f.kind, f.sequence, f.occurred_at, f.payload,
                  f.traceparent, f.tracestate
    ),
    ordered as materialized (
        select c.*, row_number() over (partition by c.change_id order by c.id) = 1 as first_of_change
        from claimed c
    )
    select c.id, c.change_id, c.watch_id, c.service_id, s.version, c.attempts,
           w.resource, c.object, c.kind, c.sequence, c.occurred_at,
           case when c.first_of_change then c.payload::text end, c.expired,
           c.traceparent, c.tracestate, c.replay
    from ordered c
    cross join lateral (
        select x.resource from watchpump.watches x where x.id = c.watch_id offset 0
    ) w
    cross join lateral (
        select x.version from watchpump.services x where x.id = c.service_id offset 0
    ) s
    order by c.change_id, c.id;

    delete from watchpump.sleepers where pump = p_pump;
end
$$;

-- Gives back claimed deliveries a pump did not send (issue 33): what it
-- claimed ahead and still held when it stopped, or when their service
-- went down. Each is pending again at once, for any pump, as if its lease
-- had run out: leased_by and lease_until cleared, and the attempt count
-- back to what it was, so that its next claim is the same attempt. Only
-- the deliveries this pump still holds for that attempt change (one whose
-- lease ran out and was taken by another pump is left alone). Returns how
-- many were given back. Without it, they wait for their lease.
create or replace function watchpump.release(p_pump text, p_claims watchpump.claim_ref[])
returns integer
language plpgsql
set jit = off
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
as $$
declare
    v_count integer;
begin
    update watchpump.queue q
    set lease_until = null, leased_by = null, attempts = q.attempts - 1
    from unnest(p_claims) as r
    where q.id = r.delivery_id and q.leased_by = p_pump and q.attempts = r.attempt;
    get diagnostics v_count = row_count;
    if v_count > 0 then
        perform pg_notify('watchpump', '');
    end if;
    return v_count;
end
$$;

-- A delivery as claim() hands it to the pump, for the panel to show the
-- request as sent: the same message columns (claim()'s first ones but the
-- pump's own service_id, service_version and expired_lease_of; a field of
-- the body is added to both), the attempt last made (or the first, before
-- any), and the base URL of its service. Queued or settled alike.
create or replace function watchpump.message(p_delivery_id bigint)
returns table (
    delivery_id      bigint,
    change_id        bigint,
    watch_id         bigint,
    attempt          integer,
    resource         text,
    object           text,
    kind             text,
    sequence         bigint,
    occurred_at      timestamptz,
    payload          text,
    base_url         text,
    replay           boolean
)
language sql stable as $$
    select d.id, d.change_id, d.watch_id, greatest(d.attempts, 1), w.resource, ch.object, ch.kind,
           ch.sequence, ch.occurred_at, ch.payload::text, s.base_url, d.replay
    from (select q.id, q.change_id, q.watch_id, q.service_id, q.attempts, q.replay
          from watchpump.queue q where q.id = p_delivery_id
          union all
          select t.id, t.change_id, t.watch_id, t.service_id, t.attempts, t.replay
          from watchpump.settled t where t.id = p_delivery_id) d
    join watchpump.changes ch on ch.id = d.change_id
    join watchpump.watches w on w.id = d.watch_id
    join watchpump.services s on s.id = d.service_id
$$;

-- Say that this pump is going to sleep until a NOTIFY or its sweep.
create or replace function watchpump.sleep(p_pump text) returns void
language sql as $$
    insert into watchpump.sleepers (pump) values (p_pump)
    on conflict (pump) do update set since = now()
$$;

-- Record a batch of attempts (each a watchpump.attempt_report) and what
-- became of each delivery. Outcomes: 'delivered' (2xx), 'gone' (410: drop
-- the watch), or 'retry' (anything else; next_attempt_at is when, computed
-- by the pump's back-off).
-- A retry becomes 'dropped' when the watch was removed, 'superseded' when
-- newer news of its (watch, object) waits (supersede_older()), 'failed' when
-- its deadline has passed, and stays queued ('pending') otherwise, due at
-- its next_attempt_at or at its deadline if that comes first: the last
-- retry is made at the deadline, and "failed" means the deadline passed.
-- Each returned row says where a delivery now stands; a pending one says
-- when it is due.
--
-- Only rows this pump still holds (same lease holder and attempt) change:
-- a pump whose lease ran out and was taken over records its attempt but
-- decides nothing. A delivered delivery still held is settled first, in
-- one statement that checks the lease as it deletes (a healthy consumer's
-- batch costs that statement only). The other reports are unnested once
-- (with their order) and the rows held are locked once, in one statement
-- that records the attempts and schedules the retries from that one held
-- set; settling follows from it.
--
-- The attempt log: the attempt that delivered is kept on the settled row
-- (settle()); every other attempt is appended to attempt_log, one row per
-- run of failed attempts of a delivery. A failed attempt that follows the
-- delivery's previous one (attempt numbers in a row) folds into that run's
-- row whatever it answered: repeats + 1, the newest answer (status, error,
-- head, duration, last_started_at, pump), and its count in statuses;
-- first_status and first_error keep how the run began. A consumer that is
-- down for a day, or answers a different 4xx each time, costs a delivery
-- one row, not one per attempt. A run breaks only when attempts went
-- unrecorded (a pump died mid-send), and a delivery keeps at most
-- MAX_ATTEMPT_ROWS = 20 rows: past that, every failure folds into its
-- newest row. The attempt of a pump that no longer held the delivery (its
-- lease ran out before it recorded) gets a row of its own: it is rare,
-- and folding only held deliveries leaves a settled delivery's rows as
-- they were when it settled.
create or replace function watchpump.complete(p_pump text, p_reports watchpump.attempt_report[])
returns table (delivery_id bigint, service_id bigint, state text, next_attempt_at timestamptz)
language plpgsql
set jit = off
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_mergejoin = off
as $$
declare
    v_outcomes   watchpump.settle_outcome[];
    v_retried    bigint[];
    v_watch_ids  bigint[];
    v_objects    text[];
    v_gone       bigint[];
    v_done       bigint[] := '{}';
    v_done_services bigint[];
    -- The pump's hold after no answer and its request timeout: session
    -- settings of its connections (src/pump/mod.rs); none elsewhere.
    v_hold       interval := coalesce(nullif(current_setting('watchpump.hold_after_no_answer', true), '')::interval,
                                      interval '0');
    v_timeout    interval := coalesce(nullif(current_setting('watchpump.request_timeout', true), '')::interval,
                                      interval '0');
begin
    -- 1. The delivered ones this pump still holds are settled at once: the
    --    delete checks the lease as it takes the row lock (the outcome's
    --    attempt, settle()). Nothing else is decided for them, and nothing
    --    read from attempt_log, whose plan spans every partition: a batch of
    --    deliveries that all arrived (the common case) ends here.
    select coalesce(array_agg(row(r.delivery_id, 'delivered', r.status, r.error, null, r.attempt,
                                  r.started_at, r.duration_ms, r.response_head)::watchpump.settle_outcome
                              order by r.n), '{}')
    into v_outcomes
    from unnest(p_reports) with ordinality
         as r (delivery_id, attempt, outcome, status, error, started_at, duration_ms, response_head,
               next_attempt_at, n)
    where r.outcome = 'delivered';
    if cardinality(v_outcomes) > 0 then
        select coalesce(array_agg(s.delivery_id), '{}'), coalesce(array_agg(s.service_id), '{}')
        into v_done, v_done_services
        from watchpump.settle(v_outcomes, p_pump) s;
        return query
        select d.id, d.service_id, 'delivered'::text, null::timestamptz
        from unnest(v_done, v_done_services) as d (id, service_id);
        if cardinality(v_done) = cardinality(p_reports) then
            return;
        end if;
    end if;

    -- 2. The rest: failed attempts, 410s, and the attempts of deliveries
    --    this pump no longer holds (a "delivered" among them is logged
    --    like any other attempt: it decides nothing).
    with reported as materialized (
        select r.delivery_id as id, r.attempt, r.outcome, r.status, r.error, r.started_at as started,
               r.duration_ms as duration, r.response_head as head, r.next_attempt_at as next, r.n,
               coalesce(r.status::text, 'no answer') as answer
        from unnest(p_reports) with ordinality
             as r (delivery_id, attempt, outcome, status, error, started_at, duration_ms, response_head,
                   next_attempt_at, n)
        where not (r.outcome = 'delivered' and r.delivery_id = any (v_done))
    ),
    -- The held set: the reported rows this pump still holds, locked. (A
    -- delivered one still held was settled in step 1.)
    held as materialized (
        select r.*, q.watch_id, q.object
        from reported r
        join watchpump.queue q on q.id = r.id
        where q.leased_by = p_pump and q.attempts = r.attempt and r.outcome <> 'delivered'
        for update of q
    ),
    previous as (
        select l.id as delivery_id, l.status, l.error, l.started, l.duration, l.head, l.answer, a.id
        from reported l
        cross join lateral (
            select a.id, a.attempt, a.repeats
            from watchpump.attempt_log a
            where a.delivery_id = l.id
            order by a.attempt desc, a.id desc
            limit 1
        ) a
        -- Only a delivery this pump holds (so a queued one) folds: the
        -- attempt rows of a settled delivery never change, which lets
        -- retention copy them without a lock (0200_history.sql).
        where l.outcome = 'retry' and l.id in (select h.id from held h)
          and (a.attempt + a.repeats = l.attempt
               or (select count(*) from watchpump.attempt_log c where c.delivery_id = l.id) >= 20)
    ),
    folded as (
        update watchpump.attempt_log a
        set repeats = a.repeats + 1, last_started_at = p.started, duration_ms = p.duration,
            status = p.status, error = p.error, response_head = p.head, pump = p_pump,
            statuses = coalesce(a.statuses, '{}')
                       || jsonb_build_object(p.answer, coalesce((a.statuses ->> p.answer)::integer, 0) + 1)
        from previous p
        -- By delivery first: attempt_log's index is (delivery_id, attempt)
        -- (it has none on id alone: 0013_history_indexes.sql).
        where a.delivery_id = p.delivery_id and a.id = p.id
        returning a.delivery_id
    ),
    appended as (
        insert into watchpump.attempt_log (delivery_id, attempt, started_at, duration_ms, status, error,
                                           response_head, pump, first_status, first_error, statuses)
        select l.id, l.attempt, l.started, l.duration, l.status, l.error, l.head, p_pump, l.status, l.error,
               jsonb_build_object(l.answer, 1)
        from reported l
        where l.id not in (select f.delivery_id from folded f)
        order by l.n
    ),
    decided as materialized (
        select h.*,
               case
                   when h.outcome = 'gone' then 'dropped'
                   when w.removed_at is not null then 'dropped'
                   else 'retry'
               end as decision
        from held h
        join watchpump.watches w on w.id = h.watch_id
    ),
    retried as (
        update watchpump.queue q
        set next_attempt_at = least(x.next, q.deadline),
            -- FENCING (issue 19; see the top of this file): no answer (a
            -- timeout, a broken connection) holds the (watch, object) for the
            -- pump's hold, since the consumer may still be working on it; a
            -- request that never left ('not sent: ', src/pump/send.rs) does not.
            -- A request given up on before its timeout (its connection broke
            -- after it arrived) may be worked on for the rest of that timeout
            -- too: the hold counts from when the timeout would have ended it.
            lease_until = case when x.status is null and x.error not like 'not sent: %'
                               then now() + v_hold
                                    + greatest(v_timeout - make_interval(secs => coalesce(x.duration, 0) / 1000),
                                               interval '0') end,
            leased_by = null,
            last_status = x.status, last_error = x.error
        from decided x
        where q.id = x.id and x.decision = 'retry'
        returning q.id, q.watch_id, q.object
    )
    select coalesce(array_agg(watchpump.settle_as(x.id, x.decision,
                                                  case when x.decision = 'dropped' and x.outcome = 'retry'
                                                       then 'watch removed' else x.error end,
                                                  null, x.status) order by x.n)
                    filter (where x.decision <> 'retry'), '{}'),
           coalesce(array_agg(distinct x.watch_id) filter (where x.outcome = 'gone'), '{}'),
           (select coalesce(array_agg(r.id order by r.id), '{}') from retried r),
           (select coalesce(array_agg(r.watch_id order by r.id), '{}') from retried r),
           (select coalesce(array_agg(r.object order by r.id), '{}') from retried r)
    into v_outcomes, v_gone, v_retried, v_watch_ids, v_objects
    from decided x;

    return query
    select s.delivery_id, s.service_id, s.state, null::timestamptz
    from watchpump.settle(v_outcomes) s;

    if cardinality(v_retried) > 0 then
        -- Newer news waiting supersedes a retry; once its deadline has
        -- passed (this attempt was the one made at it, or later) it fails.
        return query
        select s.delivery_id, s.service_id, 'superseded'::text, null::timestamptz
        from watchpump.supersede_older(v_watch_ids, v_objects, 1000) s;
        select coalesce(array_agg(watchpump.settle_as(q.id, 'failed', 'deadline passed; last error: '
                                                                      || coalesce(q.last_error, 'none'))),
                        '{}')
        into v_outcomes
        from watchpump.queue q
        where q.id = any (v_retried) and q.deadline <= now();
        return query
        select s.delivery_id, s.service_id, s.state, null::timestamptz
        from watchpump.settle(v_outcomes) s;
        return query
        select q.id, q.service_id, 'pending'::text, q.next_attempt_at
        from watchpump.queue q where q.id = any (v_retried);
    end if;

    -- 410: the consumer's resource is gone. Drop the watch and what it still
    -- had waiting: what no pump holds (remove_watch()), and what this pump
    -- holds but did not report here, claimed ahead and never to be sent
    -- (the pump forgets what it holds of a gone watch: src/pump/claiming.rs;
    -- one still on the wire reports its attempt later, which then decides
    -- nothing). A claim that took some of it since the 410 cannot send it
    -- first: the consumer's request slot waits for this write-back.
    if cardinality(v_gone) > 0 then
        return query
        select r.delivery_id, r.service_id, 'dropped'::text, null::timestamptz
        from unnest(v_gone) as g (watch_id)
        cross join lateral watchpump.remove_watch(g.watch_id, 'gone: the consumer answered 410') r;
        v_outcomes := array(
            select watchpump.settle_as(q.id, 'dropped', 'watch removed: gone: the consumer answered 410')
            from watchpump.queue q
            where q.watch_id = any (v_gone) and q.leased_by = p_pump
              and q.id <> all (array(select r.delivery_id from unnest(p_reports) as r))
            order by q.id
            for update skip locked);
        return query
        select s.delivery_id, s.service_id, s.state, null::timestamptz
        from watchpump.settle(v_outcomes) s;
    end if;
end
$$;

-- A consumer answered again after being down: its waiting deliveries are due
-- now, instead of each waiting out its own back-off.
create or replace function watchpump.release_backlog(p_service_id bigint) returns integer
language plpgsql
set jit = off
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_mergejoin = off
as $$
declare
    v_count integer;
begin
    update watchpump.queue q
    set next_attempt_at = now()
    where q.service_id = p_service_id and q.next_attempt_at > now()
      and not watchpump.in_flight(q.lease_until);
    get diagnostics v_count = row_count;
    return v_count;
end
$$;

-- The periodic backstop. Keeps this pump's sleeper row fresh and forgets
-- sleepers of pumps that stopped sweeping (killed without a chance to say
-- so); once every p_deadlines_every at most, and one pump at a time, fails
-- the queued deliveries whose deadline passed (complete() fails the ones
-- whose attempt at or after the deadline failed; this catches those a down
-- consumer never got to: a scan of the queue, hence not every sweep). A
-- delivery whose last retry is due at its deadline (complete()) gets
-- LAST_RETRY_GRACE = 1 minute past it for a pump to make that attempt.
-- Leases that ran out need nothing: claim() takes them again (so nothing
-- here counts them). Returns how many failed, per service.
create or replace function watchpump.sweep(p_pump text, p_deadlines_every interval default interval '10 seconds')
returns table (service_id bigint, service text, failed integer)
language plpgsql
set jit = off
set plan_cache_mode = force_generic_plan
as $$
declare
    v_due      boolean;
    v_outcomes watchpump.settle_outcome[];
begin
    update watchpump.sleepers set since = now() where pump = p_pump;
    delete from watchpump.sleepers where since < now() - interval '1 minute';

    select true into v_due
    from watchpump.prune_position p
    where p.deadlines_checked_at < now() - p_deadlines_every
    for update skip locked;
    if not coalesce(v_due, false) then
        return;
    end if;
    update watchpump.prune_position set deadlines_checked_at = now();
    select coalesce(array_agg(watchpump.settle_as(q.id, 'failed', 'deadline passed; last error: '
                                                              || coalesce(q.last_error, 'none'))), '{}')
    into v_outcomes
    from (select q.id, q.last_error from watchpump.queue q
          where q.deadline < now() and not watchpump.in_flight(q.lease_until)
            and (q.next_attempt_at <> q.deadline or q.deadline < now() - interval '1 minute')
          limit 10000
          for update skip locked) q;
    return query
    select s.service_id, v.name, count(*)::integer
    from watchpump.settle(v_outcomes) s
    join watchpump.services v on v.id = s.service_id
    group by s.service_id, v.name;
end
$$;
