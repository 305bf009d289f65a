-- The operator's side: what people did to deliveries (actions), failures
-- waiting to be folded into a warning to notify (failure_inbox), the
-- warnings themselves, panel sessions, and the indexes the panel, the
-- backlog view and pruning read. Views and functions are in
-- sql/functions/0300_operator.sql.

-- Every action a person or tool took on a delivery, so that its history
-- reads top to bottom next to its attempts (view watchpump.delivery_history).
create table watchpump.actions (
    id           bigint generated always as identity primary key,
    delivery_id  bigint not null references watchpump.deliveries (id) on delete cascade,
    at           timestamptz not null default clock_timestamp(),
    action       text not null check (action in ('retry')),
    actor        text not null check (actor <> ''),
    from_state   text not null,
    note         text
);
create index actions_delivery on watchpump.actions (delivery_id, id);

-- Deliveries that just ended 'failed', written by a trigger in the same
-- transaction as the state change, so none is missed or counted twice. The
-- operator task drains it into warnings. No foreign key: pruning must not
-- wait on it, and a drained row is gone anyway.
create table watchpump.failure_inbox (
    id           bigint generated always as identity primary key,
    delivery_id  bigint not null,
    service_id   bigint not null,
    created_at   timestamptz not null,
    failed_at    timestamptz not null default clock_timestamp()
);

create function watchpump.note_failure() returns trigger
language plpgsql as $$
begin
    insert into watchpump.failure_inbox (delivery_id, service_id, created_at)
    values (new.id, new.service_id, new.created_at);
    return null;
end
$$;

-- Fires only on the transition into 'failed': the WHEN clause is evaluated
-- per updated row without calling the function, so the pump's other updates
-- pay next to nothing for it.
create trigger deliveries_note_failure
    after update of state on watchpump.deliveries
    for each row
    when (new.state = 'failed' and old.state is distinct from 'failed')
    execute function watchpump.note_failure();

-- Warnings to the notify service: one per service per fold window at most.
-- 'pending' until sent (retried with back-off like a delivery), then 'sent';
-- 'logged' when no notify URL is configured; 'failed' when notify did not
-- take it before its deadline. Failures that arrive while a warning is
-- pending are folded into it (failed and folded grow).
create table watchpump.warnings (
    id               bigint generated always as identity primary key,
    service_id       bigint not null references watchpump.services (id),
    state            text not null default 'pending'
                     check (state in ('pending', 'sent', 'logged', 'failed')),
    failed           integer not null check (failed > 0),
    folded           integer not null default 0,
    oldest_created_at timestamptz not null,
    first_failed_at  timestamptz not null,
    last_failed_at   timestamptz not null,
    created_at       timestamptz not null default clock_timestamp(),
    send_after       timestamptz not null,
    deadline         timestamptz not null,
    attempts         integer not null default 0,
    next_attempt_at  timestamptz not null,
    last_status      integer,
    last_error       text,
    finished_at      timestamptz
) with (fillfactor = 70);
create index warnings_service on watchpump.warnings (service_id, id);
-- At most one pending warning per service: the one new failures fold into.
create unique index warnings_open on watchpump.warnings (service_id) where state = 'pending';

-- Panel sessions. The key is SHA-256(session secret || admin token): the
-- database never holds a usable cookie, and changing WATCHPUMP_ADMIN_TOKEN
-- ends every session at once.
create table watchpump.panel_sessions (
    key_hash    bytea primary key check (length(key_hash) = 32),
    created_at  timestamptz not null default now(),
    expires_at  timestamptz not null
);

-- Indexes for the operator's reads. Their columns either never change after
-- insert (service_id, id, created_at) or change only together with `state`
-- (finished_at), and `state` is already in the predicates of 0001's partial
-- indexes, so none of them turns an update that could be HOT into one that
-- cannot.
--
-- Failed deliveries of a service by when they failed: failed_24h in the
-- backlog view, retry_failed(), pruning of old failures, the panel's lists.
create index deliveries_failed on watchpump.deliveries (service_id, finished_at)
    where state = 'failed';
-- Finished deliveries by when they finished: pruning in small batches, and a
-- service's last successful delivery.
create index deliveries_finished on watchpump.deliveries (service_id, finished_at)
    where state in ('delivered', 'superseded', 'dropped');
-- The panel's deliveries list, newest first, by keyset: for one service,
-- and for the rare states an operator looks for (the frequent ones are found
-- quickly walking the primary key backwards). Finished deliveries only: an
-- index on every row gets an entry for each of a delivery's three versions
-- (emitted, claimed, settled), and measured, that halved the pump's
-- throughput (bulk benchmark: 9,000/s without, 5,300-6,300/s with). Pending
-- and in-flight deliveries of a service are found through deliveries_due
-- and deliveries_in_flight_per_object (store::deliveries unions the two).
create index deliveries_service_finished on watchpump.deliveries (service_id, id)
    where state in ('delivered', 'superseded', 'dropped', 'failed');
create index deliveries_failed_dropped on watchpump.deliveries (id)
    where state in ('failed', 'dropped');
-- Time-range filters: a BRIN index is tiny and cheap to keep, and rows are
-- inserted in created_at order.
create index deliveries_created_brin on watchpump.deliveries using brin (created_at);
-- Pruning changes that matched no watch: the newest change past retention.
create index changes_occurred on watchpump.changes (occurred_at);

-- Where pruning of changes that matched no watch has got to, so that each
-- batch starts after the last instead of rereading the changes still needed.
create table watchpump.prune_position (
    only_row       boolean primary key default true check (only_row),
    changes_after  bigint not null default 0
);
insert into watchpump.prune_position default values;
