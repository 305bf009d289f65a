-- Least privilege: four NOLOGIN group roles that a DBA grants to login
-- roles (`grant watchpump_inspector to ada;`), so that nobody needs the
-- owner's role to read the views, retry a delivery, emit a change or run
-- the pump. `watchpump migrate` applies this file on every run (it is
-- idempotent); a DBA can run it with psql too. docs/operator.md ("Roles")
-- has the same rights as a table, which tests/roles.rs compares with the
-- database's grants.
--
--   watchpump_inspector  the operator's views (docs/operator.md); no
--                        signing secrets, no payloads, no tables.
--   watchpump_operator   the inspector's views, plus retry() and
--                        retry_failed().
--   watchpump_emitter    emit() and emit_many() only: the producer's own
--                        login role.
--   watchpump_pump       what `watchpump serve` needs (the pump, the
--                        watches API, the panel and admin API, the operator
--                        task, the metrics), listed below table by table
--                        and function by function; no DDL (run `watchpump
--                        migrate` as the owner first), no write to what the
--                        owner's code reads to decide what to run or drop
--                        (partitions, kinds, settings, schema_migrations).
--
-- Roles are cluster-wide: creating them needs CREATEROLE. Without it, the
-- roles that are missing are reported (a WARNING here; `migrate` says which
-- and goes on) and the grants wait for a run that has them.
--
-- emit(), emit_many(), retry(), retry_failed() and prune() write tables
-- (prune() makes and drops partitions) their callers have no grant on:
-- they run as their owner (SECURITY DEFINER), with a fixed search_path so
-- that a caller's schemas cannot stand in for watchpump's or pg_catalog's
-- objects. This is set here, after the functions' `create or replace`
-- (which resets it), so that every migrate sets it again. The actor of a
-- retry is still the caller: actor() reads session_user. Code that runs as
-- the owner executes no SQL text read from a table another role may write
-- (issue 34): partition settings and indexes are in make_partition_table()'s
-- body, and partition names are checked before use (partition_checked()).

do $roles$
declare
    v_role text;
    v_may_create boolean := (select rolcreaterole or rolsuper from pg_roles where rolname = current_user);
begin
    foreach v_role in array array['watchpump_inspector', 'watchpump_operator',
                                  'watchpump_emitter', 'watchpump_pump'] loop
        continue when exists (select from pg_roles where rolname = v_role);
        if not v_may_create then
            raise warning 'role % does not exist, and % may not create roles (CREATEROLE)', v_role, current_user;
            continue;
        end if;
        begin
            execute format('create role %I nologin', v_role);
        exception when duplicate_object or unique_violation then
            null; -- another database's migrate created it just now
        end;
    end loop;
end
$roles$;

-- Nothing in the schema runs for PUBLIC: each role gets what it needs below.
revoke all on schema watchpump from public;
revoke execute on all functions in schema watchpump from public;
alter default privileges in schema watchpump revoke execute on functions from public;

do $grants$
declare
    v_function regprocedure;
begin
    -- prune()'s lock, which every maker and dropper of days of history
    -- takes (add_partition(), prune()): a GRANT on all tables that meets
    -- a table being created or dropped fails ("tuple concurrently
    -- updated"), and a pump whose start-up fails exits.
    perform pg_advisory_xact_lock(watchpump.lock_class(), hashtext('watchpump.prune'));
    for v_function in
        select p.oid::regprocedure from pg_proc p
        where p.pronamespace = 'watchpump'::regnamespace
          -- prune() creates and drops partitions, which needs the owner.
          and p.proname in ('emit', 'emit_many', 'retry', 'retry_failed', 'prune')
    loop
        execute format('alter function %s security definer set search_path = pg_catalog, watchpump, pg_temp',
                       v_function);
    end loop;

    if (select count(*) from pg_roles
        where rolname in ('watchpump_inspector', 'watchpump_operator',
                          'watchpump_emitter', 'watchpump_pump')) < 4 then
        return;
    end if;

    -- From nothing, every run: what is not granted below is revoked, and
    -- with it what an earlier version granted (until issue 34,
    -- watchpump_pump had insert, update and delete on every table and
    -- execute on every function, watchpump.partitions included, whose rows
    -- prune() acts on as the owner). The whole file is one transaction:
    -- other sessions see the old grants or the new ones, never none.
    revoke all on all tables in schema watchpump
        from watchpump_inspector, watchpump_operator, watchpump_emitter, watchpump_pump;
    revoke all on all sequences in schema watchpump
        from watchpump_inspector, watchpump_operator, watchpump_emitter, watchpump_pump;
    revoke all on all functions in schema watchpump
        from watchpump_inspector, watchpump_operator, watchpump_emitter, watchpump_pump;

    grant usage on schema watchpump
        to watchpump_inspector, watchpump_operator, watchpump_emitter, watchpump_pump;

    -- The views of docs/operator.md, and the warnings to notify it lists.
    -- The views read their tables with the owner's rights; none shows a
    -- payload or a secret. The pump's panel and admin API read them too.
    -- (The operator gets them directly rather than through membership of
    -- watchpump_inspector: granting a role needs CREATEROLE again.)
    grant select on watchpump.backlog, watchpump.delivery_log, watchpump.delivery_history,
                    watchpump.watch_list, watchpump.deliveries, watchpump.attempts,
                    watchpump.warnings
        to watchpump_inspector, watchpump_operator, watchpump_pump;
    -- The counts the backlog view and the gauges share: the backlog view
    -- reads them with its owner's rights; backlog_counts(), the pump's
    -- gauges, with the pump's.
    grant select on watchpump.service_backlog to watchpump_pump;

    -- What the views call: PostgreSQL checks the functions a view calls
    -- against the role that reads it, not the view's owner (and inlines
    -- them only for a role that may call them).
    for v_function in
        select p.oid::regprocedure from pg_proc p
        where p.pronamespace = 'watchpump'::regnamespace and p.proname in ('in_flight')
    loop
        execute format('grant execute on function %s to watchpump_inspector, watchpump_operator, watchpump_pump',
                       v_function);
    end loop;

    -- Functions by name, every overload of each.
    for v_function in
        select p.oid::regprocedure from pg_proc p
        where p.pronamespace = 'watchpump'::regnamespace and p.proname in ('retry', 'retry_failed')
    loop
        execute format('grant execute on function %s to watchpump_operator', v_function);
    end loop;

    -- emit_many() comes with 0150_emit.sql on main; a schema without it
    -- yet grants emit() alone.
    for v_function in
        select p.oid::regprocedure from pg_proc p
        where p.pronamespace = 'watchpump'::regnamespace and p.proname in ('emit', 'emit_many')
    loop
        execute format('grant execute on function %s to watchpump_emitter', v_function);
    end loop;

    -- The pump. Its functions (claim(), complete(), ping(), ...) run with
    -- its rights (SECURITY INVOKER), so it needs the tables they write as
    -- well as the ones its own queries do (src/).
    --   the delivery engine: claim(), release(), complete() and settle(),
    --   sweep(), supersede_older(), the pump's wake-ups and rate limits
    --   (update on settled: redeliver() locks the settled row it moves
    --   back, `select ... for update`, which needs it)
    grant select, insert, update, delete on watchpump.queue, watchpump.sleepers, watchpump.settled
        to watchpump_pump;
    --   consumers' own bounds (0022_consumer_shares.sql): their buckets of
    --   writes and of replays, the paused watches being released in
    --   batches, and the fan-out budgets operators set (read only: the
    --   owner sets them, `watchpump fanout set-budget`)
    grant select, insert, update on watchpump.write_buckets, watchpump.replay_buckets to watchpump_pump;
    grant select, insert, update, delete on watchpump.releasing to watchpump_pump;
    grant select on watchpump.fanout_budgets to watchpump_pump;
    grant select, insert, update on watchpump.attempt_log, watchpump.rate_buckets to watchpump_pump;
    grant select, update on watchpump.prune_position to watchpump_pump;
    --   settle()'s failures kept for retention (stage_failed()), taken out
    --   again by requeue() (redeliver())
    grant select, insert, delete on watchpump.staged_settled, watchpump.staged_attempt_log to watchpump_pump;
    grant insert on watchpump.staged_changes to watchpump_pump;
    --   a consumer's ping() (a change of its own, never through emit()),
    --   redeliver() and resync
    grant select, insert on watchpump.changes, watchpump.actions to watchpump_pump;
    grant select, insert, update on watchpump.objects to watchpump_pump;
    grant select, insert, update, delete on watchpump.resyncs to watchpump_pump;
    --   the registry: services and watches added, changed and removed by
    --   the admin API and the watches API (removal is an update), and the
    --   signing secrets `migrate` seals at start-up
    grant select, insert, update on watchpump.services, watchpump.watches to watchpump_pump;
    --   the operator task's warnings, and the panel's sessions
    grant select, insert, delete on watchpump.failure_inbox, watchpump.panel_sessions to watchpump_pump;
    grant insert, update on watchpump.warnings to watchpump_pump;
    --   read only: what owner code reads to decide what to run (kinds:
    --   emit()'s strict mode; partitions: what prune() drops), the
    --   settings, and `migrate`'s bookkeeping (a pump with nothing to
    --   apply reads it and goes on)
    grant select on watchpump.kinds, watchpump.settings, watchpump.partitions,
                    watchpump.schema_migrations
        to watchpump_pump;
    -- The ids of what the pump inserts (the other tables' ids are identity
    -- columns, which need no grant), and the count of malformed trace
    -- contexts that the metrics read.
    grant usage on sequence watchpump.delivery_ids, watchpump.change_ids, watchpump.attempt_ids
        to watchpump_pump;
    grant select on sequence watchpump.trace_context_malformed to watchpump_pump;

    for v_function in
        select p.oid::regprocedure from pg_proc p
        where p.pronamespace = 'watchpump'::regnamespace
          and p.proname in (
              -- the delivery engine (src/pump/)
              'claim', 'release', 'complete', 'sleep', 'sweep', 'release_backlog',
              'take_tokens', 'give_back_tokens',
              -- what those call with the pump's rights
              'settle', 'settle_as', 'supersede_older', 'stream_lock', 'stage_failed', 'is_staged',
              -- the vocabulary (0000_vocabulary.sql) its functions use
              'lock_class', 'stream_key', 'is_newer',
              'delivery_window', 'held_until', 'is_paused', 'rate_burst', 'effective_rate',
              -- the floors of ids and sequences (0023_timeline_floors.sql): the
              -- defaults of the ids ping() and resync queue with
              'id_floor', 'timeline', 'first_timeline',
              -- consumers' own bounds (0022_consumer_shares.sql)
              'settled_attempt', 'write_rate', 'take_write_tokens', 'holds_any', 'release_resumed',
              'start_release', 'expire_pauses', 'take_replays', 'give_back_replays',
              'consumer_resync_start', 'fanout_budget',
              -- the watches API and the consumer's own calls (src/api/, src/watches/)
              'message', 'ping', 'redeliver', 'object_prefixes', 'remove_watch',
              'hold_paused', 'hold_paused_of', 'paused_watches', 'pause_key', 'release_held',
              'set_watch_paused', 'set_service_paused', 'set_consumer_rate',
              'resync_start', 'resync_batch', 'resync_finish', 'covered_objects', 'payload_matches',
              'newer_news', 'requeue', 'actor',
              -- the admin API and the panel (src/operator/, src/services/)
              'retry', 'retry_failed', 'remove_service', 'set_max_rate',
              -- the operator task and the metrics
              'fold_failures', 'warning_attempted', 'prune', 'backlog_counts', 'consumer_gauges')
    loop
        execute format('grant execute on function %s to watchpump_pump', v_function);
    end loop;
end
$grants$;
