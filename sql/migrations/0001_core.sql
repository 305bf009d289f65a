-- watchpump core schema: the consumers this producer knows, their watches,
-- the changes the producer records, and one delivery per (change, watch).
-- Applied once by `watchpump migrate`; functions live in sql/functions/ and
-- are re-applied on every migrate.

create schema if not exists watchpump;

-- The consumer services this producer delivers to. Only the SHA-256 of each
-- service's token is stored; the token itself is shown once, when created.
create table watchpump.services (
    id          bigint generated always as identity primary key,
    name        text not null unique
                check (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    base_url    text not null check (base_url ~ '^https?://'),
    token_hash  bytea not null check (length(token_hash) = 32),
    created_at  timestamptz not null default now()
);

-- What a consumer follows. `object` is either an exact object
-- ('acme/web/refs/heads/main') or, ending in '/', a prefix ('acme/web/').
-- `filters` keeps what the consumer sent; `kinds` and `match_path` are its
-- parsed form, used by emit().
create table watchpump.watches (
    id              bigint generated always as identity primary key,
    service_id      bigint not null references watchpump.services (id),
    resource        text not null check (resource <> ''),
    object          text not null check (object <> ''),
    kinds           text[],
    match_path      jsonpath,
    -- Whether match_path is a predicate ('$.forced == true', must be true)
    -- or a path ('$.paths[*] ? (...)', must select something).
    match_is_predicate boolean,
    filters         jsonb not null default '{}',
    created_at      timestamptz not null default now(),
    removed_at      timestamptz,
    removed_reason  text
);
-- emit() looks live watches up by every prefix of the changed object.
create index watches_live_object on watchpump.watches (object) where removed_at is null;
create index watches_service on watchpump.watches (service_id, id);

-- One row per followed object: its last sequence number. emit() updates it,
-- which holds the row lock until the producer commits, so two producers
-- changing one object commit in sequence order.
create table watchpump.objects (
    object         text primary key,
    last_sequence  bigint not null
);

-- Every change the producer recorded through emit().
create table watchpump.changes (
    id           bigint generated always as identity primary key,
    object       text not null,
    kind         text not null,
    sequence     bigint not null,
    payload      jsonb not null,
    occurred_at  timestamptz not null default clock_timestamp(),
    unique (object, sequence)
);

-- One delivery per (change, matching watch). Hot rows stay narrow: the
-- payload stays in changes. fillfactor leaves room for in-page updates.
create table watchpump.deliveries (
    id               bigint generated always as identity primary key,
    change_id        bigint not null references watchpump.changes (id),
    watch_id         bigint not null references watchpump.watches (id),
    -- The watch's service, copied for the per-service claim (no foreign
    -- key: the watch's own one covers it, and fan-out pays for every check).
    service_id       bigint not null,
    object           text not null,
    state            text not null default 'pending'
                     check (state in ('pending', 'in_flight', 'delivered', 'superseded', 'dropped', 'failed')),
    attempts         integer not null default 0,
    next_attempt_at  timestamptz not null default now(),
    lease_until      timestamptz,
    leased_by        text,
    deadline         timestamptz not null,
    superseded_by    bigint,
    last_status      integer,
    last_error       text,
    created_at       timestamptz not null default clock_timestamp(),
    finished_at      timestamptz
) with (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

-- The claim: due pending deliveries per consumer service, oldest due first.
create index deliveries_due on watchpump.deliveries (service_id, next_attempt_at)
    where state = 'pending';
-- Supersession and the newer-news check: the pending deliveries of one
-- (watch, object). Only pending ones, so that claiming does not add entries.
create index deliveries_pending_per_object on watchpump.deliveries (watch_id, object, id)
    where state = 'pending';
-- The in-flight deliveries of one (watch, object): the claim sends one at a
-- time. The sweep also finds expired leases here (few rows are in flight).
create index deliveries_in_flight_per_object on watchpump.deliveries (watch_id, object)
    where state = 'in_flight';
-- The sweep: deadlines that passed.
create index deliveries_pending_deadline on watchpump.deliveries (deadline) where state = 'pending';
create index deliveries_change on watchpump.deliveries (change_id);

-- Every attempt to send a delivery, so an operator can see why one failed.
create table watchpump.attempts (
    id            bigint generated always as identity primary key,
    delivery_id   bigint not null references watchpump.deliveries (id) on delete cascade,
    attempt       integer not null,
    started_at    timestamptz not null,
    duration_ms   double precision not null,
    status        integer,
    error         text,
    response_head text,
    pump          text not null
);
create index attempts_delivery on watchpump.attempts (delivery_id, attempt);

-- Pumps that are asleep. emit() raises NOTIFY only when one is, so busy
-- pumps do not make every producer commit take the global NOTIFY lock.
create table watchpump.sleepers (
    pump   text primary key,
    since  timestamptz not null default now()
);
