-- Resync (issue 20, docs/protocol.md "Resync"): a consumer asks for the
-- newest retained change of every object its watch covers, queued again as
-- replayed deliveries ("replay": true in the body).
--
-- A replay is created after the live deliveries of its object, so it may
-- get a higher delivery id than a live delivery of a NEWER change (one whose
-- emit() committed while the resync ran). Delivery ids therefore no longer
-- say which delivery of a (watch, object) carries the newest news: the
-- change's sequence does. The queue keeps it beside each delivery, and the
-- order rule (0200_pump.sql) orders a (watch, object) by (sequence, id).

-- The change's sequence, copied by whoever queues the delivery (emit(),
-- ping(), requeue(), resync_batch()). Filled from the changes here once.
alter table watchpump.queue add column sequence bigint;
update watchpump.queue q set sequence = c.sequence from watchpump.changes c where c.id = q.change_id;
update watchpump.queue set sequence = 0 where sequence is null;
alter table watchpump.queue alter column sequence set not null;

-- Whether the delivery is a replay: its body says "replay": true. Kept on
-- the settled row too, so that the body shown later is the body sent.
alter table watchpump.queue add column replay boolean not null default false;
alter table watchpump.settled add column replay boolean not null default false;

-- The order rule's index: the deliveries of one (watch, object), newest
-- news last.
drop index watchpump.queue_stream;
create index queue_stream on watchpump.queue (watch_id, object, sequence, id);

-- An object's changes newest first, for resync to find the newest one that
-- matches a watch's filters: one more index entry per change emit() writes
-- (benchmarked in BENCHMARKS.md, "Resync"). On the partitioned table, so
-- every day's partition, and every one created later, has it.
create index changes_object_sequence on watchpump.changes (object, sequence);

-- The objects a watch covers (its object, or every object under its
-- prefix), in order, for resync's batches: a prefix range scan, whatever
-- the database's collation. The object of a row never changes, so emit()'s
-- update of last_sequence stays a HOT update.
create index objects_pattern on watchpump.objects (object text_pattern_ops);

-- claim() returns whether each message is a replay (src/pump/store.rs).
alter type watchpump.claimed_message add attribute replay boolean;

-- message() gains the replay column (0200_pump.sql creates it again).
drop function if exists watchpump.message(bigint);

-- The resync running for a watch, if any: one at a time per watch (a
-- second is refused, 429). The row goes when the resync ends; one whose
-- heartbeat is older than a minute was left by a process that died, and a
-- new resync may take its place (resync_start(), 0500_consumer.sql).
create table watchpump.resyncs (
    watch_id     bigint primary key,
    service_id   bigint not null,
    started_at   timestamptz not null default now(),
    heartbeat_at timestamptz not null default now()
);
