-- Strict mode: emit() checks each change against the kinds catalogue
-- (watchpump.kinds, 0007_kinds.sql) only when the producer turns it on:
--
--   alter database mydb set watchpump.strict_kinds = on;
--
-- With it off (the default) emit() reads neither the catalogue nor the
-- schemas: the one `current_setting()` at its top is all it costs.
--
-- The schema language is a bounded subset of JSON Schema, enforced when a
-- kind is added (src/kinds.rs): `type` (one or a list of object, array,
-- string, number, integer, boolean, null), `required`, `properties`,
-- `items` (one schema), `enum`, `additionalProperties: false`, and
-- annotations (`title`, `description`, `$schema`, `examples`), ignored
-- here. Each payload node is checked against at most one schema node, and
-- nodes the schema does not describe are not visited, so a check costs one
-- pass over (part of) the payload, times the size of the schema node
-- (16 KiB at most).

-- The first way `p_value` does not fit `p_schema`, as '<where>: <why>', or
-- null when it fits. `p_at` is where `p_value` is, as a jsonpath ('$.paths[2]').
create or replace function watchpump.kind_violation(p_schema jsonb, p_value jsonb, p_at text)
returns text
language plpgsql immutable parallel safe
set jit = off
as $$
declare
    v_type  text := jsonb_typeof(p_value);
    v_types jsonb := p_schema->'type';
    v_items jsonb := p_schema->'items';
    v_key   text;
    v_sub   jsonb;
    v_problem text;
    v_index integer;
begin
    if jsonb_typeof(v_types) = 'string' then
        v_types := jsonb_build_array(v_types);
    end if;
    if v_types is not null and not (
           v_types ? v_type
           or (v_type = 'number' and v_types ? 'integer'
               and p_value::numeric = trunc(p_value::numeric))) then
        return format('%s: expected %s, got %s', p_at,
                      array_to_string(array(select jsonb_array_elements_text(v_types)), ' or '), v_type);
    end if;
    if p_schema ? 'enum' and not exists (
           select 1 from jsonb_array_elements(p_schema->'enum') e(v) where e.v = p_value) then
        return format('%s: %s is not one of %s', p_at, left(p_value::text, 100), left((p_schema->'enum')::text, 200));
    end if;

    if v_type = 'object' then
        for v_key in select jsonb_array_elements_text(p_schema->'required') loop
            if not p_value ? v_key then
                return format('%s: required property "%s" is missing', p_at, v_key);
            end if;
        end loop;
        for v_key, v_sub in select key, value from jsonb_each(p_schema->'properties') loop
            if p_value ? v_key then
                v_problem := watchpump.kind_violation(v_sub, p_value->v_key, p_at || '.' || case when v_key ~ '^[A-Za-z_][A-Za-z0-9_]*$' then v_key
                                                                     else to_json(v_key)::text end);
                if v_problem is not null then
                    return v_problem;
                end if;
            end if;
        end loop;
        if p_schema->'additionalProperties' = 'false' then
            select k into v_key from jsonb_object_keys(p_value) k
            where not coalesce(p_schema->'properties', '{}') ? k limit 1;
            if found then
                return format('%s: property "%s" is not allowed', p_at, v_key);
            end if;
        end if;
    elsif v_type = 'array' and jsonb_typeof(v_items) = 'object' then
        if not (v_items - array['type', 'title', 'description', 'examples']) = '{}' then
            -- Items with structure: each is checked in turn.
            for v_index, v_sub in select o - 1, e from jsonb_array_elements(p_value) with ordinality a(e, o) loop
                v_problem := watchpump.kind_violation(v_items, v_sub, p_at || '[' || v_index || ']');
                if v_problem is not null then
                    return v_problem;
                end if;
            end loop;
        elsif v_items ? 'type' then
            -- Items with only a type, the common case (a list of paths):
            -- one statement over the array rather than a call per item.
            v_types := v_items->'type';
            if jsonb_typeof(v_types) = 'string' then
                v_types := jsonb_build_array(v_types);
            end if;
            select o - 1, e into v_index, v_sub
            from jsonb_array_elements(p_value) with ordinality a(e, o)
            where not (v_types ? jsonb_typeof(e)
                       or (jsonb_typeof(e) = 'number' and v_types ? 'integer'
                           and e::numeric = trunc(e::numeric)))
            order by o limit 1;
            if found then
                return watchpump.kind_violation(v_items, v_sub, p_at || '[' || v_index || ']');
            end if;
        end if;
    end if;
    return null;
end
$$;

-- Called at the top of emit() when watchpump.strict_kinds is on: refuses an
-- undeclared kind (SQLSTATE 22023, invalid_parameter_value) and a payload
-- that does not fit its kind's schema (23514, check_violation), with a
-- message naming the kind. Refusing raises, so the caller's transaction is
-- rolled back (or its savepoint), as for any other error.
create or replace function watchpump.check_kind(p_kind text, p_payload jsonb) returns void
language plpgsql stable
set jit = off
as $$
declare
    v_schema  jsonb;
    v_problem text;
begin
    select k.schema into v_schema from watchpump.kinds k where k.name = p_kind;
    if not found then
        raise exception 'watchpump.emit: kind "%" is not declared in watchpump.kinds (strict mode, watchpump.strict_kinds, is on): declare it with `watchpump kinds add`', left(p_kind, 100)
            using errcode = '22023';
    end if;
    v_problem := watchpump.kind_violation(v_schema, coalesce(p_payload, '{}'), '$');
    if v_problem is not null then
        raise exception 'watchpump.emit: the payload does not fit the schema of kind "%": %', p_kind, v_problem
            using errcode = '23514';
    end if;
end
$$;
