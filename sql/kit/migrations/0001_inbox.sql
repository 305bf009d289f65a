-- The consumer kit's inbox (watchpump::kit), in the CONSUMER's own database,
-- in a schema of its own so it clashes with none of the consumer's tables.
-- Applied once by watchpump::kit::migrate(); never edit it once shipped, add
-- a file instead.

create schema if not exists watchpump_inbox;

-- The watches this consumer registered at its producers (kit::WatchClient
-- records each id the producer returned). A delivery naming a watch that is
-- not here is not for us and is refused with 403; one naming a watch we
-- removed (or answered 410 for) is answered 410 again.
create table watchpump_inbox.watches (
    producer        text not null,
    watch_id        bigint not null,
    resource        text not null,
    object          text not null,
    filters         jsonb not null default '{}',
    registered_at   timestamptz not null default now(),
    removed_at      timestamptz,
    removed_reason  text,
    primary key (producer, watch_id)
);

-- Every delivery accepted, one row per delivery id, written in the same
-- transaction as the consumer's own work. The producer delivers at least
-- once: a second copy of a delivery finds its row here and is answered 2xx
-- without running the work again.
--   outcome 'done':    the consumer's handler ran and its work committed;
--   outcome 'skipped': older (or equal) news than the object's newest
--                      accepted sequence, so the handler did not run.
-- A delivery whose handler failed, or answered Gone, leaves no row.
create table watchpump_inbox.deliveries (
    producer     text not null,
    delivery_id  bigint not null,
    watch_id     bigint not null,
    change_id    bigint not null,
    object       text not null,
    kind         text not null,
    sequence     bigint not null,
    occurred_at  timestamptz not null,
    attempt      int not null,
    outcome      text not null check (outcome in ('done', 'skipped')),
    payload      jsonb not null,
    received_at  timestamptz not null default now(),
    primary key (producer, delivery_id)
);

-- For watchpump_inbox.prune(): oldest first.
create index deliveries_received_at on watchpump_inbox.deliveries (received_at);

-- The newest sequence accepted per (watch, object). Sequences increase per
-- object in the producer's commit order; news with a sequence not above the
-- one stored here is older than what the consumer already acted on. This is
-- also what still refuses a replayed delivery once its row in
-- watchpump_inbox.deliveries has been pruned.
create table watchpump_inbox.positions (
    producer     text not null,
    watch_id     bigint not null,
    object       text not null,
    sequence     bigint not null,
    delivery_id  bigint not null,
    updated_at   timestamptz not null default now(),
    primary key (producer, watch_id, object),
    foreign key (producer, watch_id) references watchpump_inbox.watches on delete cascade
);
