-- Fair shares of what consumer services share (issue 34): an object's
-- fan-out budget per top segment, a token bucket per service over its
-- self-service writes, a daily replay budget per service, bounded pauses,
-- and the record of every attempt kept across a redelivery.

-- The fan-out budget of an object (src/watches/fanout.rs) where
-- fanout_budgets says nothing of its top segment. Null: 1,200 units. Read
-- where it is used, as the other settings (0008_storage_v3.sql).
alter table watchpump.settings
    add column fanout_units integer check (fanout_units between 1 and 1000000);

-- An operator's fan-out budget for the objects under one top segment
-- (`acme/`), raised or lowered from the default (`watchpump fanout
-- set-budget`). Each service may hold half of it.
create table watchpump.fanout_budgets (
    top_segment text primary key,
    units       integer not null check (units between 1 and 1000000),
    set_at      timestamptz not null default now(),
    set_by      text not null
);

-- Self-service writes (ping, redeliver, resync, pause, resume, watch
-- creation) per service: tokens a second, and the burst (null: 1 and 60);
-- and the replays one service's resyncs may queue a day (null: 20,000).
-- Read where they are used, as the other settings (0008_storage_v3.sql).
alter table watchpump.settings
    add column self_service_rate  double precision check (self_service_rate > 0),
    add column self_service_burst integer check (self_service_burst >= 1),
    add column replays_per_day    integer check (replays_per_day >= 1);

-- One token bucket per service over its self-service writes
-- (take_write_tokens(), 0500_consumer.sql), like rate_buckets for
-- deliveries: tokens, and when they were last refilled.
create table watchpump.write_buckets (
    service_id  bigint primary key,
    tokens      double precision not null,
    refilled_at timestamptz not null
);

-- The daily replay budget of each service (take_replays()): a bucket that
-- holds a day's replays and refills over a day.
create table watchpump.replay_buckets (
    service_id  bigint primary key,
    tokens      double precision not null,
    refilled_at timestamptz not null
);

-- One resync per service at a time (resync_start()): found by service.
create index resyncs_service on watchpump.resyncs (service_id);

-- How long a consumer's pause of a watch lasts at most; then the watch is
-- resumed and what it held is sent. Null: 7 days.
alter table watchpump.settings
    add column max_pause interval check (max_pause > interval '0');

-- When a watch was last resumed: a watch resumed less than a minute ago
-- is not paused again (set_watch_paused()), so that pausing and resuming
-- in a loop cannot rewrite what the watch holds again and again.
alter table watchpump.watches add column resumed_at timestamptz;

-- Resumed watches whose held deliveries are still being released, a batch
-- at a time (release_resumed(), 0500_consumer.sql): a resume releases one
-- batch itself and the operator's task the rest.
create table watchpump.releasing (
    watch_id   bigint primary key,
    service_id bigint not null
);

-- The held deliveries of a watch, oldest first, for releasing them in
-- batches. Partial: a delivery enters it only while held, so emit() and
-- the pump's claims never write to it.
create index queue_held on watchpump.queue (watch_id, id)
    where next_attempt_at = timestamptz '9999-12-31 00:00:00+00';

-- The attempt that delivered a delivery lives on its settled row; a
-- redelivery (or an operator's retry) moves the delivery back to the queue
-- and that row goes. The action that requeued it keeps that attempt, so
-- that watchpump.attempts and the history still show it (issue 34: a
-- redelivered delivery listed only its second attempt).
alter table watchpump.actions add column attempt             integer,
                              add column attempt_started_at  timestamptz,
                              add column attempt_duration_ms double precision,
                              add column attempt_status      integer,
                              add column attempt_response_head text,
                              add column attempt_pump        text;

-- set_watch_paused() gains who is asking (the API refuses a re-pause soon
-- after a resume; the operator's CLI is not refused), and release_held()
-- a bound; 0500_consumer.sql makes both again.
drop function if exists watchpump.set_watch_paused(bigint, bigint, boolean);
drop function if exists watchpump.release_held(bigint[]);
