-- The history: settled deliveries, their changes and their attempts,
-- partitioned by UTC day (0008_storage_v3.sql) and retired a whole day at a
-- time. Days are made ahead (add_partitions_ahead(), by `watchpump
-- migrate` and prune()); a day's failures are staged in its kept tables as
-- they fail (stage_failed(), which settle() calls: 0300_settle.sql), so
-- that retiring the day keeps them without reading it; prune() retires
-- what retention lets go, from the operator's task (src/operator/prune.rs)
-- in one pump at a time. prune() runs as the schema's owner (sql/roles.sql),
-- and so do the functions it calls.

-- The column each partitioned table of the history is partitioned by
-- (0008_storage_v3.sql); any other table is refused. Written here, like
-- the storage settings and indexes of make_partition_table(): prune() runs
-- as the owner and builds statements from them, so they are never read
-- from a table another role could write (issue 34: an index definition
-- updated in the former watchpump.partition_templates ran as the owner).
create or replace function watchpump.partition_key(p_parent text) returns text
language plpgsql immutable as $$
begin
    case p_parent
        when 'changes' then return 'occurred_at';
        when 'settled' then return 'created_at';
        when 'attempt_log' then return 'started_at';
        else
            raise exception 'watchpump: % is not a partitioned table of the history (changes, settled or attempt_log)',
                coalesce(quote_literal(p_parent), 'null')
                using errcode = '22023';
    end case;
end
$$;

-- The name watchpump gives the partition of `p_parent` that begins at
-- `p_from`: `settled_20261204` for a day (add_partition()), and
-- `settled_20261204_kept` for what retention keeps of it
-- (keep_what_retention_keeps()); the v2 tables that 0008_storage_v3.sql
-- attached begin at -infinity: `settled_v2`, `settled_v2_kept`. The one
-- definition of the shape: it makes the names and checks them
-- (partition_checked()).
create or replace function watchpump.partition_name(p_parent text, p_from timestamptz, p_kept boolean)
returns text
language plpgsql stable as $$
begin
    perform watchpump.partition_key(p_parent);
    return p_parent
           || case when p_from = '-infinity' then '_v2'
                   else '_' || to_char(p_from at time zone 'UTC', 'YYYYMMDD') end
           || case when p_kept then '_kept' else '' end;
end
$$;

-- The name of a row of watchpump.partitions, once it is proven to be the
-- name watchpump made for that row (partition_name() of its parent, its
-- start and whether it is kept) and its range runs forwards; otherwise
-- 42602 (invalid_name), naming the row. Retention, which runs as the owner,
-- locks, detaches and drops the tables these names name: a row watchpump
-- did not write (`services`, or today's day with an end in the past) stops
-- it before it touches anything. Only the owner may write the table
-- (sql/roles.sql), and CHECK constraints hold its shape too
-- (0021_owner_code.sql); this check relies on neither.
create or replace function watchpump.partition_checked(p watchpump.partitions) returns text
language plpgsql stable as $$
begin
    if p.parent is null or p.parent not in ('changes', 'settled', 'attempt_log')
       or p.name is distinct from watchpump.partition_name(p.parent, p.from_at, p.kept)
       or not coalesce(p.to_at > p.from_at, false) then
        raise exception 'watchpump: the partition row % (parent %, from %, to %, kept %) is not one watchpump made',
            coalesce(quote_literal(p.name), 'null'), coalesce(quote_literal(p.parent), 'null'),
            p.from_at, p.to_at, p.kept
            using errcode = '42602',
                  detail = 'watchpump names a partition after its parent and the UTC day it begins '
                           '(settled_20261204, settled_20261204_kept, settled_v2, settled_v2_kept; changes_ '
                           'and attempt_log_ alike), and retention drops the tables these rows name.',
                  hint = 'Someone wrote this row of watchpump.partitions by hand: find out who, then delete it '
                         '(as the schema''s owner) so that retention can go on.';
    end if;
    return p.name;
end
$$;

-- Makes `p_name`, a table like `p_parent` with the storage settings and
-- the indexes of its days, for [p_from, p_to): filled first by the
-- statement `p_fill` (if any; `%I` in it names the table, `$1` is
-- `p_ids`), then indexed (each index built once), then proven in range by
-- a CHECK constraint `<p_name>_range`, which spares a scan when it is
-- attached as a partition. Returns the rows filled. Its callers (owner
-- code: add_partition(), copy_what_retention_keeps()) build `p_fill` in
-- their own bodies; the settings and the indexes are written here (why
-- each index: 0013_history_indexes.sql, 0014, 0016), never read from a
-- table (issue 34).
create or replace function watchpump.make_partition_table(
    p_parent text, p_name text, p_from timestamptz, p_to timestamptz,
    p_fill text default null, p_ids bigint[] default null
) returns bigint
language plpgsql as $$
declare
    v_key   text := watchpump.partition_key(p_parent);
    v_index text;
    v_rows  bigint := 0;
begin
    execute format('create table watchpump.%I (like watchpump.%I including defaults including constraints) with (%s)',
                   p_name, p_parent,
                   case p_parent
                       when 'attempt_log' then 'fillfactor = 90'
                       else 'fillfactor = 100, autovacuum_vacuum_insert_scale_factor = 0.05'
                   end);
    if p_fill is not null then
        execute format(p_fill, p_name) using p_ids;
        get diagnostics v_rows = row_count;
    end if;
    foreach v_index in array case p_parent
        when 'changes' then
            array['create unique index on watchpump.%I (id)',
                  'create index on watchpump.%I (object, sequence)']
        when 'settled' then
            array['create unique index on watchpump.%I (id)',
                  'create index on watchpump.%I (change_id)',
                  'create index on watchpump.%I (service_id, id)',
                  'create index on watchpump.%I (object, id)',
                  'create index on watchpump.%I (created_at, id)',
                  'create index on watchpump.%I (service_id, id) where state = ''failed''',
                  'create index on watchpump.%I (id) where state in (''failed'', ''dropped'')',
                  'create index on watchpump.%I (finished_at) include (service_id) where state = ''failed''',
                  'create index on watchpump.%I using brin (finished_at)']
        when 'attempt_log' then
            array['create index on watchpump.%I (delivery_id, attempt)']
    end loop
        execute format(v_index, p_name);
    end loop;
    execute format('alter table watchpump.%I add constraint %I check (%I is not null and %I >= %L and %I < %L)',
                   p_name, p_name || '_range', v_key, v_key, p_from, v_key, p_to);
    return v_rows;
end
$$;

-- Adds the partition of `p_parent` for [p_from, p_to), filled with the
-- rows of the range that went to the DEFAULT partition meanwhile (none,
-- unless maintenance fell behind), then attached. ATTACH locks the parent
-- only against DDL (SHARE UPDATE EXCLUSIVE), and the CHECK constraint
-- spares it a scan of the new table; it scans the DEFAULT partition, which
-- is small. And the day's kept table, where settle() writes the day's
-- failures as they fail (stage_failed()), and that retirement puts in the
-- day's place: attached to `staged_<p_parent>` until then.
create or replace function watchpump.add_partition(p_parent text, p_from timestamptz, p_to timestamptz)
returns text
language plpgsql as $$
declare
    v_name text := watchpump.partition_name(p_parent, p_from, false);
    v_key  text := watchpump.partition_key(p_parent);
begin
    -- prune()'s lock (held already when prune() or add_partitions_ahead()
    -- calls this): one maker of partitions at a time, and none while
    -- sql/roles.sql grants on all tables.
    perform pg_advisory_xact_lock(watchpump.lock_class(), hashtext('watchpump.prune'));
    perform watchpump.make_partition_table(p_parent, v_name, p_from, p_to,
        format('with moved as (delete from watchpump.%I where %I >= %L and %I < %L returning *)
                insert into watchpump.%%I select * from moved',
               p_parent || '_kept', v_key, p_from, v_key, p_to));
    execute format('alter table watchpump.%I attach partition watchpump.%I for values from (%L) to (%L)',
                   p_parent, v_name, p_from, p_to);
    execute format('alter table watchpump.%I drop constraint %I', v_name, v_name || '_range');
    perform watchpump.make_partition_table(p_parent, v_name || '_kept', p_from, p_to);
    execute format('alter table watchpump.%I attach partition watchpump.%I for values from (%L) to (%L)',
                   'staged_' || p_parent, v_name || '_kept', p_from, p_to);
    insert into watchpump.partitions (name, parent, from_at, to_at, staged)
    values (v_name, p_parent, p_from, p_to, true);
    return v_name;
end
$$;

-- Whether the day of `p_parent` that holds `p_at` has its kept table
-- (0017_staged_failures.sql).
create or replace function watchpump.is_staged(p_parent text, p_at timestamptz) returns boolean
language sql stable as $$
    select exists (select from watchpump.partitions p
                   where p.parent = p_parent and p.staged and p.from_at <= p_at and p.to_at > p_at)
$$;

-- Writes the failed deliveries `p_ids`, their changes and their attempts
-- into their days' kept tables (0017_staged_failures.sql), where retention
-- keeps them when the days are retired. settle() calls it for what it
-- settled as failed. Again for the same delivery (failed, retried by an
-- operator, failed again), its attempts are written afresh. A delivery
-- requeued by an operator leaves its kept table (requeue()).
create or replace function watchpump.stage_failed(p_ids bigint[]) returns void
language plpgsql as $$
begin
    -- One statement, the failed rows looked up once. The delete and the
    -- insert of attempts do not meet: the delete sees only the rows there
    -- before the statement.
    with failed as materialized (
        select s.* from watchpump.settled s where s.id = any (p_ids) and s.state = 'failed'
    ),
    rows as (
        insert into watchpump.staged_settled
        select f.* from failed f where watchpump.is_staged('settled', f.created_at)
        on conflict do nothing
    ),
    changes as (
        insert into watchpump.staged_changes
        select c.* from watchpump.changes c
        where c.id = any (array(select f.change_id from failed f))
          and watchpump.is_staged('changes', c.occurred_at)
        on conflict do nothing
    ),
    unstaged as (
        delete from watchpump.staged_attempt_log a where a.delivery_id in (select f.id from failed f)
    )
    insert into watchpump.staged_attempt_log
    select a.* from watchpump.attempt_log a
    where a.delivery_id = any (array(select f.id from failed f))
      and watchpump.is_staged('attempt_log', a.started_at);
end
$$;

-- The partitions of today and the next PARTITIONS_AHEAD = 2 days (UTC) of
-- the three tables, where missing; `watchpump migrate` and prune() call
-- it. Returns the partitions it added.
create or replace function watchpump.add_partitions_ahead() returns setof text
language plpgsql as $$
declare
    v_today  timestamptz := date_trunc('day', now() at time zone 'UTC') at time zone 'UTC';
    v_day    timestamptz;
    v_parent text;
begin
    -- prune()'s lock: one maker of partitions at a time.
    perform pg_advisory_xact_lock(watchpump.lock_class(), hashtext('watchpump.prune'));
    for v_day in select generate_series(v_today, v_today + interval '2 days', interval '1 day') loop
        foreach v_parent in array array['changes', 'settled', 'attempt_log'] loop
            if not exists (select from watchpump.partitions p
                           where p.parent = v_parent and p.from_at <= v_day and p.to_at > v_day) then
                return next watchpump.add_partition(v_parent, v_day, v_day + interval '1 day');
            end if;
        end loop;
    end loop;
end
$$;

-- The rows of a partition, as the planner's statistics have them
-- (pg_class.reltuples): counting a retired day exactly would cost what
-- dropping it saves. Counted when it was never analyzed (small, then).
create or replace function watchpump.partition_rows(p_name text) returns bigint
language plpgsql stable as $$
declare
    v_rows bigint;
begin
    select c.reltuples::bigint into v_rows from pg_class c
    where c.oid = ('watchpump.' || quote_ident(p_name))::regclass;
    if v_rows < 0 then
        execute format('select count(*) from watchpump.%I', p_name) into v_rows;
    end if;
    return v_rows;
end
$$;

-- Retires the partitions of all three tables that end at `p_to` (one day,
-- or the v2 tables), returning what went (deliveries and changes estimated
-- from the statistics) and what stayed:
--   - a day's partitions: what retention still keeps of them (failed
--     deliveries within the failed retention, deliveries that finished
--     within the retention because someone retried them, and the changes
--     and attempts those and the queue refer to) is written to a small
--     partition of its own per table, `<day>_kept`, which replaces the day
--     (keep_what_retention_keeps());
--   - kept partitions, once past the failed retention: what is still kept
--     goes to the DEFAULT partitions (retire_into_default()).
create or replace function watchpump.retire_partitions(
    p_to timestamptz, p_retention interval, p_failed_retention interval,
    out deliveries bigint, out failed bigint, out changes bigint, out kept bigint
)
language plpgsql as $$
begin
    -- Every row of the range, before anything is locked: the functions
    -- below check each name again where they use it.
    perform watchpump.partition_checked(p) from watchpump.partitions p where p.to_at = p_to;
    if exists (select from watchpump.partitions p where p.to_at = p_to and p.kept) then
        select * into deliveries, failed, changes, kept
        from watchpump.retire_into_default(p_to, p_retention, p_failed_retention);
    else
        select * into deliveries, failed, changes, kept
        from watchpump.keep_what_retention_keeps(p_to, p_retention, p_failed_retention);
    end if;
end
$$;

-- Retires a day (or the v2 tables) whose every delivery is past retention
-- without holding up emit() or the pump while rows are copied:
--   1. Under SHARE locks on the day's settled and changes partitions only
--      (they stop the rare writes into an old day: a retried delivery
--      settling back), what retention keeps of them is gathered in
--      `<day>_kept` tables:
--      - a day made with its kept tables (`partitions.staged`) has them
--        already, holding its failures, their changes and attempts, written
--        when they failed (stage_failed()). Once a count through the partial
--        failed index shows that none is missing, only the deliveries kept
--        for another reason are added: those that finished within the
--        retention because an operator retried them, and the changes and
--        attempts the queue still needs. The day's rows are not read, so
--        the cost does not grow with the day (keep_staged());
--      - other days are copied: those made before 0017_staged_failures.sql,
--        or whose failures did not all go through settle() (one set by
--        hand, or one that failed in the DEFAULT partition before its day
--        was made and was moved into it): about 5% of a day with one
--        failure in 20, found on every page of the day
--        (copy_what_retention_keeps()).
--   2. Then, under ACCESS EXCLUSIVE locks on the three tables (and their
--      staged_* tables): the kept attempts of deliveries queued or settled
--      meanwhile are copied again (few: retried deliveries only), and each
--      day partition is detached and dropped, and its kept table, when it
--      holds rows, attached for the same range (its CHECK constraint spares
--      a scan; PostgreSQL scans the DEFAULT partition for rows of the
--      range, and it is small).
-- A kept partition stays until the failed retention passes
-- (retire_into_default()). Failures therefore never pin a whole day, and
-- are never copied row by row under a lock.
create or replace function watchpump.keep_what_retention_keeps(
    p_to timestamptz, p_retention interval, p_failed_retention interval,
    out deliveries bigint, out failed bigint, out changes bigint, out kept bigint
)
language plpgsql as $$
declare
    v_from     timestamptz;
    v_settled  text;
    v_changes  text;
    v_attempts text;
    v_staged   boolean;
    v_part     record;
    v_bound    text;
    v_copied   bigint;
    v_ids      bigint[];
    v_copy_from timestamptz;
    v_recopied bigint;
    v_counts   jsonb;
begin
    select min(p.from_at),
           min(watchpump.partition_checked(p)) filter (where p.parent = 'settled'),
           min(watchpump.partition_checked(p)) filter (where p.parent = 'changes'),
           min(watchpump.partition_checked(p)) filter (where p.parent = 'attempt_log'),
           bool_and(p.staged)
    into v_from, v_settled, v_changes, v_attempts, v_staged
    from watchpump.partitions p where p.to_at = p_to and not p.kept;
    deliveries := 0; failed := 0; changes := 0; kept := 0;
    if v_from is null then
        return;
    end if;

    -- 1. The kept rows gathered, emit() and the pump going on.
    for v_part in
        select watchpump.partition_checked(p) as name from watchpump.partitions p
        where p.to_at = p_to and not p.kept and p.parent in ('settled', 'changes')
    loop
        execute format('lock table watchpump.%I in share mode', v_part.name);
    end loop;
    if v_settled is not null then
        execute format('select count(*) from watchpump.%I where state = ''failed'' and finished_at < $1', v_settled)
            into failed using now() - p_failed_retention;
    end if;
    v_staged := v_staged and v_settled is not null and v_changes is not null and v_attempts is not null;
    if v_staged then
        -- Every failure kept is in the kept table (a failure written by
        -- hand, not through settle(), is not).
        execute format('select (select count(*) from watchpump.%1$I where state = ''failed'' and finished_at >= $1)
                               = (select count(*) from watchpump.%2$I where state = ''failed'' and finished_at >= $1)',
                       v_settled, v_settled || '_kept')
            into v_staged using now() - p_failed_retention;
    end if;
    if not v_staged then
        -- The kept tables made with the day, if any, give way to copies.
        for v_part in
            select watchpump.partition_checked(p) as name, p.parent from watchpump.partitions p
            where p.to_at = p_to and not p.kept and p.staged
        loop
            execute format('alter table watchpump.%I detach partition watchpump.%I',
                           'staged_' || v_part.parent, v_part.name || '_kept');
            execute format('drop table watchpump.%I', v_part.name || '_kept');
        end loop;
    end if;
    v_copy_from := clock_timestamp();
    if v_staged then
        v_counts := watchpump.keep_staged(v_settled, v_changes, v_attempts, v_from, p_to,
                                          p_retention, p_failed_retention);
    else
        v_counts := watchpump.copy_what_retention_keeps(v_settled, v_changes, v_attempts, v_from, p_to,
                                                        p_retention, p_failed_retention);
    end if;
    kept := coalesce((v_counts ->> 'settled')::bigint, 0);
    if v_settled is not null then
        deliveries := greatest(watchpump.partition_rows(v_settled) - failed - kept, 0);
    end if;
    if v_changes is not null then
        changes := greatest(watchpump.partition_rows(v_changes) - (v_counts ->> 'changes')::bigint, 0);
    end if;

    -- 2. The swap. All three tables at once, before anything else: the
    -- pump locks them in another order (attempt_log, then settled), and
    -- taking them one by one could deadlock with it. The caller's
    -- lock_timeout bounds the wait.
    lock table watchpump.settled, watchpump.changes, watchpump.attempt_log,
               watchpump.staged_settled, watchpump.staged_changes, watchpump.staged_attempt_log
        in access exclusive mode;
    if v_attempts is not null then
        -- The deliveries whose attempts may have changed since the copy:
        -- queued ones, and ones settled since a little before it began
        -- (a complete() that started before the copy may commit after).
        v_ids := array(select q.id from watchpump.queue q where q.created_at < p_to
                       union
                       select s.id from watchpump.settled s
                       where s.created_at < p_to and s.finished_at >= v_copy_from - interval '10 minutes');
        execute format('delete from watchpump.%I where delivery_id = any ($1)', v_attempts || '_kept')
            using v_ids;
        get diagnostics v_recopied = row_count;
        v_copied := (v_counts ->> 'attempt_log')::bigint - v_recopied;
        execute format('insert into watchpump.%I select * from watchpump.%I where delivery_id = any ($1)',
                       v_attempts || '_kept', v_attempts)
            using v_ids;
        get diagnostics v_recopied = row_count;
        v_counts := v_counts || jsonb_build_object('attempt_log', v_copied + v_recopied);
    end if;
    v_bound := case when v_from = '-infinity' then 'minvalue' else quote_literal(v_from) end;
    for v_part in
        select watchpump.partition_checked(p) as name, p.parent from watchpump.partitions p
        where p.to_at = p_to and not p.kept
    loop
        execute format('alter table watchpump.%I detach partition watchpump.%I', v_part.parent, v_part.name);
        execute format('drop table watchpump.%I', v_part.name);
        delete from watchpump.partitions p where p.name = v_part.name;
        if v_staged then
            execute format('alter table watchpump.%I detach partition watchpump.%I',
                           'staged_' || v_part.parent, v_part.name || '_kept');
        end if;
        if coalesce((v_counts ->> v_part.parent)::bigint, 0) > 0 then
            execute format('alter table watchpump.%I attach partition watchpump.%I for values from (%s) to (%L)',
                           v_part.parent, v_part.name || '_kept', v_bound, p_to);
            execute format('alter table watchpump.%I drop constraint %I',
                           v_part.name || '_kept', v_part.name || '_kept_range');
            insert into watchpump.partitions (name, parent, from_at, to_at, kept)
            values (v_part.name || '_kept', v_part.parent, v_from, p_to, true);
        elsif v_counts ? v_part.parent then
            execute format('drop table watchpump.%I', v_part.name || '_kept');
        end if;
    end loop;
end
$$;

-- The changes that the kept deliveries of the day [p_from, p_to) need:
-- those of the kept table `p_kept`, of queued deliveries, and of the
-- DEFAULT partition's deliveries of the day.
create or replace function watchpump.changes_to_keep(p_kept text, p_from timestamptz, p_to timestamptz)
returns bigint[]
language plpgsql as $$
declare
    v_ids bigint[];
begin
    execute format('select array(select k.change_id from watchpump.%I k
                                 union
                                 select q.change_id from watchpump.queue q where q.created_at < $1
                                 union
                                 select d.change_id from watchpump.settled_kept d
                                 where d.created_at >= $2 and d.created_at < $1)', p_kept)
        into v_ids using p_to, p_from;
    return v_ids;
end
$$;

-- The deliveries whose attempts of the day [p_from, p_to) are kept: those
-- of the kept table `p_kept` (its failures too, unless p_with_failed is
-- false: written with them as they failed), of the DEFAULT partition's
-- deliveries of the day, of earlier days' deliveries that went on into
-- it, and of queued ones.
create or replace function watchpump.attempts_to_keep(
    p_kept text, p_from timestamptz, p_to timestamptz, p_with_failed boolean
) returns bigint[]
language plpgsql as $$
declare
    v_ids bigint[];
begin
    execute format('select array(select k.id from watchpump.%I k where $3 or k.state <> ''failed''
                                 union
                                 select d.id from watchpump.settled_kept d
                                 where d.created_at >= $2 and d.created_at < $1
                                 union
                                 select s.id from watchpump.settled s
                                 where s.created_at < $2 and s.finished_at >= $2
                                 union
                                 select q.id from watchpump.queue q where q.created_at < $1)', p_kept)
        into v_ids using p_to, p_from, p_with_failed;
    return v_ids;
end
$$;

-- Step 1 of keep_what_retention_keeps() for a day whose kept tables hold
-- its failures already: adds what retention keeps besides them, returns
-- the rows each kept table holds ({"settled": n, "changes": n,
-- "attempt_log": n}). Reads the day's partitions only through indexes,
-- for the few rows it adds.
create or replace function watchpump.keep_staged(
    p_settled text, p_changes text, p_attempts text, p_from timestamptz, p_to timestamptz,
    p_retention interval, p_failed_retention interval
) returns jsonb
language plpgsql as $$
declare
    v_ids    bigint[];
    v_counts jsonb := '{}';
    v_rows   bigint;
begin
    -- Deliveries: failures past the failed retention go (a failed
    -- retention shorter than the retention); the deliveries that finished
    -- within the retention (retried) come, through the BRIN on finished_at.
    execute format('delete from watchpump.%I where state = ''failed'' and finished_at < $1', p_settled || '_kept')
        using now() - p_failed_retention;
    execute format('insert into watchpump.%I select * from watchpump.%I
                    where finished_at >= $1 and state <> ''failed'' on conflict do nothing',
                   p_settled || '_kept', p_settled)
        using now() - p_retention;
    execute format('select count(*) from watchpump.%I', p_settled || '_kept') into v_rows;
    v_counts := v_counts || jsonb_build_object('settled', v_rows);

    -- Changes a delivery still needs that the kept table lacks: those of
    -- the deliveries added above, of queued ones, of the DEFAULT partition.
    execute format('select array(select unnest($1) except select c.id from watchpump.%I c)', p_changes || '_kept')
        into v_ids using watchpump.changes_to_keep(p_settled || '_kept', p_from, p_to);
    execute format('insert into watchpump.%I select * from watchpump.%I where id = any ($1) on conflict do nothing',
                   p_changes || '_kept', p_changes)
        using v_ids;
    execute format('select count(*) from watchpump.%I', p_changes || '_kept') into v_rows;
    v_counts := v_counts || jsonb_build_object('changes', v_rows);

    -- Attempts of every kept delivery that did not fail (theirs were not
    -- written when they failed), of earlier days' deliveries that went on
    -- into this day, and of queued ones: written afresh.
    v_ids := watchpump.attempts_to_keep(p_settled || '_kept', p_from, p_to, false);
    execute format('delete from watchpump.%I where delivery_id = any ($1)', p_attempts || '_kept') using v_ids;
    execute format('insert into watchpump.%I select * from watchpump.%I where delivery_id = any ($1)',
                   p_attempts || '_kept', p_attempts)
        using v_ids;
    execute format('select count(*) from watchpump.%I', p_attempts || '_kept') into v_rows;
    return v_counts || jsonb_build_object('attempt_log', v_rows);
end
$$;

-- Step 1 of keep_what_retention_keeps() for a day without kept tables
-- made with it: copies what retention keeps of it into new `<day>_kept`
-- tables (make_partition_table()), returns the rows each holds (as
-- keep_staged()). The day's kept attempts are copied too, without a lock
-- on attempt_log, because the attempt rows of a settled delivery never
-- change (complete() folds only into the rows of a delivery it holds);
-- those of queued deliveries, or of deliveries settled while this ran, are
-- copied again under the caller's lock.
create or replace function watchpump.copy_what_retention_keeps(
    p_settled text, p_changes text, p_attempts text, p_from timestamptz, p_to timestamptz,
    p_retention interval, p_failed_retention interval
) returns jsonb
language plpgsql as $$
declare
    v_kept   text := coalesce(p_settled || '_kept', 'settled_kept');
    v_ids    bigint[];
    v_counts jsonb := '{}';
begin
    if p_settled is not null then
        -- Through the partial failed index and the BRIN on finished_at.
        v_counts := v_counts || jsonb_build_object('settled', watchpump.make_partition_table(
            'settled', p_settled || '_kept', p_from, p_to, 'insert into watchpump.%I ' || format(
            'select * from watchpump.%1$I where state = ''failed'' and finished_at >= %2$L
             union all
             select * from watchpump.%1$I where finished_at >= %3$L and state <> ''failed''',
            p_settled, now() - p_failed_retention, now() - p_retention)));
    end if;
    -- Changes (and, below, attempts) that a delivery still needs: one kept
    -- of the day, a queued one, one in the DEFAULT partition of the same
    -- day, and (attempts only) an earlier day's kept one retried into it.
    if p_changes is not null then
        -- An array, so that the index is probed in key order (the heap in
        -- physical order): a third of the time of a join in hash order.
        v_ids := watchpump.changes_to_keep(v_kept, p_from, p_to);
        v_counts := v_counts || jsonb_build_object('changes', watchpump.make_partition_table(
            'changes', p_changes || '_kept', p_from, p_to,
            'insert into watchpump.%I ' || format('select * from watchpump.%I where id = any ($1)', p_changes),
            v_ids));
    end if;
    if p_attempts is not null then
        v_ids := watchpump.attempts_to_keep(v_kept, p_from, p_to, true);
        v_counts := v_counts || jsonb_build_object('attempt_log', watchpump.make_partition_table(
            'attempt_log', p_attempts || '_kept', p_from, p_to,
            'insert into watchpump.%I ' || format('select * from watchpump.%I where delivery_id = any ($1)',
                                                  p_attempts),
            v_ids));
    end if;
    return v_counts;
end
$$;

-- Retires the kept partitions (keep_what_retention_keeps()) that end at
-- `p_to`, past the failed retention: what retention still keeps (rows an
-- operator retried late) is copied to the DEFAULT
-- partitions (`*_kept`) first: failed deliveries within the failed
-- retention, deliveries that finished within the retention (retried late),
-- and the changes and attempts those, and the queue, still refer to. Then
-- the partitions are detached and dropped whole: the cost does not grow
-- with the rows removed. Detaching locks each parent for a moment (ACCESS
-- EXCLUSIVE); the caller's lock_timeout bounds the wait. Returns what went
-- (deliveries and changes estimated from the statistics), what stayed.
create or replace function watchpump.retire_into_default(
    p_to timestamptz, p_retention interval, p_failed_retention interval,
    out deliveries bigint, out failed bigint, out changes bigint, out kept bigint
)
language plpgsql as $$
declare
    v_settled  text;
    v_changes  text;
    v_attempts text;
    v_kept     bigint[];
    v_refs     bigint[];
begin
    select min(watchpump.partition_checked(p)) filter (where p.parent = 'settled'),
           min(watchpump.partition_checked(p)) filter (where p.parent = 'changes'),
           min(watchpump.partition_checked(p)) filter (where p.parent = 'attempt_log')
    into v_settled, v_changes, v_attempts
    from watchpump.partitions p where p.to_at = p_to;

    deliveries := 0; failed := 0; changes := 0; kept := 0;
    -- All three at once, before anything else: the pump locks them in
    -- another order (attempt_log, then settled), and taking them one by one
    -- could deadlock with it. The caller's lock_timeout bounds the wait.
    lock table watchpump.settled, watchpump.changes, watchpump.attempt_log in access exclusive mode;
    if v_settled is not null then
        -- Kept, through the partial failed index and the BRIN on finished_at.
        execute format('select array(select id from watchpump.%1$I where state = ''failed'' and finished_at >= $1
                                     union all
                                     select id from watchpump.%1$I where finished_at >= $2 and state <> ''failed'')',
                       v_settled)
            into v_kept using now() - p_failed_retention, now() - p_retention;
        execute format('select count(*) from watchpump.%I where state = ''failed'' and finished_at < $1', v_settled)
            into failed using now() - p_failed_retention;
        deliveries := watchpump.partition_rows(v_settled);
        kept := cardinality(v_kept);
        deliveries := greatest(deliveries - failed - kept, 0);
        execute format('alter table watchpump.settled detach partition watchpump.%I', v_settled);
        execute format('insert into watchpump.settled select * from watchpump.%I where id = any ($1)', v_settled)
            using v_kept;
        execute format('drop table watchpump.%I', v_settled);
    end if;
    if v_changes is not null then
        v_refs := array(select k.change_id from watchpump.settled_kept k where k.created_at < p_to
                        union
                        select q.change_id from watchpump.queue q where q.created_at < p_to);
        changes := watchpump.partition_rows(v_changes);
        execute format('alter table watchpump.changes detach partition watchpump.%I', v_changes);
        execute format('insert into watchpump.changes select * from watchpump.%I where id = any ($1)', v_changes)
            using v_refs;
        execute format('drop table watchpump.%I', v_changes);
    end if;
    if v_attempts is not null then
        v_refs := array(select k.id from watchpump.settled_kept k where k.created_at < p_to
                        union
                        select q.id from watchpump.queue q where q.created_at < p_to);
        execute format('alter table watchpump.attempt_log detach partition watchpump.%I', v_attempts);
        execute format('insert into watchpump.attempt_log select * from watchpump.%I where delivery_id = any ($1)',
                       v_attempts)
            using v_refs;
        execute format('drop table watchpump.%I', v_attempts);
    end if;
    delete from watchpump.partitions p where p.to_at = p_to;
end
$$;

-- How long after its end a partition is retired: a day once its every
-- delivery is past retention (its deadline, then the retention), a kept
-- partition once its failures are past the failed retention too.
create or replace function watchpump.retention_of(p_kept boolean, p_retention interval, p_failed_retention interval)
returns interval
language sql stable as $$
    select case when p_kept then greatest(p_retention, p_failed_retention) else p_retention end
           + watchpump.delivery_window()
$$;

-- Applies retention, one step per call; call it again while it returns
-- `more` (the pump's operator task does, once a minute, in one pump at a
-- time; it is safe by hand too: a second caller meanwhile does nothing).
--   1. Creates the partitions of today and the next PARTITIONS_AHEAD = 2
--      days, so that rows always have a day to go to.
--   2. Retires the oldest day whose every delivery is past retention: it
--      ended more than p_retention plus the delivery window ago
--      (retire_partitions(): whole partitions dropped; failed deliveries
--      and their needs kept in a small `<day>_kept` partition, built
--      before the day is locked), or the oldest kept partition past the
--      failed retention (what is still kept goes to the DEFAULT ones).
--   3. Deletes, p_batch rows at a time, from the DEFAULT partitions (the
--      kept rows, few): delivered, superseded and dropped deliveries
--      finished more than p_retention ago, failed ones more than
--      p_failed_retention ago, their attempts and actions, and changes
--      past retention that nothing refers to any more.
--   4. Watches removed long ago, finished warnings past the failed
--      retention, and expired panel sessions.
-- Counts of a retired day are the planner's estimates (pg_class.reltuples):
-- counting them exactly would cost what dropping them saves.
create or replace function watchpump.prune(
    p_retention interval default interval '7 days',
    p_failed_retention interval default interval '30 days',
    p_batch integer default 500
) returns table (deliveries integer, failed integer, changes integer, more boolean)
language plpgsql as $$
declare
    v_oldest   timestamptz;
    v_retired  record;
    v_more_to_do boolean := false;
    v_done     bigint := 0;
    v_failed   bigint := 0;
    v_changes  bigint := 0;
    v_count    integer;
    v_gone     bigint[];
    v_touched  bigint[];
begin
    if p_batch is null or p_batch < 1 or p_retention is null or p_failed_retention is null then
        raise exception 'watchpump.prune: retention periods and a batch size above zero are required'
            using errcode = '22023';
    end if;
    -- One caller at a time (the operator task already runs in one pump).
    if not pg_try_advisory_xact_lock(watchpump.lock_class(), hashtext('watchpump.prune')) then
        return query select 0, 0, 0, false;
        return;
    end if;
    -- Creating and dropping partitions needs strong locks on the tables
    -- the pump and emit() use. Waiting for them behind a long transaction
    -- would make every emit() wait behind us, and the pump takes its locks
    -- in another order: lock_timeout (100 ms) stays below deadlock_timeout
    -- (1 s by default), so prune() gives up first, never the pump, and
    -- tries again at the next round.
    set local lock_timeout = '100ms';

    -- 1. Days ahead.
    begin
        perform watchpump.add_partitions_ahead();
    exception when lock_not_available then
        null;
    end;

    -- 2. The oldest day past retention, whole.
    select min(p.to_at) into v_oldest from watchpump.partitions p
    where p.to_at < now() - watchpump.retention_of(p.kept, p_retention, p_failed_retention);
    if v_oldest is not null then
        begin
            select * into v_retired from watchpump.retire_partitions(v_oldest, p_retention, p_failed_retention);
            v_done := v_retired.deliveries;
            v_failed := v_retired.failed;
            v_changes := v_retired.changes;
            v_more_to_do := exists (select from watchpump.partitions p
                                    where p.to_at < now() - watchpump.retention_of(p.kept, p_retention,
                                                                                   p_failed_retention));
        exception when lock_not_available then
            null;  -- busy: the next round retires it
        end;
    end if;

    -- 3. The kept rows, in batches.
    with gone as (
        delete from watchpump.settled_kept d
        where d.id = any (array(
                  select f.id from watchpump.settled_kept f
                  where f.finished_at < now() - p_retention
                    and (f.state <> 'failed' or f.finished_at < now() - p_failed_retention)
                  limit p_batch))
        returning d.id, d.change_id, d.state
    )
    select array_agg(g.id), array_agg(distinct g.change_id),
           coalesce(v_done, 0) + count(*) filter (where g.state <> 'failed'),
           coalesce(v_failed, 0) + count(*) filter (where g.state = 'failed')
    into v_gone, v_touched, v_done, v_failed
    from gone g;
    v_more_to_do := v_more_to_do or coalesce(cardinality(v_gone), 0) = p_batch;
    delete from watchpump.attempt_log a where a.delivery_id = any (coalesce(v_gone, '{}'));
    delete from watchpump.actions x where x.delivery_id = any (coalesce(v_gone, '{}'));
    -- Actions of deliveries that went with a retired day.
    delete from watchpump.actions x
    where x.id = any (array(
              select o.id from watchpump.actions o
              where o.at < now() - p_retention
                and not exists (select 1 from watchpump.settled d where d.id = o.delivery_id)
                and not exists (select 1 from watchpump.queue q where q.id = o.delivery_id)
              limit p_batch));
    -- Kept changes nothing refers to any more (a change past retention
    -- that matched no watch went with its day; these are the ones kept
    -- for a kept delivery, or emitted while no partition covered them).
    delete from watchpump.changes_kept c
    where c.id = any (array(
              select o.id from watchpump.changes_kept o
              where o.occurred_at < now() - p_retention
                and not exists (select 1 from watchpump.settled d where d.change_id = o.id)
                and not exists (select 1 from watchpump.queue q where q.change_id = o.id)
              limit p_batch));
    get diagnostics v_count = row_count;
    v_changes := v_changes + v_count;
    v_more_to_do := v_more_to_do or v_count = p_batch;

    -- 4. Removed watches, once their deliveries are past both retentions.
    delete from watchpump.watches w
    where w.id = any (array(
              select o.id from watchpump.watches o
              where o.removed_at < now() - greatest(p_retention, p_failed_retention)
                and not exists (select 1 from watchpump.queue q where q.watch_id = o.id)
              limit p_batch));

    -- Removed watches that never had a delivery, after the shorter
    -- retention (issue 17: create/delete churn kept about 20M removed rows a
    -- day for 30 days). A watch on an exact object had one only if a change
    -- of that object occurred while it was live, and a change outlives its
    -- deliveries; the hour covers an emit() that saw the watch live just
    -- before its removal. (Prefix watches wait for both retentions.)
    delete from watchpump.watches w
    where w.id = any (array(
              select o.id from watchpump.watches o
              where o.removed_at < now() - p_retention
                and right(o.object, 1) <> '/'
                and not exists (select 1 from watchpump.changes c
                                where c.object = o.object
                                  and c.occurred_at >= o.created_at
                                  and c.occurred_at <= o.removed_at + interval '1 hour')
                and not exists (select 1 from watchpump.queue q where q.watch_id = o.id)
              limit p_batch));

    delete from watchpump.warnings w
    where w.id = any (array(
              select o.id from watchpump.warnings o
              where o.state <> 'pending' and o.finished_at < now() - p_failed_retention
              limit p_batch));
    delete from watchpump.panel_sessions p where p.expires_at < now();

    return query select least(v_done, 2147483647)::integer, least(v_failed, 2147483647)::integer,
                        least(v_changes, 2147483647)::integer, v_more_to_do;
end
$$;
