-- The service lifecycle: a signing secret per consumer service (Standard
-- Webhooks), rotation of the secret and of the token with an overlap during
-- which the old one still works, and removal. Applied once.

alter table watchpump.services
    -- whsec_<base64>: the key deliveries to this service are signed with.
    -- Kept as is (HMAC needs the key itself, unlike the token, of which only
    -- a hash is kept). Services registered before this migration get one
    -- from `watchpump migrate` (services::ensure_signing_secrets).
    add column signing_secret          text check (signing_secret ~ '^whsec_'),
    -- After a rotation, the old secret still signs (both signatures are sent)
    -- until previous_secret_until.
    add column previous_signing_secret text check (previous_signing_secret ~ '^whsec_'),
    add column previous_secret_until   timestamptz,
    -- After a token rotation, the old token still authenticates until
    -- previous_token_until.
    add column previous_token_hash     bytea check (length(previous_token_hash) = 32),
    add column previous_token_until    timestamptz,
    -- Removed services keep their row (their deliveries' history refers to
    -- it) but authenticate no more, get nothing, and free their name.
    add column removed_at              timestamptz,
    -- Bumped by every change a pump must notice (URL, secrets): pumps cache
    -- what they need to send, keyed by (id, version).
    add column version                 integer not null default 1;

alter table watchpump.services drop constraint services_name_key;
create unique index services_live_name on watchpump.services (name) where removed_at is null;
