-- What retention keeps of a retired day (issue 18): a small partition of
-- its own per table, `<day>_kept`, built before the day is locked and
-- swapped in for it (watchpump.keep_what_retention_keeps(),
-- 0300_operator.sql), instead of rows copied one by one into the DEFAULT
-- partitions while the three tables were locked against emit() and the
-- pump (4.9 s for a day of 2.5 M deliveries, one in 20 failed).
--
-- A kept partition is retired once the failed retention has passed
-- (watchpump.retention_of()). Rows already in the DEFAULT partitions stay
-- there and are pruned in batches as before.
alter table watchpump.partitions add column kept boolean not null default false;

-- A kept partition is built whole before it is attached: with every index
-- it needs, including the one that 0012_resync.sql made on the parent
-- (an object's changes newest first), which ATTACH would otherwise build
-- while the tables are locked. Attaching a day made by add_partition()
-- uses the index it already has as well.
update watchpump.partition_templates
set indexes = array_append(indexes, 'create index on watchpump.%I (object, sequence)')
where parent = 'changes';
