-- Only the indexes the reads need on the history (issue 18). Each index on
-- settled, attempt_log and changes, and what uses it:
--
-- changes
--   (id)                  a delivery's change: delivery_log and
--                         delivery_history (a lateral lookup in the
--                         change's day), message(), claim()
-- settled
--   (id)                  every page newest first, a delivery by id (the
--                         panel, the admin API, retry(), redeliver()), what
--                         retirement keeps of a day
--   (change_id)           prune(): kept changes that no delivery refers to
--   (service_id, id)      a service's page (admin API, consumer API)
--   (object, id)          an object's page; newer_news() (the order rule of
--                         retry() and redeliver())
--   (created_at)          NEW: a narrow time window's page (src/operator/
--                         store.rs NARROW_WINDOW); the id walk it replaced
--                         read up to a day of rows (40-270 ms at 5 M)
--   failed: (service_id, id)         a service's failed page,
--                                    retry_failed(), backlog's last failure
--   failed or dropped: (id)          the failed (or dropped) page of all
--                                    services
--   failed: (finished_at) include (service_id)
--                         REPLACES (finished_at): newest failures (panel),
--                         failures in the last 24 hours (backlog, the
--                         metrics' backlog_counts(), what retirement keeps):
--                         with service_id in the index, counting a day's
--                         failures is an index-only scan (75 ms -> 1.5 ms
--                         for 10,800 failures at 5 M)
--   brin (finished_at)    retirement: a day's rows finished late (kept)
-- attempt_log
--   (delivery_id, attempt)   a delivery's attempts; complete() folding a
--                            repeated failure into the last row
--   (id)                  DROPPED: no read looks an attempt up by id alone
--                         (complete() now finds the row it folds into by
--                         delivery first)
--
-- Partitions made from now on take their indexes from the templates; the
-- days (and the DEFAULT partitions) already there are changed here. The
-- v2 tables attached by 0008 keep the indexes they had, until retention
-- drops them. The new indexes are built here on each day already there:
-- about a second per million deliveries, locking that day against writes
-- meanwhile (the pump writes today's).

update watchpump.partition_templates
set indexes = array['create unique index on watchpump.%I (id)',
                    'create index on watchpump.%I (change_id)',
                    'create index on watchpump.%I (service_id, id)',
                    'create index on watchpump.%I (object, id)',
                    'create index on watchpump.%I (created_at)',
                    'create index on watchpump.%I (service_id, id) where state = ''failed''',
                    'create index on watchpump.%I (id) where state in (''failed'', ''dropped'')',
                    'create index on watchpump.%I (finished_at) include (service_id) where state = ''failed''',
                    'create index on watchpump.%I using brin (finished_at)']
where parent = 'settled';

update watchpump.partition_templates
set indexes = array['create index on watchpump.%I (delivery_id, attempt)']
where parent = 'attempt_log';

do $indexes$
declare
    p record;
    v_index regclass;
begin
    for p in
        select c.oid::regclass as partition, c.relname, h.inhparent::regclass::text as parent
        from pg_inherits h
        join pg_class c on c.oid = h.inhrelid
        where h.inhparent in ('watchpump.settled'::regclass, 'watchpump.attempt_log'::regclass)
          and c.relname !~ '_v2$'
    loop
        if p.parent = 'watchpump.settled' then
            execute format('create index on watchpump.%I (created_at)', p.relname);
            execute format('create index on watchpump.%I (finished_at) include (service_id) where state = ''failed''',
                           p.relname);
        end if;
        for v_index in
            select i.indexrelid::regclass from pg_index i
            where i.indrelid = p.partition
              and pg_get_indexdef(i.indexrelid) like any (array[
                      '% USING btree (finished_at) WHERE (state = ''failed''::text)',
                      case when p.parent = 'watchpump.attempt_log' then '% USING btree (id)' end])
        loop
            execute format('drop index %s', v_index);
        end loop;
    end loop;
end
$indexes$;
