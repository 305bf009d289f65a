-- Trace context on changes (README, "Traces"): the W3C traceparent and
-- tracestate of the producer's span that recorded the change, so that every
-- delivery of it, and every attempt, joins the producer's trace.
--
-- Both null when the producer set none (the common case: a null costs a
-- bit in the row's null bitmap). emit() keeps only well-formed values,
-- traceparent 55 bytes, tracestate at most 512 (the checks below make it
-- so for any other writer too). On a partitioned `changes` (0008) the
-- columns and checks go to every partition.
alter table watchpump.changes
    add column traceparent text,
    add column tracestate text,
    add constraint changes_traceparent_check check (octet_length(traceparent) = 55),
    add constraint changes_tracestate_check
        check (tracestate is null or (traceparent is not null and octet_length(tracestate) <= 512));

-- How many trace contexts emit() ignored as malformed. A sequence, not a
-- counter row: nextval() takes no lock a producer's transaction could wait
-- on, and is not rolled back (a malformed value is counted even if the
-- producer's transaction is not committed). Read by the pump's backlog
-- leader as watchpump_trace_context_malformed_total.
create sequence watchpump.trace_context_malformed;

-- claim() returns the trace context with each message (0008's composite
-- type: one attribute here, one field in src/pump/store.rs). Not part of
-- the body.
alter type watchpump.claimed_message
    add attribute traceparent text,
    add attribute tracestate text;
