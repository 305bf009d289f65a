-- Token buckets, one row per service each: the deliveries a second a
-- service may get (RATE), and the writes it may make itself (SELF-SERVICE
-- WRITES). A consumer's daily budget of replays is its resync's
-- (0700_consumer.sql).

-- RATE. A service's rate (services.max_rate, consumer_rate: the lower
-- holds) is a token bucket in rate_buckets, shared by every pump: it fills
-- at `rate` tokens a second up to a burst of rate / 20 (at least 1), and
-- each delivery claimed takes a token. The burst is small on purpose: in
-- any second of the database's time a consumer's claims take at most
-- rate + burst tokens (50/s: 52; tests/consumer_rate.rs holds 1,000 at
-- 50/s to 18-30 s of arrivals). The pump takes tokens in one call
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
-- may claim now and `refill_seconds`, how long until its bucket holds what
-- the next claim would take (its burst, or the slots wanted if fewer; at
-- least one token): a pump that used every token granted claims again
-- then (src/pump/rate.rs). Services without a rate are not listed (their
-- slots stand). One row lock per limited service with deliveries queued,
-- held for this statement only.
--
-- A limited service with nothing a claim could take (nothing queued, or
-- only held deliveries, or the service paused: claim() skips those) is
-- granted nothing and its bucket is left alone (it fills by the clock all
-- the same): its row says 0 and a refill of infinity, "nothing to claim
-- again for". A consumer may limit its own service (PUT /api/v1/rate),
-- and every claim of every pump wrote each limited service's bucket: 500
-- idle limited services cost a take 3.9 ms and 44 kB of WAL. Granting 0 rather than leaving the row
-- out keeps a delivery queued between this call and the claim from being
-- claimed without a token.
--
-- Until issue 35 it returned the first two columns only: a result cannot
-- be replaced in place, and 0027_take_tokens_refill.sql drops the old
-- one in the run that makes this one (one transaction: a pump never finds
-- it missing, nor without its grant). A pump of the version before this
-- one reads the two columns it knows by name; one of stop 40's clamps an
-- infinite refill to its one-second recheck.
create or replace function watchpump.take_tokens(p_service_ids bigint[], p_wanted integer[], p_default integer)
returns table (service_id bigint, granted integer, refill_seconds double precision)
language plpgsql
set jit = off
as $$
declare
    v_now timestamptz := clock_timestamp();
begin
    -- A bucket, full, for a limited service that has none yet and has
    -- something to claim (the queue probed here only until it has one).
    insert into watchpump.rate_buckets as b (service_id, tokens, refilled_at)
    select s.id, watchpump.rate_burst(watchpump.effective_rate(s.max_rate, s.consumer_rate)), v_now
    from watchpump.services s
    where s.removed_at is null and s.paused_at is null
      and (s.max_rate is not null or s.consumer_rate is not null)
      and not exists (select from watchpump.rate_buckets o where o.service_id = s.id)
      and exists (select from watchpump.queue q
                  where q.service_id = s.id and q.next_attempt_at < watchpump.held_until())
    on conflict do nothing;

    -- Each SET expression reads the same (newest, once locked) row: a
    -- concurrent pump's take is seen, and time since refilled_at is
    -- counted once (refilled_at never goes back).
    return query
    with limited as materialized (
        select s.id, watchpump.effective_rate(s.max_rate, s.consumer_rate) as rate,
               greatest(coalesce(u.wanted, p_default), 0) as wanted,
               -- What claim() could take: a delivery not held, of a
               -- service not paused (one probe of queue_due).
               s.paused_at is null
                 and exists (select from watchpump.queue q
                             where q.service_id = s.id
                               and q.next_attempt_at < watchpump.held_until()) as queued
        from watchpump.services s
        left join unnest(p_service_ids, p_wanted) as u (id, wanted) on u.id = s.id
        where s.removed_at is null and (s.max_rate is not null or s.consumer_rate is not null)
    ),
    taken as (
        update watchpump.rate_buckets b
        set granted = least(l.wanted, floor(least(watchpump.rate_burst(l.rate),
                              b.tokens + l.rate * greatest(0, extract(epoch from v_now - b.refilled_at)))))::integer,
            tokens = least(watchpump.rate_burst(l.rate),
                           b.tokens + l.rate * greatest(0, extract(epoch from v_now - b.refilled_at)))
                     - least(l.wanted, floor(least(watchpump.rate_burst(l.rate),
                              b.tokens + l.rate * greatest(0, extract(epoch from v_now - b.refilled_at))))),
            refilled_at = greatest(b.refilled_at, v_now)
        from limited l
        where b.service_id = l.id and l.queued
        returning b.service_id, b.granted,
                  greatest(0, greatest(1, least(watchpump.rate_burst(l.rate), l.wanted)) - b.tokens)
                      / l.rate as refill_seconds
    )
    select t.service_id, t.granted, t.refill_seconds from taken t
    union all
    -- Every limited service the update did not take for: those with
    -- nothing queued, and any whose first delivery or rate came between
    -- the insert above and this statement (it has no bucket yet).
    select l.id, 0, double precision 'infinity' from limited l
    where not exists (select from taken t where t.service_id = l.id);
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
