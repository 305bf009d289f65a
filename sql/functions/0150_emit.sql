-- emit(): record a change and fan it out to every matching live watch, in the
-- caller's transaction. A rolled-back transaction leaves no change and no
-- delivery behind, so nothing is ever sent for it.
--
-- Plans, for every function in sql/functions that runs per change or per
-- delivery (emit() here, the pump's in 0300_settle.sql and 0500_delivery.sql): they are PL/pgSQL
-- with `set jit = off`, because JIT compiles for milliseconds what runs in
-- microseconds, and `set plan_cache_mode = force_generic_plan`, because the
-- generic plans are right for every call (checked with EXPLAIN) and
-- planning each call again cost more than running it. The pump's
-- functions also set `enable_seqscan = off` and
-- `enable_mergejoin = off`: the queue's statistics are those of an empty
-- table most of the time, and a generic plan made from them lives as long
-- as the pump's connection, so a plan that scans a table (or a whole index,
-- for a merge join) would be kept for the burst it is worst at. With those
-- off, every lookup is an index lookup by key, whatever the statistics say
-- (tests/bounds.rs checks it on a queue analyzed empty). This note is not
-- repeated at each of them.

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

-- The trace context the caller set for this transaction (docs/operator.md,
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
    -- Oversized values are dropped before anything reads them (issue 34:
    -- a 50 MB traceparent cost emit() 0.6 s to trim and match).
    if octet_length(v_parent) > 4096 then
        perform nextval('watchpump.trace_context_malformed');
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

-- What emit() refuses of one change, before anything is written (docs/security.md,
-- "Bounds"), or null when it accepts it. Refusals carry a SQLSTATE of
-- their own (refuse_change()), never an error of the storage underneath:
-- an object and a kind watchpump accepts always fit its indexes. A plain
-- expression, inlined where it is used: emit() asks it of one change,
-- emit_many() of a whole batch in one statement.
create or replace function watchpump.change_refusal(p_object text, p_kind text, p_bytes integer,
                                                    p_max_bytes integer)
returns text
language sql immutable parallel safe as $$
    select case
        when p_object is null or p_object = '' or left(p_object, 1) = '/' or strpos(p_object, '//') > 0
            then 'object'
        when octet_length(p_object) > 1024 then 'object_bytes'
        when p_kind is null or p_kind = '' then 'kind'
        when octet_length(p_kind) > 128 then 'kind_bytes'
        -- watchpump's own kinds (watchpump.ping) are sent by watchpump alone.
        when left(p_kind, 10) = 'watchpump.' then 'kind_reserved'
        when p_bytes > p_max_bytes then 'payload_bytes'
    end
$$;

-- Raises the error for a refusal of change_refusal(): 22023 for an object
-- or a kind that is not valid, 54000 for one over a limit. `p_who` begins
-- the message (the function, and for emit_many() which change).
create or replace function watchpump.refuse_change(p_who text, p_refusal text, p_object text, p_kind text,
                                                   p_bytes integer, p_max_bytes integer)
returns void
language plpgsql immutable as $$
begin
    case p_refusal
        when 'object' then
            raise exception '%: the object % is not valid: it must be non-empty, not start with a slash and not contain two slashes in a row',
                p_who, coalesce(quote_literal(left(p_object, 64)), 'null')
                using errcode = '22023';
        when 'object_bytes' then
            raise exception '%: the object is % bytes; the limit is 1024 (the longest object a watch may follow)',
                p_who, octet_length(p_object) using errcode = '54000';
        when 'kind' then
            raise exception '%: kind must not be empty', p_who using errcode = '22023';
        when 'kind_bytes' then
            raise exception '%: the kind is % bytes; the limit is 128', p_who, octet_length(p_kind)
                using errcode = '54000';
        when 'kind_reserved' then
            raise exception '%: the kind % is reserved: kinds that begin with "watchpump." are watchpump''s own',
                p_who, quote_literal(left(p_kind, 64)) using errcode = '22023';
        when 'payload_bytes' then
            raise exception '%: the payload is % bytes of JSON; the limit is % (watchpump.settings.max_payload_bytes)',
                p_who, p_bytes, p_max_bytes
                using errcode = '54000',
                      hint = 'send a reference to the data (a commit id, a URL) rather than the data itself';
        else
            raise exception '%: refused (%)', p_who, p_refusal using errcode = '22023';
    end case;
end
$$;

-- emit(): record one change and fan it out to every matching live watch,
-- in the caller's transaction. Set-based (issue 33): after the checks, one
-- statement takes the object's next sequence, records the change and
-- queues its deliveries (INSERT ... SELECT over the matching watches); the
-- settings are read once, in the statement before it. What one emit()
-- costs is in BENCHMARKS.md ("emit"); emit_many() below records a batch
-- for the cost of one statement.
create or replace function watchpump.emit(p_object text, p_kind text, p_payload jsonb default '{}')
returns bigint
language plpgsql
set jit = off
set plan_cache_mode = force_generic_plan
as $$
declare
    v_settings    watchpump.settings;
    v_bytes       integer;
    v_refusal     text;
    v_window      interval;
    v_traceparent text;
    v_tracestate  text;
    v_change      bigint;
    v_wake        boolean;
    -- This timeline's ids and sequences start above it (id_floor()).
    v_floor       bigint := watchpump.id_floor();
begin
    -- An SQL NULL payload is the empty object everywhere: stored, matched
    -- against filters and sent.
    p_payload := coalesce(p_payload, '{}');
    v_bytes := octet_length(p_payload::text);
    select * into v_settings from watchpump.settings;
    v_refusal := watchpump.change_refusal(p_object, p_kind, v_bytes, coalesce(v_settings.max_payload_bytes, 1048576));
    if v_refusal is not null then
        perform watchpump.refuse_change('watchpump.emit', v_refusal, p_object, p_kind, v_bytes,
                                        coalesce(v_settings.max_payload_bytes, 1048576));
    end if;
    v_window := coalesce(v_settings.delivery_window, interval '24 hours');

    -- Strict mode (docs/operator.md, kinds): a declared kind, and a payload
    -- its schema accepts; nothing is checked otherwise.
    if v_settings.strict_kinds then
        perform watchpump.check_kind(p_kind, p_payload);
    end if;

    -- The trace context, if the caller set one (a function call only then).
    if coalesce(current_setting('watchpump.traceparent', true), '') <> ''
       or coalesce(current_setting('watchpump.tracestate', true), '') <> '' then
        select t.traceparent, t.tracestate into v_traceparent, v_tracestate from watchpump.trace_context() t;
    end if;

    -- One delivery per matching watch, into the queue. Older news of the
    -- same (watch, object) is superseded by the pump, never here (the order
    -- rule, 0500_delivery.sql): an existing delivery may be in a pump's hands,
    -- and a producer's transaction must neither wait for a pump nor hold a
    -- lock one needs. The counter row of the object stays locked until the
    -- caller commits: emitters to one object queue there and commit in
    -- sequence order.
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
        with counted as (
            insert into watchpump.objects as o (object, last_sequence)
            values (p_object, v_floor + 1)
            on conflict (object) do update set last_sequence = greatest(o.last_sequence, v_floor) + 1
            returning o.last_sequence
        ),
        change as (
            insert into watchpump.changes (id, object, kind, sequence, payload, payload_bytes, traceparent, tracestate)
            select nextval('watchpump.change_ids') + v_floor, p_object, p_kind, c.last_sequence, p_payload,
                   v_bytes, v_traceparent, v_tracestate
            from counted c
            returning id, sequence, occurred_at
        ),
        queued as (
            insert into watchpump.queue (change_id, watch_id, service_id, object, sequence, deadline, created_at,
                                         payload_bytes)
            select c.id, w.id, w.service_id, p_object, c.sequence, now() + v_window, c.occurred_at, v_bytes
            from change c
            cross join watchpump.watches w
            where w.removed_at is null
              and w.object = any (watchpump.object_prefixes(p_object))
              and (w.kinds is null or p_kind = any (w.kinds))
              and (w.match_path is null or watchpump.payload_matches(p_payload, w.match_path, w.match_is_predicate))
            order by w.id
            returning 1
        )
        select c.id, exists (select 1 from queued) and exists (select 1 from watchpump.sleepers)
        into v_change, v_wake
        from change c;
    else
        with counted as (
            insert into watchpump.objects as o (object, last_sequence)
            values (p_object, v_floor + 1)
            on conflict (object) do update set last_sequence = greatest(o.last_sequence, v_floor) + 1
            returning o.last_sequence
        ),
        change as (
            insert into watchpump.changes (id, object, kind, sequence, payload, payload_bytes, traceparent, tracestate)
            select nextval('watchpump.change_ids') + v_floor, p_object, p_kind, c.last_sequence, p_payload,
                   v_bytes, v_traceparent, v_tracestate
            from counted c
            returning id, sequence, occurred_at
        ),
        candidates as materialized (
            select w.id, w.service_id, w.match_path, w.match_path::text as match_text, w.match_is_predicate
            from watchpump.watches w
            where w.removed_at is null
              and w.object = any (watchpump.object_prefixes(p_object))
              and (w.kinds is null or p_kind = any (w.kinds))
        ),
        verdicts as materialized (
            -- Materialised, or the planner moves the evaluation into the
            -- join filter: once per watch again.
            select f.match_text, f.match_is_predicate,
                   watchpump.payload_matches(p_payload, f.match_path, f.match_is_predicate) as matched
            from (select distinct on (c.match_text, c.match_is_predicate)
                         c.match_text, c.match_is_predicate, c.match_path
                  from candidates c where c.match_text is not null
                  order by c.match_text, c.match_is_predicate) f
        ),
        queued as (
            insert into watchpump.queue (change_id, watch_id, service_id, object, sequence, deadline, created_at,
                                         payload_bytes)
            select ch.id, c.id, c.service_id, p_object, ch.sequence, now() + v_window, ch.occurred_at, v_bytes
            from change ch
            cross join candidates c
            left join verdicts v using (match_text, match_is_predicate)
            where c.match_text is null or v.matched
            order by c.id
            returning 1
        )
        select c.id, exists (select 1 from queued) and exists (select 1 from watchpump.sleepers)
        into v_change, v_wake
        from change c;
    end if;

    -- Wake a sleeping pump, and only when one sleeps: NOTIFY serialises
    -- committing transactions, so producers should not pay for it while
    -- every pump is busy anyway. (Identical notifications fold into one
    -- per transaction.)
    if v_wake then
        perform pg_notify('watchpump', '');
    end if;
    return v_change;
end
$$;

-- emit_many(): record a batch of changes, the i-th being (p_objects[i],
-- p_kinds[i], p_payloads[i]), and fan each out as emit() does, in the
-- caller's transaction, for the cost of a statement rather than of a call
-- per change (issue 33: a producer that records many changes at once, an
-- import, a push of many branches). Returns the changes' ids in the order
-- given. Every rule of emit() holds for each change, with the same
-- SQLSTATEs; the first change refused refuses the whole batch (nothing is
-- written), and its message says which (`change 3: ...`, counting from 1).
-- Changes to one object take consecutive sequences in the order given.
-- At most 100,000 changes a call (54000 beyond): a batch's rows and the
-- memory of its statement are the caller's to bound, and a larger import
-- calls it again, in the same transaction or not.
create or replace function watchpump.emit_many(p_objects text[], p_kinds text[], p_payloads jsonb[])
returns bigint[]
language plpgsql
set jit = off
set plan_cache_mode = force_generic_plan
-- Its joins are of whole batches (thousands of rows on both sides) that
-- the generic plan thinks are ten: hashed, never a nested loop over both.
set enable_nestloop = off
as $$
declare
    v_n           integer := coalesce(cardinality(p_objects), 0);
    v_settings    watchpump.settings;
    v_max_bytes   integer;
    v_window      interval;
    v_bytes       integer[];
    v_bad         record;
    v_traceparent text;
    v_tracestate  text;
    v_ids         bigint[];
    v_wake        boolean;
    v_floor       bigint := watchpump.id_floor();
begin
    if coalesce(cardinality(p_kinds), 0) <> v_n or coalesce(cardinality(p_payloads), 0) <> v_n then
        raise exception 'watchpump.emit_many: % objects, % kinds and % payloads: one of each per change',
            v_n, coalesce(cardinality(p_kinds), 0), coalesce(cardinality(p_payloads), 0)
            using errcode = '22023';
    end if;
    if v_n = 0 then
        return '{}';
    end if;
    if v_n > 100000 then
        raise exception 'watchpump.emit_many: % changes; the limit is 100000 a call', v_n
            using errcode = '54000', hint = 'call it again for the rest, in the same transaction if need be';
    end if;
    select * into v_settings from watchpump.settings;
    v_max_bytes := coalesce(v_settings.max_payload_bytes, 1048576);
    v_window := coalesce(v_settings.delivery_window, interval '24 hours');
    v_bytes := array(select octet_length(coalesce(p, '{}')::text) from unnest(p_payloads) as p);

    -- The first change emit() would refuse, refused as emit() does.
    select u.n, u.object, u.kind, u.bytes,
           watchpump.change_refusal(u.object, u.kind, u.bytes, v_max_bytes) as refusal
    into v_bad
    from unnest(p_objects, p_kinds, v_bytes) with ordinality as u (object, kind, bytes, n)
    where watchpump.change_refusal(u.object, u.kind, u.bytes, v_max_bytes) is not null
    order by u.n
    limit 1;
    if found then
        perform watchpump.refuse_change(format('watchpump.emit_many: change %s', v_bad.n), v_bad.refusal,
                                        v_bad.object, v_bad.kind, v_bad.bytes, v_max_bytes);
    end if;
    if v_settings.strict_kinds then
        perform watchpump.check_kind(u.kind, u.payload)
        from unnest(p_kinds, p_payloads) as u (kind, payload);
    end if;
    if coalesce(current_setting('watchpump.traceparent', true), '') <> ''
       or coalesce(current_setting('watchpump.tracestate', true), '') <> '' then
        select t.traceparent, t.tracestate into v_traceparent, v_tracestate from watchpump.trace_context() t;
    end if;

    -- One statement: each object's counter moves once by its number of
    -- changes (objects locked in their sort order, so that two batches
    -- cannot deadlock on them), each change takes its id and its sequence
    -- in the order given, and the deliveries are queued as emit() queues
    -- them. The watches that follow a change are those on the object
    -- itself and those on a prefix of it; the prefixes are worked out once
    -- per folder the batch's objects are in ('acme/web/refs/heads/'), not
    -- once per change: a batch's objects share a few folders.
    with input as materialized (
        select u.n, nextval('watchpump.change_ids') + v_floor as id, u.object, u.kind,
               coalesce(u.payload, '{}') as payload, u.bytes,
               left(u.object, length(u.object) - length(split_part(u.object, '/', -1))) as folder
        from unnest(p_objects, p_kinds, p_payloads, v_bytes) with ordinality as u (object, kind, payload, bytes, n)
    ),
    counted as (
        insert into watchpump.objects as o (object, last_sequence)
        select i.object, v_floor + count(*) from input i group by i.object order by i.object
        on conflict (object) do update
        set last_sequence = greatest(o.last_sequence, v_floor) + excluded.last_sequence - v_floor
        returning o.object, o.last_sequence
    ),
    numbered as (
        select i.*,
               c.last_sequence - count(*) over (partition by i.object)
                   + row_number() over (partition by i.object order by i.n) as sequence
        from input i
        join counted c on c.object = i.object
    ),
    change as (
        insert into watchpump.changes (id, object, kind, sequence, payload, payload_bytes, traceparent, tracestate)
        select n.id, n.object, n.kind, n.sequence, n.payload, n.bytes, v_traceparent, v_tracestate
        from numbered n
        order by n.n
        returning id, object, kind, sequence, payload, payload_bytes, occurred_at,
                  left(object, length(object) - length(split_part(object, '/', -1))) as folder
    ),
    folders as materialized (
        select f.folder, p.prefix
        from (select distinct i.folder from input i where i.folder <> '') f
        cross join lateral unnest(watchpump.object_prefixes(f.folder)) as p (prefix)
    ),
    following as (
        select c.id, c.object, c.kind, c.sequence, c.payload, c.payload_bytes, c.occurred_at, w.id as watch_id,
               w.service_id, w.kinds, w.match_path, w.match_is_predicate
        from change c
        join watchpump.watches w on w.object = c.object
        where w.removed_at is null
        union all
        select c.id, c.object, c.kind, c.sequence, c.payload, c.payload_bytes, c.occurred_at, w.id,
               w.service_id, w.kinds, w.match_path, w.match_is_predicate
        from change c
        join folders f on f.folder = c.folder and f.prefix <> c.object
        join watchpump.watches w on w.object = f.prefix
        where w.removed_at is null
    ),
    queued as (
        insert into watchpump.queue (change_id, watch_id, service_id, object, sequence, deadline, created_at,
                                     payload_bytes)
        select f.id, f.watch_id, f.service_id, f.object, f.sequence, now() + v_window, f.occurred_at,
               f.payload_bytes
        from following f
        where (f.kinds is null or f.kind = any (f.kinds))
          and (f.match_path is null or watchpump.payload_matches(f.payload, f.match_path, f.match_is_predicate))
        order by f.id, f.watch_id
        returning 1
    )
    select array_agg(i.id order by i.n),
           exists (select 1 from queued) and exists (select 1 from watchpump.sleepers)
    into v_ids, v_wake
    from input i;

    if v_wake then
        perform pg_notify('watchpump', '');
    end if;
    return v_ids;
end
$$;
