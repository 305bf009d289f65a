-- A queued delivery's payload size, as emit() and emit_many() measured it
-- (changes.payload_bytes), so that a claim can keep within its byte budget
-- from the rows it already read, without looking each change up first and
-- again for its payload. Null for deliveries queued another way (a ping, a
-- resync's replay, a retried or redelivered delivery) and for rows queued
-- before this migration: a claim that meets one looks its changes up, as
-- before. Adding a nullable column rewrites nothing.
alter table watchpump.queue add column payload_bytes integer;
