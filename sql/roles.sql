-- Least privilege: four NOLOGIN group roles that a DBA grants to login
-- roles (`grant watchpump_inspector to ada;`), so that nobody needs the
-- owner's role to read the views, retry a delivery, emit a change or run
-- the pump. `watchpump migrate` applies this file on every run (it is
-- idempotent); a DBA can run it with psql too.
--
--   watchpump_inspector  the operator's views (docs/operator.md); no
--                        signing secrets, no payloads, no tables.
--   watchpump_operator   the inspector's views, plus retry() and
--                        retry_failed().
--   watchpump_emitter    emit() and emit_many() only: the producer's own
--                        login role.
--   watchpump_pump       what `watchpump serve` needs: the tables, the
--                        sequences and the functions; no DDL (run
--                        `watchpump migrate` as the owner first).
--
-- Roles are cluster-wide: creating them needs CREATEROLE. Without it, the
-- roles that are missing are reported (a WARNING here; `migrate` says which
-- and goes on) and the grants wait for a run that has them.
--
-- emit(), emit_many(), retry(), retry_failed() and prune() write tables (prune() makes
-- and drops partitions) their callers have no
-- grant on: they run as their owner (SECURITY DEFINER), with a fixed
-- search_path so that a caller's schemas cannot stand in for watchpump's
-- or pg_catalog's objects. This is set here, after the functions'
-- `create or replace` (which resets it), so that every migrate sets it again.
-- The actor of a retry is still the caller: actor() reads session_user.

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
    perform pg_advisory_xact_lock(2003856752, hashtext('watchpump.prune'));
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

    grant usage on schema watchpump
        to watchpump_inspector, watchpump_operator, watchpump_emitter, watchpump_pump;

    -- The views of docs/operator.md, and the warnings to notify it lists.
    -- The views read their tables with the owner's rights; none shows a
    -- payload or a secret.
    -- (The operator gets them directly rather than through membership of
    -- watchpump_inspector: granting a role needs CREATEROLE again.)
    grant select on watchpump.backlog, watchpump.delivery_log, watchpump.delivery_history,
                    watchpump.watch_list, watchpump.deliveries, watchpump.attempts,
                    watchpump.warnings
        to watchpump_inspector, watchpump_operator;

    for v_function in
        select p.oid::regprocedure from pg_proc p
        where p.pronamespace = 'watchpump'::regnamespace and p.proname in ('retry', 'retry_failed')
    loop
        execute format('grant execute on function %s to watchpump_operator', v_function);
    end loop;

    for v_function in
        select p.oid::regprocedure from pg_proc p
        where p.pronamespace = 'watchpump'::regnamespace and p.proname in ('emit', 'emit_many')
    loop
        execute format('grant execute on function %s to watchpump_emitter', v_function);
    end loop;

    grant select, insert, update, delete on all tables in schema watchpump to watchpump_pump;
    grant usage, select on all sequences in schema watchpump to watchpump_pump;
    grant execute on all functions in schema watchpump to watchpump_pump;
end
$grants$;
