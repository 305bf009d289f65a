-- No id or sequence handed out twice after a failover (issue 36).
--
-- After an asynchronous failover the new primary has not seen the last
-- transactions of the old one: its sequences and objects' counters stand
-- where the standby's copy of them stood, and would hand out again change
-- ids, delivery ids (a delivery's webhook-id) and per-object sequences the
-- old primary had already sent. A consumer that de-duplicates by
-- webhook-id, or keeps the newest sequence of an object, would then drop
-- new news as news it has seen.
--
-- Each promotion starts a new timeline, and every id and sequence made on
-- timeline T is at least floor(T) = (T - first) * 2^40, where first is the
-- timeline this database was installed on (so a new install starts at 1,
-- whatever its cluster's history): ids are nextval() + floor(T), and an
-- object's next sequence is at least floor(T) + 1. A timeline cannot hand
-- out 2^40 (1.1 trillion) of them, so whatever the old primary handed out
-- is below the new one's floor. No state, no lock, nothing to detect: the
-- timeline is read where each id is made (watchpump.id_floor(),
-- 0100_emit.sql), at a cost of a fraction of a microsecond.

-- The timeline this database was installed on, as a constant (the
-- floor's origin). Made here once; `watchpump migrate` never changes it.
do $first$
declare
    v_timeline integer := case when pg_is_in_recovery() then 1
                               else ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::integer end;
begin
    execute format($f$create or replace function watchpump.first_timeline() returns integer
                      language sql immutable parallel safe as 'select %s'$f$, v_timeline);
end
$first$;

-- Delivery ids above their timeline's floor, whoever queues the delivery
-- (emit(), emit_many(), ping(), resync): the column's default. The
-- function it names is made by 0100_emit.sql, applied after this file; a
-- placeholder lets the default be set now.
create or replace function watchpump.id_floor() returns bigint
language sql volatile as $$ select 0::bigint $$;
alter table watchpump.queue alter column id set default nextval('watchpump.delivery_ids') + watchpump.id_floor();
alter table watchpump.changes alter column id set default nextval('watchpump.change_ids') + watchpump.id_floor();
