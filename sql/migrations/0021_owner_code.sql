-- No SQL text from tables in owner code (issue 34, item 1).
--
-- prune() runs as the schema's owner (SECURITY DEFINER) and made each day's
-- partitions from watchpump.partition_templates: it executed the template's
-- storage settings and every entry of its `indexes` as SQL. A role granted
-- watchpump_pump could write that table, and so run any statement as the
-- owner (a `COPY ... TO PROGRAM`, an `ALTER ROLE ... SUPERUSER`) at the
-- pump's next daily maintenance. The settings and indexes are now written
-- in make_partition_table()'s body (0300_operator.sql), and the table goes.
--
-- Retention also locks, detaches and drops the tables that the rows of
-- watchpump.partitions name. Only the owner may write that table now
-- (sql/roles.sql); the constraints below hold the shape watchpump gives
-- the names, and retention checks each name again before it uses it
-- (partition_checked(), 0300_operator.sql).

-- A row watchpump did not write stops the migration here, named, rather
-- than as a bare violation of the constraints below: it was written by
-- someone who could write the table before this migration (a pump's role).
do $check$
declare
    v_rows text;
begin
    select string_agg(format('%L (parent %L, from %s, to %s, kept %s)', p.name, p.parent, p.from_at, p.to_at, p.kept),
                      '; ' order by p.name)
    into v_rows
    from watchpump.partitions p
    where p.parent not in ('changes', 'settled', 'attempt_log')
       or p.name is distinct from
          p.parent || case when p.from_at = '-infinity' then '_v2'
                           else '_' || to_char(p.from_at at time zone 'UTC', 'YYYYMMDD') end
                   || case when p.kept then '_kept' else '' end
       or not p.to_at > p.from_at;
    if v_rows is not null then
        raise exception 'watchpump.partitions has rows watchpump did not write: %', v_rows
            using errcode = '42602',
                  hint = 'A role that could write the table (before this migration, every role granted '
                         'watchpump_pump could) wrote them, and retention would have locked, detached and '
                         'dropped the tables they name as the owner. Find out who; delete the rows; migrate again.';
    end if;
end
$check$;

alter table watchpump.partitions drop constraint partitions_parent_fkey;
drop table watchpump.partition_templates;

alter table watchpump.partitions
    add constraint partitions_parent_check check (parent in ('changes', 'settled', 'attempt_log')),
    -- The exact name (its day) is partition_checked()'s to prove: a CHECK
    -- constraint should hold for a row whatever the session's settings,
    -- and to_char() is not immutable.
    add constraint partitions_name_shape check (name ~ ('^' || parent || '_([0-9]{8}|v2)(_kept)?$')),
    add constraint partitions_range_forwards check (to_at > from_at);
