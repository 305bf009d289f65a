-- take_tokens() also says, for each rate-limited service, how long until
-- its bucket holds what the next claim would take (issue 35): a pump whose
-- claim used every token it was granted claims that service again then,
-- rather than at its next sweep or NOTIFY. Without it a service limited to
-- 50 a second got about 4 a second at the default sweep of one second: a
-- burst of 2 a sweep. A function's result columns cannot be replaced in
-- place: the old one goes, and 0250_rate.sql creates the new one. A pump
-- of the version before reads the two columns it knows by name.
drop function if exists watchpump.take_tokens(bigint[], integer[], integer);
