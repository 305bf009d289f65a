-- emit(): record a change and fan it out to every matching live watch, in the
-- caller's transaction. A rolled-back transaction leaves no change and no
-- delivery behind, so nothing is ever sent for it.
--
-- Plans, for every function in sql/functions that runs per change or per
-- delivery (emit() here, the pump's in 0200_pump.sql): they are PL/pgSQL
-- with `set jit = off`, because JIT compiles for milliseconds what runs in
-- microseconds, and `set plan_cache_mode = force_generic_plan`, because the
-- generic plans are right for every call (checked with EXPLAIN) and
-- planning each call again cost more than running it. This note is not
-- repeated at each of them.

-- How long deliveries are retried. Override per database with
--   alter database mydb set watchpump.delivery_window = '6 hours';
create or replace function watchpump.delivery_window() returns interval
language sql stable as $$
    select coalesce(nullif(current_setting('watchpump.delivery_window', true), '')::interval,
                    interval '24 hours')
$$;

-- The object itself and each of its prefixes that ends in '/':
-- 'acme/web/main' -> {acme/, acme/web/, acme/web/main}. A watch on any of
-- them follows the object, and each is an index lookup on watches.object.
-- (PL/pgSQL rather than SQL: a SQL function that cannot be inlined is
-- parsed and planned again at every call, which cost emit() 0.2 ms.)
create or replace function watchpump.object_prefixes(p_object text) returns text[]
language plpgsql immutable strict parallel safe as $$
declare
    v_prefixes text[] := '{}';
    v_at integer := 0;
    v_next integer;
begin
    loop
        v_next := strpos(substr(p_object, v_at + 1), '/');
        exit when v_next = 0 or v_at + v_next >= length(p_object);
        v_at := v_at + v_next;
        v_prefixes := v_prefixes || left(p_object, v_at);
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

create or replace function watchpump.emit(p_object text, p_kind text, p_payload jsonb default '{}')
returns bigint
language plpgsql
set jit = off
set plan_cache_mode = force_generic_plan
as $$
declare
    v_sequence bigint;
    v_change   bigint;
    v_deadline timestamptz := now() + watchpump.delivery_window();
begin
    if current_setting('watchpump.strict_kinds', true) = 'on' then perform watchpump.check_kind(p_kind, p_payload); end if;
    if p_object is null or p_object = '' then
        raise exception 'watchpump.emit: object must not be empty' using errcode = '22023';
    end if;
    if p_kind is null or p_kind = '' then
        raise exception 'watchpump.emit: kind must not be empty' using errcode = '22023';
    end if;

    -- The counter row stays locked until the caller commits: emitters to one
    -- object queue here and commit in sequence order.
    insert into watchpump.objects as o (object, last_sequence)
    values (p_object, 1)
    on conflict (object) do update set last_sequence = o.last_sequence + 1
    returning o.last_sequence into v_sequence;

    insert into watchpump.changes (object, kind, sequence, payload)
    values (p_object, p_kind, v_sequence, coalesce(p_payload, '{}'))
    returning id into v_change;

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
    if pg_column_size(p_payload) < 8192 then
        insert into watchpump.queue (change_id, watch_id, service_id, object, deadline)
        select v_change, w.id, w.service_id, p_object, v_deadline
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
        insert into watchpump.queue (change_id, watch_id, service_id, object, deadline)
        select v_change, c.id, c.service_id, p_object, v_deadline
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
