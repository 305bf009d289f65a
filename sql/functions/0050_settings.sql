-- watchpump's own settings (watchpump.settings, one row: 0008_storage_v3.sql,
-- 0020_delivery_engine_v4.sql), read where they are used, at every call, so
-- that a change reaches every producer connection and pump at once:
--   update watchpump.settings set delivery_window = '6 hours';
--   update watchpump.settings set max_payload_bytes = 4194304;
--   update watchpump.settings set strict_kinds = true;
-- Only the schema's owner writes them. A producer's session cannot weaken
-- them (issue 34): emit() reads no session setting of its caller but the
-- trace context.
--
-- How long deliveries are retried: a delivery's deadline is now() plus
-- this, set where the delivery is created (emit(), or an operator's retry).
-- 24 hours when unset.
create or replace function watchpump.delivery_window() returns interval
language sql stable as $$
    select coalesce((select s.delivery_window from watchpump.settings s), interval '24 hours')
$$;

-- The largest payload emit() accepts, in bytes of its JSON text: 1 MiB
-- unless set, and never above 16 MiB, the ceiling at which the pump's
-- memory is measured (BENCHMARKS.md, "Bounds"; the column's check).
create or replace function watchpump.max_payload_bytes() returns integer
language sql stable as $$
    select coalesce((select s.max_payload_bytes from watchpump.settings s), 1048576)
$$;
