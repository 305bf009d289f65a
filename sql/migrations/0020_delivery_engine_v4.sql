-- Delivery engine v4 (issue 33): a claim whose cost does not depend on the
-- backlog, claims ahead of free slots that can be given back, and the
-- pump's slots as one composite array.

-- What a pump asks of one service in a claim: how many deliveries it has
-- room for (in flight and queued ahead in the pump), and whether the
-- service is down and this is its probe. Replaces claim()'s three
-- parallel arrays.
create type watchpump.claim_slot as (
    service_id bigint,
    free       integer,
    probe      boolean
);

-- A claimed delivery a pump gives back unsent (release(), 0200_pump.sql):
-- the delivery and the attempt it was claimed for.
create type watchpump.claim_ref as (
    delivery_id bigint,
    attempt     integer
);

-- claim() takes the slots as one array of watchpump.claim_slot now
-- (0200_pump.sql creates it again).
drop function if exists watchpump.claim(text, bigint[], integer[], boolean[], integer, interval, integer, bigint);

-- Settings the producer's session cannot weaken (issue 34): strict mode and
-- the largest payload are watchpump's own, beside the delivery window,
-- written by the schema's owner only. They were session settings
-- (`alter database ... set watchpump.strict_kinds = on`), and a
-- connection's `watchpump.delivery_window` came before the table's; what
-- this database set that way is carried over, so that strict mode stays
-- on. emit() reads none of them from the session any more.
alter table watchpump.settings
    add column strict_kinds boolean not null default false,
    add column max_payload_bytes integer not null default 1048576
        check (max_payload_bytes between 1 and 16777216);
update watchpump.settings
set strict_kinds = coalesce(current_setting('watchpump.strict_kinds', true), '') in ('on', 'true', '1', 'yes'),
    max_payload_bytes = case
        when coalesce(current_setting('watchpump.max_payload_bytes', true), '') ~ '^\s*[0-9]{1,12}\s*$'
        then least(greatest(current_setting('watchpump.max_payload_bytes', true)::bigint, 1), 16777216)::integer
        else 1048576 end;
do $window$
declare
    v_text text := nullif(current_setting('watchpump.delivery_window', true), '');
begin
    if v_text is not null then
        update watchpump.settings set delivery_window = coalesce(delivery_window, v_text::interval)
        where v_text::interval > interval '0';
    end if;
exception when others then
    raise warning 'watchpump.delivery_window is %, not a positive interval: not carried over to watchpump.settings',
        quote_literal(v_text);
end
$window$;

-- One index on objects, not two (issue 33: emit()'s insert of a new object
-- wrote both): the unique index in text_pattern_ops order serves emit()'s
-- ON CONFLICT (object), the lookups by object, and resync's prefix range
-- scans (covered_objects(), 0500_consumer.sql), which the primary key's
-- default order could not. It is the replica identity in place of the key.
create unique index objects_object on watchpump.objects (object text_pattern_ops);
alter table watchpump.objects replica identity using index objects_object;
alter table watchpump.objects drop constraint objects_pkey;
drop index watchpump.objects_pattern;
