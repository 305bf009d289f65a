-- emit(): record a change and fan it out to every matching live watch, in the
-- caller's transaction. A rolled-back transaction leaves no change and no
-- delivery behind, so nothing is ever sent for it.
--
-- Plans, for every function in sql/functions that runs per change or per
-- delivery (emit() here, the pump's in 0200_pump.sql): they are PL/pgSQL
-- with `set jit = off`, because JIT compiles for milliseconds what runs in
-- microseconds, and `set plan_cache_mode = force_generic_plan`, because the
-- generic plans are right for every call (checked with EXPLAIN) and
-- planning each call again cost more than running it. The pump's
-- functions (0200_pump.sql) also set `enable_seqscan = off` and
-- `enable_mergejoin = off`: the queue's statistics are those of an empty
-- table most of the time, and a generic plan made from them lives as long
-- as the pump's connection, so a plan that scans a table (or a whole index,
-- for a merge join) would be kept for the burst it is worst at. With those
-- off, every lookup is an index lookup by key, whatever the statistics say
-- (tests/bounds.rs checks it on a queue analyzed empty). This note is not
-- repeated at each of them.

-- How long deliveries are retried: a delivery's deadline is now() plus
-- this, set where the delivery is created (emit(), or an operator's retry).
-- Set it for every connection at once, read at every call (no reload, no
-- restart):
--   update watchpump.settings set delivery_window = '6 hours';
-- A connection's own `watchpump.delivery_window` setting, when it has one,
-- comes first: `set local watchpump.delivery_window = '1 minute'` in a
-- producer's transaction, or `alter database mydb set ...`, which a
-- connection reads only when it starts (reconnect to reload it; prefer the
-- table). 24 hours when neither says.
create or replace function watchpump.delivery_window() returns interval
language plpgsql stable as $$
declare
    v_text   text := nullif(current_setting('watchpump.delivery_window', true), '');
    v_window interval;
begin
    if v_text is not null then
        return v_text::interval;
    end if;
    select s.delivery_window into v_window from watchpump.settings s;
    return coalesce(v_window, interval '24 hours');
end
$$;

-- The object itself and each of its prefixes that ends in '/':
-- 'acme/web/main' -> {acme/, acme/web/, acme/web/main}. A watch on any of
-- them follows the object, and each is an index lookup on watches.object.
-- Linear in the object's length: one split, then each prefix grows from
-- the one before. emit() refuses objects over 1,024 bytes, the longest a
-- watch may name, so no prefix is longer and there are at most 512 of them;
-- the cap here holds for other callers too. (PL/pgSQL rather than SQL: a
-- SQL function that cannot be inlined is parsed and planned again at every
-- call, which cost emit() 0.2 ms.)
create or replace function watchpump.object_prefixes(p_object text) returns text[]
language plpgsql immutable strict parallel safe as $$
declare
    v_parts    text[] := string_to_array(left(p_object, 1025), '/');
    v_prefixes text[] := '{}';
    v_prefix   text := '';
begin
    -- Every part but the last closes a prefix (a trailing '/' leaves an
    -- empty last part: the object is itself a prefix).
    for i in 1 .. cardinality(v_parts) - 1 loop
        v_prefix := v_prefix || v_parts[i] || '/';
        exit when octet_length(v_prefix) > 1024 or octet_length(v_prefix) >= octet_length(p_object);
        v_prefixes := v_prefixes || v_prefix;
    end loop;
    return v_prefixes || p_object;
end
$$;

-- The largest payload emit() accepts, in bytes of its JSON text:
--   alter database mydb set watchpump.max_payload_bytes = 4194304;
-- 1 MiB unless set, and never above 16 MiB, the ceiling at which the
-- pump's memory is measured (BENCHMARKS.md, "Bounds").
create or replace function watchpump.max_payload_bytes() returns integer
language plpgsql stable as $$
declare
    v_text text := nullif(current_setting('watchpump.max_payload_bytes', true), '');
begin
    if v_text is null then
        return 1048576;
    end if;
    -- Checked by pattern, not by catching the cast's error: an exception
    -- block would open a subtransaction in every emit().
    if v_text !~ '^\s*[0-9]{1,12}\s*$' then
        raise exception 'watchpump.max_payload_bytes is %, not a number of bytes', quote_literal(v_text)
            using errcode = '22023';
    end if;
    return least(greatest(v_text::bigint, 1), 16777216);
end
$$;

-- Whether a jsonpath is a predicate (it yields one boolean, even for an
-- empty document: '$.forced == true') rather than a path that selects items
-- ('$.paths[*] ? (@ starts with "docs/")'). Decided once, when a watch is
-- created.
create or replace function watchpump.jsonpath_is_predicate(p_match jsonpath) returns boolean
language sql immutable strict parallel safe as $$
    select jsonb_path_match('{}', p_match, '{}', true) is not null
$$;

-- A watch's `match` filter against a change's payload. A predicate must be
-- true (unknown, e.g. comparing a string with a number, is not true); a
-- path must select at least one item.
create or replace function watchpump.payload_matches(p_payload jsonb, p_match jsonpath, p_is_predicate boolean)
returns boolean
language sql immutable parallel safe as $$
    select case
        when p_is_predicate then coalesce(jsonb_path_match(p_payload, p_match, '{}', true), false)
        else jsonb_path_exists(p_payload, p_match, '{}', true)
    end
$$;

-- The trace context the caller set for this transaction (README,
-- "Traces"):
--   select set_config('watchpump.traceparent', '00-<trace id>-<span id>-01', true);
--   select set_config('watchpump.tracestate', 'vendor=value', true);  -- optional
-- Returns the two values to keep with the change, or nulls. A malformed
-- traceparent (W3C Trace Context, version 00 or a later version's 00
-- prefix; lower-case hex; neither id all zeros) is ignored, and a malformed
-- tracestate (over 512 bytes, not printable ASCII, or a member not
-- key=value) is dropped: each is counted in the sequence
-- watchpump.trace_context_malformed and never fails the transaction. The
-- same grammar as src/telemetry/context.rs, which the pump and the kit read
-- it with.
create or replace function watchpump.trace_context(out traceparent text, out tracestate text)
language plpgsql volatile
set jit = off
as $$
declare
    v_parent text := nullif(current_setting('watchpump.traceparent', true), '');
    v_state  text := nullif(current_setting('watchpump.tracestate', true), '');
begin
    if v_parent is null then
        if v_state is not null then
            perform nextval('watchpump.trace_context_malformed');
        end if;
        return;
    end if;
    v_parent := btrim(v_parent, e' \t');
    -- Checked by pattern, never by catching an error (an exception block
    -- would open a subtransaction in every emit()).
    if octet_length(v_parent) <= 4096
       and v_parent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-.*)?$'
       and left(v_parent, 2) <> 'ff'
       and (left(v_parent, 2) <> '00' or octet_length(v_parent) = 55)
       and substr(v_parent, 4, 32) <> repeat('0', 32)
       and substr(v_parent, 37, 16) <> repeat('0', 16) then
        traceparent := '00' || substr(v_parent, 3, 53);
    else
        perform nextval('watchpump.trace_context_malformed');
        return;
    end if;
    if v_state is not null then
        if octet_length(v_state) <= 512
           and v_state ~ '^[ -~]*$'
           and not exists (
               select 1 from unnest(string_to_array(v_state, ',')) m
               where btrim(m, e' \t') <> ''
                 and btrim(m, e' \t') !~ '^[^ =]+=.+$') then
            tracestate := v_state;
        else
            perform nextval('watchpump.trace_context_malformed');
        end if;
    end if;
end
$$;

create or replace function watchpump.emit(p_object text, p_kind text, p_payload jsonb default '{}')
returns bigint
language plpgsql
set jit = off
set plan_cache_mode = force_generic_plan
as $$
declare
    v_sequence bigint;
    v_change   bigint;
    v_occurred timestamptz;
    v_deadline timestamptz := now() + watchpump.delivery_window();
    v_bytes    integer;
    v_traceparent text;
    v_tracestate  text;
begin
    -- What one change may be (README, "Bounds"). Refusals carry a SQLSTATE
    -- of their own (22023: not a valid object or kind; 54000: over a
    -- limit), never an error of the storage underneath: an object and a
    -- kind watchpump accepts always fit its indexes.
    if p_object is null or p_object = '' or left(p_object, 1) = '/' or strpos(p_object, '//') > 0 then
        raise exception 'watchpump.emit: the object % is not valid: it must be non-empty, not start with a slash and not contain two slashes in a row',
            coalesce(quote_literal(left(p_object, 64)), 'null')
            using errcode = '22023';
    end if;
    if octet_length(p_object) > 1024 then
        raise exception 'watchpump.emit: the object is % bytes; the limit is 1024 (the longest object a watch may follow)',
            octet_length(p_object) using errcode = '54000';
    end if;
    if p_kind is null or p_kind = '' then
        raise exception 'watchpump.emit: kind must not be empty' using errcode = '22023';
    end if;
    if octet_length(p_kind) > 128 then
        raise exception 'watchpump.emit: the kind is % bytes; the limit is 128', octet_length(p_kind)
            using errcode = '54000';
    end if;
    -- An SQL NULL payload is the empty object everywhere: stored, matched
    -- against filters and sent.
    p_payload := coalesce(p_payload, '{}');
    v_bytes := octet_length(p_payload::text);
    if v_bytes > watchpump.max_payload_bytes() then
        raise exception 'watchpump.emit: the payload is % bytes of JSON; the limit is % (watchpump.max_payload_bytes)',
            v_bytes, watchpump.max_payload_bytes()
            using errcode = '54000',
                  hint = 'send a reference to the data (a commit id, a URL) rather than the data itself';
    end if;

    -- Strict mode (docs/operator.md, kinds): a declared kind, and a payload
    -- its schema accepts; nothing is checked otherwise.
    if current_setting('watchpump.strict_kinds', true) = 'on' then perform watchpump.check_kind(p_kind, p_payload); end if;

    -- The counter row stays locked until the caller commits: emitters to one
    -- object queue here and commit in sequence order.
    insert into watchpump.objects as o (object, last_sequence)
    values (p_object, 1)
    on conflict (object) do update set last_sequence = o.last_sequence + 1
    returning o.last_sequence into v_sequence;

    -- The trace context, if the caller set one (a function call only then).
    if coalesce(current_setting('watchpump.traceparent', true), '') <> ''
       or coalesce(current_setting('watchpump.tracestate', true), '') <> '' then
        select t.traceparent, t.tracestate into v_traceparent, v_tracestate from watchpump.trace_context() t;
    end if;
    insert into watchpump.changes (object, kind, sequence, payload, payload_bytes, traceparent, tracestate)
    values (p_object, p_kind, v_sequence, p_payload, v_bytes, v_traceparent, v_tracestate)
    returning id, occurred_at into v_change, v_occurred;

    -- One delivery per matching watch, into the queue. Older news of the
    -- same (watch, object) is superseded by the pump, never here (the order
    -- rule, 0200_pump.sql): an existing delivery may be in a pump's hands,
    -- and a producer's transaction must neither wait for a pump nor hold a
    -- lock one needs.
    --
    -- What a service's filters covering one object may cost is capped when
    -- watches are created (src/watches/cap.rs). On a large payload, where
    -- one filter can cost a millisecond, each distinct filter (keyed by
    -- PostgreSQL's canonical text of it) is evaluated once: watches of many
    -- resources, or services, often share one. On a small payload that
    -- bookkeeping (two materialised CTEs, a sort and a hash join: 10-25 us)
    -- costs more than evaluating the few filters again, so the plain
    -- statement runs.
    --
    -- A delivery is created at its change's time: the history is
    -- partitioned by day on both (0008_storage_v3.sql), and a delivery and
    -- its change then share a day, which retention drops together.
    if pg_column_size(p_payload) < 8192 then
        insert into watchpump.queue (change_id, watch_id, service_id, object, sequence, deadline, created_at)
        select v_change, w.id, w.service_id, p_object, v_sequence, v_deadline, v_occurred
        from watchpump.watches w
        where w.removed_at is null
          and w.object = any (watchpump.object_prefixes(p_object))
          and (w.kinds is null or p_kind = any (w.kinds))
          and (w.match_path is null or watchpump.payload_matches(p_payload, w.match_path, w.match_is_predicate))
        order by w.id;
    else
        with candidates as materialized (
            select w.id, w.service_id, w.match_path, w.match_path::text as match_text, w.match_is_predicate
            from watchpump.watches w
            where w.removed_at is null
              and w.object = any (watchpump.object_prefixes(p_object))
              and (w.kinds is null or p_kind = any (w.kinds))
        ), verdicts as materialized (
            -- Materialised, or the planner moves the evaluation into the
            -- join filter: once per watch again.
            select f.match_text, f.match_is_predicate,
                   watchpump.payload_matches(p_payload, f.match_path, f.match_is_predicate) as matched
            from (select distinct on (c.match_text, c.match_is_predicate)
                         c.match_text, c.match_is_predicate, c.match_path
                  from candidates c where c.match_text is not null
                  order by c.match_text, c.match_is_predicate) f
        )
        insert into watchpump.queue (change_id, watch_id, service_id, object, sequence, deadline, created_at)
        select v_change, c.id, c.service_id, p_object, v_sequence, v_deadline, v_occurred
        from candidates c
        left join verdicts v using (match_text, match_is_predicate)
        where c.match_text is null or v.matched
        order by c.id;
    end if;

    -- Wake a sleeping pump, and only when one sleeps: NOTIFY serialises
    -- committing transactions, so producers should not pay for it while
    -- every pump is busy anyway. (Identical notifications fold into one
    -- per transaction.)
    if found and exists (select 1 from watchpump.sleepers) then
        perform pg_notify('watchpump', '');
    end if;

    return v_change;
end
$$;
