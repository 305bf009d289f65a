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
-- THE VOCABULARY: the words every floor above uses rather than writing
-- them out again, each defined once. Each is a `language sql` function
-- whose body is one expression (no FROM, no sub-SELECT), so that
-- PostgreSQL inlines it into the statement that calls it: the plan is the
-- plan of the expression written out, and a comparison of indexed columns
-- stays an index condition. Keep them so: a helper that reads a table, or
-- is declared SECURITY DEFINER or with a SET clause, is not inlined, and a
-- hot path would pay a function call a row. (A helper declared STRICT
-- stays inlinable only while everything in its body is strict, hence
-- lock_class() is.) Each one a role's own functions or views call needs
-- that role's EXECUTE right, inlined or not (sql/roles.sql).

-- The class of every advisory lock watchpump takes (two keys: this one,
-- then what is locked), 'wpmp' as an integer, so that none can meet a
-- producer's own single-key advisory locks: the order rule's stream locks
-- (stream_lock()), a service's pauses (pause_key(), 0550_pause.sql), a
-- service's resyncs (0700_consumer.sql) and the making and dropping of
-- days of history (prune(), 0200_history.sql; sql/roles.sql).
create or replace function watchpump.lock_class() returns integer
language sql immutable strict parallel safe as $$
    select 2003856752
$$;

-- The time a held delivery is "due" (a paused watch's or service's,
-- 0550_pause.sql): far enough to never come, and a real timestamp (not
-- 'infinity', which clients' date types cannot hold).
create or replace function watchpump.held_until() returns timestamptz
language sql immutable as $$
    select timestamptz '9999-12-31 00:00:00+00'
$$;

-- The key that names one (watch, object) stream in lock_class(): the
-- order rule's lock (0500_delivery.sql), taken without waiting by claim()
-- and hold_paused_of() (stream_lock()), and waited for by a resync's batch
-- (resync_batch(), 0700_consumer.sql).
create or replace function watchpump.stream_key(p_watch_id bigint, p_object text) returns integer
language sql immutable strict parallel safe as $$
    select hashtext(p_watch_id::text || '/' || p_object)
$$;

-- The advisory lock that serialises decisions about one (watch, object),
-- if no other transaction holds it (never waited for), until this
-- transaction ends.
create or replace function watchpump.stream_lock(p_watch_id bigint, p_object text) returns boolean
language sql volatile strict as $$
    select pg_try_advisory_xact_lock(watchpump.lock_class(), watchpump.stream_key(p_watch_id, p_object))
$$;

-- Whether a queued delivery (a row of watchpump.queue, by its
-- lease_until) is in flight: a pump holds its lease, and nothing else may
-- send it or decide about it (settle it, supersede it, hold it, fail it at
-- its deadline) until the pump records its attempt or the lease runs out.
-- A lease that ran out, or none, is pending, for any pump. Read at the
-- transaction's start (now()), as claim() writes it.
create or replace function watchpump.in_flight(p_lease_until timestamptz) returns boolean
language sql stable parallel safe as $$
    select coalesce(p_lease_until > now(), false)
$$;

-- The order rule's "newer" (0500_delivery.sql), its one definition: of two
-- deliveries of one (watch, object), (p_sequence, p_id) is newer than
-- (p_than_sequence, p_than_id) when its change's sequence is higher (newer
-- news of the object), or, for two deliveries of one change (a resync's
-- replay and the live delivery it repeats: the same news), when it was
-- queued later (the higher delivery id). Not the id alone: a replay of
-- older news is queued after live news that may be newer (0012_resync.sql).
-- The queue's index queue_stream (watch_id, object, sequence, id) is in
-- this order, and the comparison, a row comparison, is an index condition
-- where one side is that index's columns.
create or replace function watchpump.is_newer(p_sequence bigint, p_id bigint,
                                              p_than_sequence bigint, p_than_id bigint)
returns boolean
language sql immutable parallel safe as $$
    select (p_sequence, p_id) > (p_than_sequence, p_than_id)
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
