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
