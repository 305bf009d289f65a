-- Issue 34: what consumer services share, shared fairly, and the record
-- of every attempt kept across a redelivery.

-- The attempt that delivered a delivery lives on its settled row; a
-- redelivery (or an operator's retry) moves the delivery back to the queue
-- and that row goes. The action that requeued it keeps that attempt, so
-- that watchpump.attempts and the history still show it (issue 34: a
-- redelivered delivery listed only its second attempt).
alter table watchpump.actions add column attempt             integer,
                              add column attempt_started_at  timestamptz,
                              add column attempt_duration_ms double precision,
                              add column attempt_status      integer,
                              add column attempt_response_head text,
                              add column attempt_pump        text;
