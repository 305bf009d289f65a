-- Failures are written where retention keeps them when they fail, not
-- copied out of their day when it is retired (issue 18).
--
-- Retiring a day kept its failed deliveries (30 days against 7), with
-- their changes and attempts, by copying them out of the day's partitions
-- into `<day>_kept` tables. One delivery in 20 failed is spread over every
-- page of the day, so the copy read the whole day: 1.5 s quiet, 2.8-4.3 s
-- beside the pump, for a day of 2.2 M deliveries.
--
-- Now each day partition made by add_partition() (0300_operator.sql) has
-- its `<day>_kept` table from the start, a partition of one of the three
-- `staged_*` tables below, and settle() writes a failed delivery there too
-- (stage_failed()): the row, its change, its attempts. Retirement swaps the
-- day for its kept table, after checking that the table holds every failure
-- of the day and adding the few rows kept for other reasons (deliveries an
-- operator retried). The staged tables are never read by anything else.
--
-- `partitions.staged`: the day had its kept table from the start. Days made
-- before this migration have none and are retired by copying, as before.
--
-- The staged_* tables have the columns of settled, changes and attempt_log
-- in the same order (rows are copied with `select *`): a migration that
-- adds a column to one of those adds it to its staged_* table too.
alter table watchpump.partitions add column staged boolean not null default false;

create table watchpump.staged_settled
    (like watchpump.settled including defaults including constraints)
    partition by range (created_at);
create table watchpump.staged_changes
    (like watchpump.changes including defaults including constraints)
    partition by range (occurred_at);
create table watchpump.staged_attempt_log
    (like watchpump.attempt_log including defaults including constraints)
    partition by range (started_at);
