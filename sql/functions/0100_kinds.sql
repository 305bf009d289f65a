-- Strict mode: emit() checks each change against the kinds catalogue
-- (watchpump.kinds, 0007_kinds.sql) only when the producer turns it on,
-- for every connection at once (a producer's session cannot turn it off):
--
--   update watchpump.settings set strict_kinds = true;
--
-- With it off (the default) emit() reads neither the catalogue nor the
-- schemas: the settings row it reads anyway is all it costs.
--
-- The schema language is a bounded subset of JSON Schema, enforced when a
-- kind is added (src/kinds.rs): `type` (one or a list of object, array,
-- string, number, integer, boolean, null), `required`, `properties`,
-- `items` (one schema), `enum`, `additionalProperties: false`, and
-- annotations (`title`, `description`, `$schema`, `examples`), ignored
-- here.
--
-- What a check costs is bounded by its work, not by the payload's bytes:
--
-- - each payload node is checked against at most one schema node, and
--   nodes the schema does not describe are not visited;
-- - what one visit does does not grow with the schema: an object's keys
--   are looked up in its schema's `properties` (never the other way
--   round, which cost every property for every object, present or not),
--   and an `enum` is a set looked up by key (kind_compile(), once a
--   check), not a list scanned for every value: a 1,900-value enum on
--   the items of a 100,000-path payload once took emit() 46.5 s;
-- - every node visited, and every key or required name looked up, counts
--   one unit, and a check stops at kind_max_visits() units with SQLSTATE
--   54000 (program_limit_exceeded), as emit()'s other limits do.
--
-- tests/kinds.rs has a 1 MiB payload against the costliest schema the
-- catalogue accepts.

-- The most units one check may spend (docs/security.md, "Bounds"; src/kinds.rs
-- MAX_CHECK_UNITS says the same): twice the 100,000 paths of the payload
-- that found the enum scan, and about 1 s of the costliest visits on a
-- 2-core machine. Payloads past it are refused at once when they are
-- lists checked in one statement, or after that second.
create or replace function watchpump.kind_max_visits() returns integer
language sql immutable parallel safe as $$ select 200000 $$;

-- The key of a scalar in an enum's set: two scalars jsonb's `=` calls equal
-- have the same key (numbers by value: 1, 1.0 and 1e0 are one key).
-- Objects and arrays get their text, which no scalar's key equals (a
-- scalar's starts with a quote, a digit, a minus sign or a letter).
create or replace function watchpump.kind_key(p_value jsonb) returns text
language sql immutable parallel safe as $$
    select case jsonb_typeof(p_value) when 'number' then trim_scale(p_value::numeric)::text else p_value::text end
$$;

-- The key of a scalar in an enum's set: two scalars jsonb's `=` calls equal
-- have the same key (numbers by value: 1, 1.0 and 1e0 are one key).
-- Objects and arrays get their text, which no scalar's key equals (a
-- scalar's starts with a quote, a digit, a minus sign or a letter).
create or replace function watchpump.kind_key(p_value jsonb) returns text
language sql immutable parallel safe as $$
    select case jsonb_typeof(p_value) when 'number' then trim_scale(p_value::numeric)::text else p_value::text end
$$;

-- Whether `p_value` is of one of `p_types` (a type name or a list of
-- them; null allows any). An integral number is an integer too.
create or replace function watchpump.kind_type_ok(p_types jsonb, p_value jsonb) returns boolean
language sql immutable parallel safe as $$
    select p_types is null
        or p_types ? jsonb_typeof(p_value)
        or (jsonb_typeof(p_value) = 'number' and p_types ? 'integer'
            and p_value::numeric = trunc(p_value::numeric))
$$;

-- `p_schema` ready to be checked against, once a check. Each schema node
-- gets `$n`, a small summary a visit reads instead of copying the node:
-- `t`, its `type`, and `f`, the letters of what it asks for (E an enum,
-- C objects or arrays in it, R required names, P properties, A no other
-- properties, S items with structure, T items with only a type or an
-- enum); and each
-- `enum` list is also a set, `$enum_set` ({key: true}, looked up in
-- O(log n)), with its objects and arrays, which the catalogue no longer
-- accepts but an older declaration may hold, as `$enum_containers`
-- (compared one by one, each comparison a unit). `$`-names are not
-- keywords the catalogue accepts: none of a declared schema's own is
-- overwritten. The result is a new value in memory, never a compressed
-- or out-of-line one that each look-up would have to expand again.
create or replace function watchpump.kind_compile(p_schema jsonb) returns jsonb
language plpgsql immutable parallel safe as $$
declare
    v_out   jsonb := p_schema;
    v_flags text := '';
    v_items jsonb := p_schema->'items';
begin
    if jsonb_typeof(p_schema) <> 'object' then
        return '{"$n": {"f": ""}}';
    end if;
    if jsonb_typeof(p_schema->'enum') = 'array' then
        v_out := v_out || jsonb_build_object(
            '$enum_set', coalesce((select jsonb_object_agg(watchpump.kind_key(e), true)
                                   from jsonb_array_elements(p_schema->'enum') e
                                   where jsonb_typeof(e) not in ('object', 'array')), '{}'),
            '$enum_containers', coalesce((select jsonb_agg(e)
                                          from jsonb_array_elements(p_schema->'enum') e
                                          where jsonb_typeof(e) in ('object', 'array')), '[]'));
        v_flags := v_flags || 'E' || case when v_out->'$enum_containers' = '[]' then '' else 'C' end;
    end if;
    if jsonb_typeof(p_schema->'required') = 'array' and p_schema->'required' <> '[]' then
        v_flags := v_flags || 'R';
    end if;
    if jsonb_typeof(p_schema->'properties') = 'object' then
        v_out := jsonb_set(v_out, '{properties}',
                           (select coalesce(jsonb_object_agg(key, watchpump.kind_compile(value)), '{}')
                            from jsonb_each(p_schema->'properties')));
        v_flags := v_flags || 'P';
    end if;
    if p_schema->'additionalProperties' = 'false' then
        v_flags := v_flags || 'A';
    end if;
    if jsonb_typeof(v_items) = 'object' then
        v_items := watchpump.kind_compile(v_items);
        v_out := jsonb_set(v_out, '{items}', v_items);
        if v_items->'$n'->>'f' ~ '[CRPAST]' then
            v_flags := v_flags || 'S';
        elsif v_items ?| array['type', '$enum_set'] then
            v_flags := v_flags || 'T';
        end if;
    end if;
    return v_out || jsonb_build_object('$n', jsonb_strip_nulls(jsonb_build_object('f', v_flags, 't', p_schema->'type')));
end
$$;

-- A payload that does not fit: SQLSTATE 23514 (check_violation), the
-- message naming the kind and the misfit, the misfit alone as the detail
-- (for kind_violation()).
create or replace function watchpump.kind_misfit(p_kind text, p_problem text) returns integer
language plpgsql immutable parallel safe as $$
begin
    raise exception 'watchpump.emit: the payload does not fit the schema of kind "%": %', p_kind, p_problem
        using errcode = '23514', detail = p_problem;
end
$$;

-- `p_budget` less `p_units`, or SQLSTATE 54000 when that is below zero.
create or replace function watchpump.kind_spend(p_budget integer, p_units integer, p_kind text, p_at text)
returns integer
language plpgsql immutable parallel safe as $$
begin
    if p_budget >= p_units then
        return p_budget - p_units;
    end if;
    raise exception 'watchpump.emit: strict mode stopped checking the payload of kind "%" at %: checking it costs more than % units (nodes visited and keys looked up), the most one check may cost',
        p_kind, left(p_at, 200), watchpump.kind_max_visits()
        using errcode = '54000',
              hint = 'send a reference to the data (a commit id, a URL) rather than the data itself, or describe less of it in the schema';
end
$$;

-- Whether the scalar `p_value` is in the enum set of the node at `p_node`
-- of the compiled schema `p_root`: one look-up by key, nothing copied.
create or replace function watchpump.kind_in_set(p_root jsonb, p_node text[], p_value jsonb) returns boolean
language sql immutable parallel safe as $$
    select (p_root #> (p_node || array['$enum_set', watchpump.kind_key(p_value)])) is not null
$$;

-- Checks `p_value`, found at `p_at` (a jsonpath, '$.paths[2]'), against
-- the node at path `p_node` of the compiled schema `p_root` (kind_compile()),
-- spending at most `p_budget` units; returns what is left. Raises at the
-- first misfit (kind_misfit()) or when the budget runs out (kind_spend()).
--
-- The schema is passed whole and read by path (`#>`, which walks the
-- stored value in place): taking a node out (`->`) would copy it, enum
-- and properties included, at every visit. And no `set` clause: it would
-- save and restore settings at every call, and this runs once a node.
create or replace function watchpump.kind_walk(p_root jsonb, p_node text[], p_value jsonb, p_at text,
                                               p_budget integer, p_kind text)
returns integer
language plpgsql immutable parallel safe as $$
declare
    v_node  jsonb := p_root #> (p_node || '$n'::text);
    v_flags text := coalesce(v_node->>'f', '');
    v_type  text := jsonb_typeof(p_value);
    v_types jsonb := v_node->'t';
    v_items text[];
    v_key   text;
    v_sub   jsonb;
    v_index integer;
    v_fits  boolean;
begin
    p_budget := p_budget - 1;
    if p_budget < 0 then
        perform watchpump.kind_spend(0, 1, p_kind, p_at);
    end if;
    if not watchpump.kind_type_ok(v_types, p_value) then
        if jsonb_typeof(v_types) = 'string' then
            v_types := jsonb_build_array(v_types);
        end if;
        return watchpump.kind_misfit(p_kind, format('%s: expected %s, got %s', p_at,
            array_to_string(array(select jsonb_array_elements_text(v_types)), ' or '), v_type));
    end if;
    if strpos(v_flags, 'E') > 0 then
        if v_type in ('object', 'array') then
            v_sub := p_root #> (p_node || '$enum_containers'::text);
            p_budget := watchpump.kind_spend(p_budget, jsonb_array_length(v_sub), p_kind, p_at);
            v_fits := exists (select 1 from jsonb_array_elements(v_sub) c where c = p_value);
        else
            v_fits := watchpump.kind_in_set(p_root, p_node, p_value);
        end if;
        if not v_fits then
            return watchpump.kind_misfit(p_kind, format('%s: %s is not one of %s', p_at,
                left(p_value::text, 100), left((p_root #> (p_node || 'enum'::text))::text, 200)));
        end if;
    end if;

    if v_type = 'object' then
        if strpos(v_flags, 'R') > 0 then
            v_sub := p_root #> (p_node || 'required'::text);
            p_budget := watchpump.kind_spend(p_budget, jsonb_array_length(v_sub), p_kind, p_at);
            select r into v_key from jsonb_array_elements_text(v_sub) r where not p_value ? r limit 1;
            if found then
                return watchpump.kind_misfit(p_kind, format('%s: required property "%s" is missing', p_at, v_key));
            end if;
        end if;
        if v_flags ~ '[PA]' and p_value <> '{}' then
            -- The object's own keys, each looked up in the schema's
            -- properties (never each property in the object, which cost
            -- every property of the schema for every object): an object
            -- costs a unit per key, whatever the schema lists.
            for v_key, v_sub in select e.key, e.value from jsonb_each(p_value) e loop
                p_budget := p_budget - 1;
                if p_budget < 0 then
                    perform watchpump.kind_spend(0, 1, p_kind, p_at);
                end if;
                if (p_root #> (p_node || array['properties', v_key])) is not null then
                    p_budget := watchpump.kind_walk(p_root, p_node || array['properties', v_key], v_sub,
                        p_at || '.' || case when v_key ~ '^[A-Za-z_][A-Za-z0-9_]*$' then v_key else to_json(v_key)::text end,
                        p_budget, p_kind);
                elsif strpos(v_flags, 'A') > 0 then
                    return watchpump.kind_misfit(p_kind, format('%s: property "%s" is not allowed', p_at, v_key));
                end if;
            end loop;
        end if;
    elsif v_type = 'array' and strpos(v_flags, 'S') > 0 then
        -- Items with structure: each is visited in turn.
        v_items := p_node || 'items'::text;
        for v_index, v_sub in select o - 1, e from jsonb_array_elements(p_value) with ordinality a(e, o) loop
            p_budget := watchpump.kind_walk(p_root, v_items, v_sub, p_at || '[' || v_index || ']', p_budget, p_kind);
        end loop;
    elsif v_type = 'array' and strpos(v_flags, 'T') > 0 then
        -- Items with only a type or an enum, the common case (a list of
        -- paths, of labels): one statement over the array, paid for before
        -- it runs, rather than a call per item; the first misfit is
        -- visited to say why.
        p_budget := watchpump.kind_spend(p_budget, jsonb_array_length(p_value), p_kind, p_at || '[*]');
        v_items := p_node || 'items'::text;
        v_node := p_root #> (v_items || '$n'::text);
        v_types := v_node->'t';
        v_fits := strpos(v_node->>'f', 'E') = 0; -- any value, as far as an enum goes
        select o - 1, e into v_index, v_sub
        from jsonb_array_elements(p_value) with ordinality a(e, o)
        where not (watchpump.kind_type_ok(v_types, e) and (v_fits or watchpump.kind_in_set(p_root, v_items, e)))
        order by o limit 1;
        if found then
            return watchpump.kind_walk(p_root, v_items, v_sub, p_at || '[' || v_index || ']', p_budget + 1, p_kind);
        end if;
    end if;
    return p_budget;
end
$$;

-- The first way `p_value` does not fit `p_schema`, as '<where>: <why>', or
-- null when it fits. `p_at` is where `p_value` is, as a jsonpath ('$').
-- For `watchpump kinds add` (an example must fit its schema) and for
-- tests; emit() calls check_kind().
create or replace function watchpump.kind_violation(p_schema jsonb, p_value jsonb, p_at text)
returns text
language plpgsql immutable
set jit = off
as $$
declare
    v_problem text;
begin
    perform watchpump.kind_walk(watchpump.kind_compile(p_schema), '{}', p_value, p_at, watchpump.kind_max_visits(), null);
    return null;
exception when check_violation then
    get stacked diagnostics v_problem = pg_exception_detail;
    return v_problem;
end
$$;

-- Called by emit() and emit_many() when strict mode is on: refuses an
-- undeclared kind (SQLSTATE 22023, invalid_parameter_value), a payload
-- that does not fit its kind's schema (23514, check_violation), with a
-- message naming the kind, and a check that would cost more than
-- kind_max_visits() units (54000). Refusing raises, so the caller's
-- transaction is rolled back (or its savepoint), as for any other error.
create or replace function watchpump.check_kind(p_kind text, p_payload jsonb) returns void
language plpgsql stable
set jit = off
as $$
declare
    v_schema  jsonb;
begin
    select k.schema into v_schema from watchpump.kinds k where k.name = p_kind;
    if not found then
        raise exception 'watchpump.emit: kind "%" is not declared in watchpump.kinds (strict mode, watchpump.settings.strict_kinds, is on): declare it with `watchpump kinds add`', left(p_kind, 100)
            using errcode = '22023';
    end if;
    perform watchpump.kind_walk(watchpump.kind_compile(v_schema), '{}', coalesce(p_payload, '{}'), '$',
                                watchpump.kind_max_visits(), p_kind);
end
$$;
