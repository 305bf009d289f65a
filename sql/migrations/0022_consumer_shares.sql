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
