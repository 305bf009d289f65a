-- settle() takes its deliveries as one array of outcomes, a row each
-- (issue 35), rather than ten parallel arrays matched by position, which
-- most callers padded with array_fill() nulls: a field is one attribute
-- here, as for the rows that cross to Rust (0008_storage_v3.sql). The old
-- signature goes; 0300_settle.sql creates the new one, and settle_as(),
-- which makes the outcome of a delivery settled without an attempt.
create type watchpump.settle_outcome as (
    delivery_id    bigint,
    -- 'delivered', 'superseded', 'dropped' or 'failed'.
    state          text,
    -- The answer and the error the settled row keeps (null: the queued
    -- row's last ones, except a delivered row's error).
    status         integer,
    error          text,
    -- A superseded delivery's: the delivery that carries the newer news.
    superseded_by  bigint,
    -- The attempt that delivered it (complete()): settled only while the
    -- pump still holds that attempt's lease, and kept on the settled row
    -- with when it started, how long it took and the answer's head. Null:
    -- the caller holds the row already.
    attempt        integer,
    started_at     timestamptz,
    duration_ms    double precision,
    response_head  text
);

drop function if exists watchpump.settle(bigint[], text[], bigint[], integer[], text[], text,
                                         timestamptz[], double precision[], text[], integer[]);
