-- Delivery storage v2: a small hot queue and an append-only history.
--
-- Before, one table held every delivery from emit to pruning. Each delivery
-- was updated twice (claimed, settled) and neither update was HOT, because
-- `state` appeared in the predicates of five partial indexes; each row
-- carried six index entries and two foreign keys, and a trigger ran per
-- emitting statement. Now:
--
--   watchpump.queue    deliveries not settled yet: pending, or in flight
--                      (a live lease). emit() inserts here; claim() sets the
--                      lease, a HOT update (no indexed column changes);
--                      settling deletes the row. Three indexes, no foreign
--                      keys, no trigger: small enough to stay in cache.
--   watchpump.settled  delivered, superseded, dropped and failed
--                      deliveries, written by the pump in batches (off the
--                      producer's transaction) and never updated: the
--                      history the panel and the views read.
--
-- `watchpump.deliveries` becomes a view over both with the old columns, so
-- that what operators and their scripts read keeps working. Integrity the
-- foreign keys used to check is kept by the functions that write these
-- tables (and checked by the tests).

-- Functions whose signature changes; sql/functions/ makes them again.
drop function if exists watchpump.claim(text, bigint[], integer[], boolean[], integer, interval);
drop function if exists watchpump.sweep(text);

-- The views are made again by sql/functions/0300_operator.sql.
drop view if exists watchpump.backlog, watchpump.delivery_log, watchpump.delivery_history,
                    watchpump.watch_list;

-- The old table keeps its rows and becomes the history.
alter table watchpump.deliveries rename to settled;
drop trigger if exists deliveries_wake on watchpump.settled;
drop trigger if exists deliveries_note_failure on watchpump.settled;
drop function if exists watchpump.note_failure();
drop function if exists watchpump.wake_sleepers();
alter table watchpump.settled drop constraint if exists deliveries_change_id_fkey;
alter table watchpump.settled drop constraint if exists deliveries_watch_id_fkey;
alter table watchpump.attempts drop constraint if exists attempts_delivery_id_fkey;
alter table watchpump.actions drop constraint if exists actions_delivery_id_fkey;

create sequence watchpump.delivery_ids;
select setval('watchpump.delivery_ids', coalesce((select max(id) from watchpump.settled), 0) + 1, false);

create table watchpump.queue (
    id               bigint primary key default nextval('watchpump.delivery_ids'),
    change_id        bigint not null,
    watch_id         bigint not null,
    -- The watch's service, copied for the per-service claim.
    service_id       bigint not null,
    object           text not null,
    attempts         integer not null default 0,
    next_attempt_at  timestamptz not null default now(),
    deadline         timestamptz not null,
    -- In flight while lease_until is ahead: leased_by is sending it. An
    -- expired lease is pending again, for any pump.
    lease_until      timestamptz,
    leased_by        text,
    last_status      integer,
    last_error       text,
    created_at       timestamptz not null default clock_timestamp()
) with (fillfactor = 70,
        autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000,
        autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 20000,
        autovacuum_analyze_scale_factor = 0.05, autovacuum_vacuum_cost_delay = 0);
-- The claim: a service's due deliveries, oldest due first.
create index queue_due on watchpump.queue (service_id, next_attempt_at);
-- The order rule (0200_pump.sql): the deliveries of one (watch, object).
create index queue_stream on watchpump.queue (watch_id, object, id);

insert into watchpump.queue (id, change_id, watch_id, service_id, object, attempts, next_attempt_at,
                             deadline, lease_until, leased_by, last_status, last_error, created_at)
select id, change_id, watch_id, service_id, object, attempts, next_attempt_at,
       deadline, lease_until, leased_by, last_status, last_error, created_at
from watchpump.settled
where state in ('pending', 'in_flight');
delete from watchpump.settled where state in ('pending', 'in_flight');

-- The history: no leases, only settled states, written once.
drop index if exists watchpump.deliveries_due;
drop index if exists watchpump.deliveries_pending_per_object;
drop index if exists watchpump.deliveries_in_flight_per_object;
drop index if exists watchpump.deliveries_pending_deadline;
drop index if exists watchpump.deliveries_finished;
drop index if exists watchpump.deliveries_service_finished;
drop index if exists watchpump.deliveries_failed_dropped;
alter table watchpump.settled drop column lease_until, drop column leased_by;
alter table watchpump.settled alter column id drop identity if exists;
alter table watchpump.settled alter column finished_at set not null;
alter table watchpump.settled drop constraint if exists deliveries_state_check;
alter table watchpump.settled add constraint settled_state_check
    check (state in ('delivered', 'superseded', 'dropped', 'failed'));
alter table watchpump.settled set (fillfactor = 100,
    autovacuum_vacuum_scale_factor = 0.2, autovacuum_analyze_scale_factor = 0.05);
alter index watchpump.deliveries_pkey rename to settled_pkey;
alter index watchpump.deliveries_change rename to settled_change;
alter index watchpump.deliveries_failed rename to settled_failed;
alter index watchpump.deliveries_created_brin rename to settled_created_brin;
-- A service's deliveries newest first (the panel), and its last delivered.
create index settled_service on watchpump.settled (service_id, id);
-- "What happened to the pushes to main?": an object's deliveries, newest
-- first; also a (watch, object)'s newer news (newer_news()).
create index settled_object on watchpump.settled (object, id);
-- Rows arrive in the order they finish: pruning reads old ranges.
create index settled_finished_brin on watchpump.settled using brin (finished_at);

-- Changes: the (object, sequence) unique index is gone from the producer's
-- path (the object's counter row already serialises its sequences), and so
-- is the index pruning used (it now walks ids).
alter table watchpump.changes drop constraint if exists changes_object_sequence_key;
drop index if exists watchpump.changes_occurred;

-- Attempts: the attempt that delivered is kept on the settled row itself
-- (last_*), saving a row and two index entries per delivery; every other
-- attempt is appended to attempt_log, where consecutive identical failures
-- fold into one row (repeats, last_started_at), so that a consumer that is
-- down for a day costs a delivery a few rows, not one per probe. The view
-- watchpump.attempts (0300_operator.sql) shows both, as the table did.
alter table watchpump.attempts rename to attempt_log;
alter index watchpump.attempts_pkey rename to attempt_log_pkey;
alter index watchpump.attempts_delivery rename to attempt_log_delivery;
alter table watchpump.attempt_log add column repeats integer not null default 1,
                                  add column last_started_at timestamptz;
alter table watchpump.settled add column last_started_at    timestamptz,
                              add column last_duration_ms   double precision,
                              add column last_response_head text,
                              add column last_pump          text;

-- Where the periodic deadline check got to (it runs every few sweeps).
alter table watchpump.prune_position add column deadlines_checked_at timestamptz not null default '-infinity';
