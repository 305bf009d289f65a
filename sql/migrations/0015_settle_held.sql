-- settle() takes the attempt each delivery was sent in (issue 18), so that
-- complete() settles a delivered delivery in one statement that checks the
-- lease as it deletes, without locking the row first and without reading
-- attempt_log. The old signature goes; 0200_pump.sql creates the new one.
drop function if exists watchpump.settle(bigint[], text[], bigint[], integer[], text[], text,
                                         timestamptz[], double precision[], text[]);
