-- Consumer self-service (issue 20, docs/protocol.md "The consumer's own
-- view"): a consumer may pause one of its watches, or its whole service.
--
-- paused_at: when the pause began; null while deliveries flow. A paused
-- watch's deliveries stay queued (claim() skips them, sweep() does not fail
-- them, and news keeps superseding: 0500_consumer.sql), and resume() gives
-- them a fresh delivery window.
alter table watchpump.watches add column paused_at timestamptz;
alter table watchpump.services add column paused_at timestamptz;

-- The paused watches, for hold_paused() (0500_consumer.sql) to find their
-- queued deliveries without reading every watch: few rows, a tiny index.
create index watches_paused on watchpump.watches (id) where paused_at is not null;

-- The rate a consumer can take (issue 20): at most this many deliveries a
-- second to the service, all pumps together. max_rate is the operator's
-- (`watchpump services set-rate`), consumer_rate the consumer's own
-- (`PUT /api/v1/rate`), never above max_rate; the lower of the two holds,
-- null is no limit.
alter table watchpump.services
    add column max_rate integer check (max_rate > 0),
    add column consumer_rate integer check (consumer_rate > 0);

-- One token bucket per rate-limited service, shared by every pump
-- (take_tokens(), 0500_consumer.sql): tokens, and when they were last
-- refilled. granted is what the last take_tokens() gave out (read back by
-- its RETURNING).
create table watchpump.rate_buckets (
    service_id   bigint primary key,
    tokens       double precision not null,
    refilled_at  timestamptz not null,
    granted      integer not null default 0
);

-- How deliveries to the service are signed (Standard Webhooks): 'v1',
-- HMAC-SHA256 with a secret both sides hold (whsec_), or 'v1a', ed25519:
-- the producer keeps the secret key (whsk_, sealed in signing_secret like
-- a whsec_) and the consumer holds only the public key (whpk_).
alter table watchpump.services
    add column signature text not null default 'v1' check (signature in ('v1', 'v1a'));
