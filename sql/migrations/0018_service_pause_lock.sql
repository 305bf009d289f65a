-- Pauses take a lock per service (0500_consumer.sql, pause_lock()), not one
-- for every service: a consumer pausing and resuming in a loop delayed every
-- other service's pause and the operator's rounds. The old signature goes;
-- 0500_consumer.sql creates the new one.
drop function if exists watchpump.pause_lock(boolean);
