-- take_tokens() answers when each bucket holds the next claim's tokens
-- (refill_seconds, issue 35). A function's result cannot be replaced in
-- place: the old one goes here, and 0250_rate.sql makes the new one in the
-- same run. `migrate` applies a run in one transaction, so no pump finds
-- it missing, nor without its grant (roles.sql, in that transaction too).
-- A database that has the new one already (made by stop 40's 0250_rate.sql,
-- which dropped the old itself) loses it here and gets it back from the
-- same file, whose text changed with this migration.
drop function if exists watchpump.take_tokens(bigint[], integer[], integer);
