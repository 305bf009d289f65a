-- A time window's page, a bounded scan at any history size (issue 18).
--
-- A narrow window (src/operator/store.rs, NARROW_WINDOW: two hours at
-- most) read every delivery in it through settled's (created_at) index,
-- then kept the newest ids: about 104,000 rows for an hour of a day of
-- 2.5 M deliveries (50-100 ms). It now walks the window minute by minute,
-- and in each minute the newest ids first, through an index on (the
-- minute, id), stopping after a page in each: at most a page a minute,
-- however busy the minute. The index replaces (created_at), which nothing
-- else reads, so a delivery settles with as many index writes as before.
-- It includes created_at, so that the walk reads no table row.
--
-- date_bin() rather than date_trunc(): date_trunc() of a timestamptz
-- depends on the session's time zone and cannot be indexed.

update watchpump.partition_templates
set indexes = array_replace(indexes, 'create index on watchpump.%I (created_at)',
                            'create index on watchpump.%I (date_bin(''1 minute'', created_at, ''2000-01-01 00:00:00+00''::timestamptz), id) include (created_at)')
where parent = 'settled';

-- The partitions already there (the days, the kept ones and the DEFAULT
-- one; the v2 table never had the created_at index): about a second per
-- million deliveries, locking that partition against writes meanwhile.
do $window$
declare
    p record;
    v_index regclass;
begin
    for p in
        select c.oid::regclass as partition, c.relname
        from pg_inherits h
        join pg_class c on c.oid = h.inhrelid
        where h.inhparent = 'watchpump.settled'::regclass
          and c.relname !~ '_v2$'
    loop
        execute format('create index on watchpump.%I (date_bin(''1 minute'', created_at, ''2000-01-01 00:00:00+00''::timestamptz), id) include (created_at)',
                       p.relname);
        for v_index in
            select i.indexrelid::regclass from pg_index i
            where i.indrelid = p.partition
              and pg_get_indexdef(i.indexrelid) like '% USING btree (created_at)'
        loop
            execute format('drop index %s', v_index);
        end loop;
    end loop;
end
$window$;
