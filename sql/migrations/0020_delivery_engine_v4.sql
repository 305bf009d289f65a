-- Delivery engine v4 (issue 33): a claim whose cost does not depend on the
-- backlog, claims ahead of free slots that can be given back, and the
-- pump's slots as one composite array.

-- What a pump asks of one service in a claim: how many deliveries it has
-- room for (in flight and queued ahead in the pump), and whether the
-- service is down and this is its probe. Replaces claim()'s three
-- parallel arrays.
create type watchpump.claim_slot as (
    service_id bigint,
    free       integer,
    probe      boolean
);

-- A claimed delivery a pump gives back unsent (release(), 0200_pump.sql):
-- the delivery and the attempt it was claimed for.
create type watchpump.claim_ref as (
    delivery_id bigint,
    attempt     integer
);

-- claim() takes the slots as one array of watchpump.claim_slot now
-- (0200_pump.sql creates it again).
drop function if exists watchpump.claim(text, bigint[], integer[], boolean[], integer, interval, integer, bigint);

