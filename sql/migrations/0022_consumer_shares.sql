-- Issue 34: what consumer services share, shared fairly, and the record
-- of every attempt kept across a redelivery.

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
