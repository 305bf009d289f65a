-- A time window's page reads the ids of every delivery created in the
-- window, then keeps the newest (src/operator/store.rs, NARROW_WINDOW).
-- With the id in the index on created_at, that read is an index-only scan
-- and no longer fetches a row of the heap per delivery: an hour of a day of
-- 2.2 M deliveries (92,000 rows) 30 -> 17 ms (issue 18). The index grows
-- from 48 to 67 MB for such a day.
--
-- The id is a key column, not INCLUDEd: a page's lookup of a row by
-- (id, created_at) may be planned on this index, and one emit() transaction
-- gives all its deliveries one created_at. As a key, the id narrows the
-- lookup to its row; included, it was a filter over every delivery of that
-- transaction.
--
-- Partitions made from now on take the index from the template; the ones
-- already there (days, kept days, DEFAULT; not the v2 tables attached by
-- 0008, which retention drops) get it here, then lose the index it
-- replaces: about a second per two million deliveries, locking that day
-- against writes meanwhile (the pump writes today's).

update watchpump.partition_templates
set indexes = array_replace(indexes, 'create index on watchpump.%I (created_at)',
                            'create index on watchpump.%I (created_at, id)')
where parent = 'settled';

do $indexes$
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
        for v_index in
            select i.indexrelid::regclass from pg_index i
            where i.indrelid = p.partition
              and pg_get_indexdef(i.indexrelid) like '% USING btree (created_at)'
        loop
            execute format('create index on watchpump.%I (created_at, id)', p.relname);
            execute format('drop index %s', v_index);
        end loop;
    end loop;
end
$indexes$;
