-- A claim sets a delivery's lease (attempts, lease_until, leased_by: no
-- indexed column), which PostgreSQL can do in place (a HOT update, no
-- index entry) only while the row's page has room for the new version.
-- A claim takes up to a window of deliveries that were queued together,
-- so it updates most rows of a page in one statement, before pruning can
-- free the old versions: at fillfactor 70 only about half the claims found
-- room, and the rest wrote three index entries each (the queue's primary
-- key, queue_due, queue_stream), which every later claim's walk then had
-- to step over. At 40 a page keeps room for each of its rows' leases. The
-- queue holds only what is not settled, so the price is pages of a backlog,
-- not of history. New pages follow it at once; existing ones as they are
-- rewritten.
alter table watchpump.queue set (fillfactor = 40);

-- The sweep's deadline check (sweep(), 0500_delivery.sql) finds the queued
-- deliveries whose deadline passed. Without an index it read the whole
-- queue every ten seconds: 64 ms, 8,000 pages from disk, on a backlog of
-- 1,000,000, and ten times that at ten million. Deadlines are appended in
-- time order, so this index costs an emit one entry at its right edge.
create index queue_deadline on watchpump.queue (deadline);
