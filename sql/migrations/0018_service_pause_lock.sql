-- Pauses take a lock per service (0500_consumer.sql, pause_key()), not one
-- for every service: a consumer pausing and resuming in a loop delayed every
-- other service's pause and the operator's rounds. The function that took
-- the one lock goes.
drop function if exists watchpump.pause_lock(boolean);
