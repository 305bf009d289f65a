-- Bounds on what one input may cost (README, "Bounds"): the columns and
-- index shapes they need. Applied once.

-- A change's payload size, as sent (the bytes of its JSON text), written by
-- emit(): a claim bounds the payload bytes it hands to a pump by it,
-- without reading a single payload. Changes recorded before this migration
-- count 0 (their payloads are as large as they are; the claim still takes
-- at least one change at a time).
alter table watchpump.changes add column payload_bytes integer not null default 0;

-- Consecutive failed attempts of a delivery fold into one attempt_log row
-- whatever their statuses (0200_pump.sql, record_attempts()): the row keeps
-- the first attempt's answer (first_status, first_error), the last one's
-- (status, error, response_head, duration_ms, last_started_at), and how
-- many attempts answered what (statuses: {"503": 4, "no answer": 2}).
alter table watchpump.attempt_log add column first_status integer,
                                  add column first_error  text,
                                  add column statuses     jsonb;
update watchpump.attempt_log
set first_status = status, first_error = error,
    statuses = jsonb_build_object(coalesce(status::text, 'no answer'), repeats);

-- The queue's per-(watch, object) index keeps the id as an included column,
-- not a key column, so that the primary key is the only index a lookup by
-- id can use. With id as its third key column, a lookup of a set of ids
-- could be planned as one full scan of this index per id (btree applies a
-- qual on a later key column by reading the whole index), which is what
-- the planner chose with the statistics of an empty queue: a claim of
-- 9,600 deliveries took 47 s instead of 0.5 s.
drop index watchpump.queue_stream;
create index queue_stream on watchpump.queue (watch_id, object) include (id);

-- Functions whose signature changes; sql/functions/ makes them again.
drop function if exists watchpump.claim(text, bigint[], integer[], boolean[], integer, interval);
drop function if exists watchpump.supersede_older(bigint[], text[]);
