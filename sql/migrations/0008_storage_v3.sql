-- Storage v3 (issue 18): facts the history got wrong, made right.

-- Settings watchpump reads where it uses them, at every call, so that a
-- change reaches every running pump and producer connection at once (a
-- setting made with `alter database ... set` is read by a connection only
-- when it starts). One row.
create table watchpump.settings (
    singleton        boolean primary key default true check (singleton),
    -- How long a delivery is retried: its deadline is set to now() plus
    -- this when it is emitted (or retried by an operator). Null: 24 hours.
    delivery_window  interval check (delivery_window > interval '0')
);
insert into watchpump.settings default values;

-- An ending that an operator's retry undid stays in the history: the
-- action keeps when the delivery ended and what it said then
-- (watchpump.delivery_history shows it as its own event).
alter table watchpump.actions add column ended_at     timestamptz,
                              add column ended_detail text;

-- sweep() no longer returns expired_leases (always 0: claim() takes
-- expired leases again itself); sql/functions/ makes it again.
drop function if exists watchpump.sweep(text, interval);

-- complete() also says when a retried delivery is due (its last retry is
-- due at its deadline, which the pump's own wake-ups need to know).
drop function if exists watchpump.complete(text, bigint[], integer[], text[], integer[], text[],
                                           timestamptz[], double precision[], text[], timestamptz[]);

-- ---------------------------------------------------------------------------
-- Time-partitioned history. settled, attempt_log and changes become
-- partitioned tables, by range on the time each row's delivery story began:
--
--   changes      occurred_at  (when the change was emitted)
--   settled      created_at   (when the delivery was created; emit() gives
--                              a delivery its change's occurred_at, so a
--                              delivery and its change share a day)
--   attempt_log  started_at   (when the attempt started, never before the
--                              delivery was created)
--
-- One partition per UTC day, created ahead, plus a DEFAULT partition
-- (`*_kept`), which takes the rows retention keeps after their day's
-- partition is dropped (failed deliveries, kept longer; deliveries an
-- operator retried late; and what those need), and any row no partition
-- covers, so that emit() and settling never fail for a missing partition.
-- Retention drops whole days (watchpump.prune(), 0300_operator.sql).
--
-- The tables have no partitioned index: each partition gets its own
-- (watchpump.add_partition(), 0300_operator.sql), so that the v2 tables are
-- attached as they are, with the indexes they have, without a rebuild.
--
-- A v2 database with history keeps it in place: each old table is renamed
-- (`*_v2`) and attached as the one partition for everything before the
-- first day, after a CHECK constraint that proves its range (validated by
-- one scan, so that ATTACH need not scan again). No row is copied. It is
-- dropped by retention like a day, once its newest row is past retention.
-- A v2 database without history starts with days only.
-- ---------------------------------------------------------------------------

drop view if exists watchpump.deliveries, watchpump.attempts, watchpump.backlog,
                    watchpump.delivery_log, watchpump.delivery_history cascade;

alter table watchpump.changes rename to changes_v2;
alter index watchpump.changes_pkey rename to changes_v2_pkey;
alter table watchpump.settled rename to settled_v2;
alter index watchpump.settled_pkey rename to settled_v2_pkey;
alter index watchpump.settled_change rename to settled_v2_change;
alter index watchpump.settled_failed rename to settled_v2_failed;
alter index watchpump.settled_created_brin rename to settled_v2_created_brin;
alter index watchpump.settled_service rename to settled_v2_service;
alter index watchpump.settled_object rename to settled_v2_object;
alter index watchpump.settled_finished_brin rename to settled_v2_finished_brin;
alter table watchpump.attempt_log rename to attempt_log_v2;
alter index watchpump.attempt_log_pkey rename to attempt_log_v2_pkey;
alter index watchpump.attempt_log_delivery rename to attempt_log_v2_delivery;

-- Identity columns cannot be partitioned (before PostgreSQL 17): ids come
-- from plain sequences that go on from where the identities were.
create sequence watchpump.change_ids;
create sequence watchpump.attempt_ids;
do $ids$
declare
    v_table text;
    v_seq   text;
    v_next  bigint;
begin
    foreach v_table in array array['changes_v2', 'attempt_log_v2'] loop
        v_seq := pg_get_serial_sequence('watchpump.' || v_table, 'id');
        execute format('select case when is_called then last_value + 1 else last_value end from %s', v_seq)
            into v_next;
        execute format('alter table watchpump.%I alter column id drop identity', v_table);
        perform setval(case v_table when 'changes_v2' then 'watchpump.change_ids'
                                    else 'watchpump.attempt_ids' end, v_next, false);
    end loop;
end
$ids$;

create table watchpump.changes (
    id            bigint not null default nextval('watchpump.change_ids'),
    object        text not null,
    kind          text not null,
    sequence      bigint not null,
    payload       jsonb not null,
    occurred_at   timestamptz not null default clock_timestamp(),
    payload_bytes integer not null default 0
) partition by range (occurred_at);
alter sequence watchpump.change_ids owned by watchpump.changes.id;

create table watchpump.settled (
    id                 bigint not null,
    change_id          bigint not null,
    watch_id           bigint not null,
    service_id         bigint not null,
    object             text not null,
    state              text not null
                       constraint settled_state_check
                       check (state in ('delivered', 'superseded', 'dropped', 'failed')),
    attempts           integer not null default 0,
    next_attempt_at    timestamptz not null default now(),
    deadline           timestamptz not null,
    superseded_by      bigint,
    last_status        integer,
    last_error         text,
    created_at         timestamptz not null default clock_timestamp(),
    finished_at        timestamptz not null,
    last_started_at    timestamptz,
    last_duration_ms   double precision,
    last_response_head text,
    last_pump          text
) partition by range (created_at);

create table watchpump.attempt_log (
    id              bigint not null default nextval('watchpump.attempt_ids'),
    delivery_id     bigint not null,
    attempt         integer not null,
    started_at      timestamptz not null,
    duration_ms     double precision not null,
    status          integer,
    error           text,
    response_head   text,
    pump            text not null,
    repeats         integer not null default 1,
    last_started_at timestamptz,
    first_status    integer,
    first_error     text,
    statuses        jsonb
) partition by range (started_at);
alter sequence watchpump.attempt_ids owned by watchpump.attempt_log.id;

-- Where each partitioned table keeps its partitions' indexes and storage
-- settings: watchpump.add_partition() reads them, for the days and the
-- DEFAULT partition alike. `%I` is the partition's name.
create table watchpump.partition_templates (
    parent    text primary key,
    key       text not null,
    storage   text not null,
    indexes   text[] not null
);
insert into watchpump.partition_templates values
('changes', 'occurred_at', 'fillfactor = 100, autovacuum_vacuum_insert_scale_factor = 0.05',
 array['create unique index on watchpump.%I (id)']),
-- settled: by id (lookups, the newest page), by change (pruning kept
-- changes, newer_news()), a service's and an object's pages newest first,
-- the failed: a service's (its failed page, retry_failed(), backlog), all
-- services' newest first and by when they failed (the panel, metrics),
-- and when rows finished (what retention keeps of a day). The partial
-- indexes hold failures only: small.
('settled', 'created_at', 'fillfactor = 100, autovacuum_vacuum_insert_scale_factor = 0.05',
 array['create unique index on watchpump.%I (id)',
       'create index on watchpump.%I (change_id)',
       'create index on watchpump.%I (service_id, id)',
       'create index on watchpump.%I (object, id)',
       'create index on watchpump.%I (service_id, id) where state = ''failed''',
       'create index on watchpump.%I (id) where state in (''failed'', ''dropped'')',
       'create index on watchpump.%I (finished_at) where state = ''failed''',
       'create index on watchpump.%I using brin (finished_at)']),
('attempt_log', 'started_at', 'fillfactor = 90',
 array['create unique index on watchpump.%I (id)',
       'create index on watchpump.%I (delivery_id, attempt)']);

-- The partitions by day (and the v2 ones), which watchpump.prune() creates
-- and drops: one row each.
create table watchpump.partitions (
    name     text primary key,
    parent   text not null references watchpump.partition_templates (parent),
    from_at  timestamptz not null,
    to_at    timestamptz not null,
    unique (parent, from_at)
);

-- The DEFAULT partitions.
do $kept$
declare
    t record;
    v_index text;
begin
    for t in select * from watchpump.partition_templates loop
        execute format('create table watchpump.%I (like watchpump.%I including defaults including constraints) with (%s)',
                       t.parent || '_kept', t.parent, t.storage);
        foreach v_index in array t.indexes loop
            execute format(v_index, t.parent || '_kept');
        end loop;
        execute format('alter table watchpump.%I attach partition watchpump.%I default',
                       t.parent, t.parent || '_kept');
    end loop;
end
$kept$;

-- The v2 tables: attached as they are when they hold history, dropped when
-- empty. Their range ends at the next UTC midnight, where the days begin.
do $v2$
declare
    v_until timestamptz := date_trunc('day', now() at time zone 'UTC') at time zone 'UTC' + interval '1 day';
    t record;
    v_any boolean;
begin
    select exists (select from watchpump.changes_v2) or exists (select from watchpump.settled_v2)
           or exists (select from watchpump.attempt_log_v2)
    into v_any;
    for t in select * from watchpump.partition_templates loop
        if v_any then
            execute format('alter table watchpump.%I add constraint %I check (%I is not null and %I < %L) not valid',
                           t.parent || '_v2', t.parent || '_v2_range', t.key, t.key, v_until);
            execute format('alter table watchpump.%I validate constraint %I', t.parent || '_v2', t.parent || '_v2_range');
            execute format('alter table watchpump.%I attach partition watchpump.%I for values from (minvalue) to (%L)',
                           t.parent, t.parent || '_v2', v_until);
            insert into watchpump.partitions values (t.parent || '_v2', t.parent, '-infinity', v_until);
        else
            execute format('drop table watchpump.%I', t.parent || '_v2');
        end if;
    end loop;
end
$v2$;

-- The queue's deliveries take their change's time as their own (emit()
-- does so from now on), so that a delivery settles into its change's day.
update watchpump.queue q set created_at = c.occurred_at
from watchpump.changes c where c.id = q.change_id and q.created_at <> c.occurred_at;


-- ---------------------------------------------------------------------------
-- The rows that cross between the pump (Rust) and its functions, as one
-- composite type each, so that a field is one attribute here and one field
-- there (`alter type ... add attribute`), not a column list copied by hand
-- or ten parallel arrays.
-- ---------------------------------------------------------------------------

-- A claimed delivery as claim() returns it: the message a consumer
-- receives (src/delivery/mod.rs), and what the pump needs besides.
create type watchpump.claimed_message as (
    delivery_id      bigint,
    change_id        bigint,
    watch_id         bigint,
    service_id       bigint,
    -- services.version: pumps cache each service's URL and keys by it.
    service_version  integer,
    attempt          integer,
    resource         text,
    object           text,
    kind             text,
    sequence         bigint,
    occurred_at      timestamptz,
    -- On the first row of each change only (claim()).
    payload          text,
    -- The pump whose lease on it ran out, if any.
    expired_lease_of text
);

-- What became of one attempt, as complete() takes it.
create type watchpump.attempt_report as (
    delivery_id      bigint,
    attempt          integer,
    -- 'delivered' (2xx), 'gone' (410) or 'retry'.
    outcome          text,
    status           integer,
    error            text,
    started_at       timestamptz,
    duration_ms      double precision,
    response_head    text,
    -- When to try again, for a retry (the pump's back-off).
    next_attempt_at  timestamptz
);

drop function if exists watchpump.claim(text, bigint[], integer[], boolean[], integer, interval, integer, bigint);
drop function if exists watchpump.complete(text, bigint[], integer[], text[], integer[], text[],
                                           timestamptz[], double precision[], text[], timestamptz[]);
drop function if exists watchpump.record_attempts(text, bigint[], integer[], text[], integer[], text[],
                                                  timestamptz[], double precision[], text[]);
