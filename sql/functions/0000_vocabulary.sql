-- THE FLOORS. Each file of sql/functions is one room, and a room calls
-- only what its own file or an earlier one defines: the floors below it,
-- and the rooms before it on its own floor (tests/sql_floors.rs reads the
-- files and names any call that goes up). Migrations (sql/migrations) come
-- before every floor: the tables, the types that cross to Rust, and
-- first_timeline(). `watchpump migrate` applies the files in this order.
--
--   0  0000_vocabulary  the words every room uses (this file)
--      0050_settings    watchpump.settings, read where they are used
--   1  0100_kinds       strict mode: a payload checked against its kind
--      0150_emit        emit() and emit_many(): a change and its deliveries
--   2  0200_history     the history by day: partitions made, failures
--                       staged for retention, days retired (prune())
--      0250_rate        token buckets: a service's deliveries a second, and
--                       its self-service writes
--   3  0300_settle      how a delivery leaves the queue (settle(),
--                       supersede_older()) and comes back (requeue())
--   4  0400_registry    watches and services removed; fan-out budgets
--   5  0500_delivery    the pump: claim(), release(), complete(), sweep();
--                       the order rule and fencing, at its top
--      0550_pause       paused watches and services: held and released
--   6  0600_operator    the views, retry(), warnings, the metrics' counts
--   7  0700_consumer    a consumer's own calls: redeliver, ping, resync
--
-- THE VOCABULARY: small helpers that every floor above uses rather than
-- writing them out again.



-- The advisory lock that serialises decisions about one (watch, object):
-- class 2003856752 ('wpmp'), so that it cannot meet a producer's own
-- single-key advisory locks.
create or replace function watchpump.stream_lock(p_watch_id bigint, p_object text) returns boolean
language sql volatile strict as $$
    select pg_try_advisory_xact_lock(2003856752, hashtext(p_watch_id::text || '/' || p_object))
$$;



-- Who an action is recorded for: the caller's label, or the database role
-- of a psql session.
create or replace function watchpump.actor(p_actor text) returns text
language sql stable as $$
    select coalesce(nullif(btrim(p_actor), ''), 'sql:' || session_user)
$$;

-- The timeline this server writes WAL on: each promotion of a standby
-- starts a new one (the first eight hex digits of a WAL file's name).
create or replace function watchpump.timeline() returns integer
language sql volatile as $$
    select ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::integer
$$;

-- The floor of this timeline's ids and sequences (0023_timeline_floors.sql):
-- 0 on the timeline the database was installed on, 2^40 more for each
-- promotion since. Change ids and delivery ids are nextval() plus this,
-- and an object's next sequence is at least this plus one, so that a new
-- primary never hands out again what a lost one sent (issue 36).
create or replace function watchpump.id_floor() returns bigint
language sql volatile as $$
    select greatest(watchpump.timeline() - watchpump.first_timeline(), 0)::bigint << 40
$$;
