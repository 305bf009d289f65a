-- The kinds catalogue: each kind of change the producer emits, with the
-- JSON Schema its payload follows and an example payload, for consumer
-- teams to read (`GET /api/v1/kinds`, `watchpump kinds list`) and, when the
-- producer turns on strict mode, for emit() to check payloads against
-- (watchpump.check_kind(), sql/functions/0150_kinds.sql).
--
-- Schemas are kept within the subset check_kind() understands (type,
-- required, properties, items, enum, additionalProperties: false, and
-- annotations), at most 16 KiB and 8 levels deep; `watchpump kinds add`
-- (src/kinds.rs) refuses anything else, so that strict mode costs emit()
-- one pass over the part of the payload the schema describes.
create table watchpump.kinds (
    name         text primary key,
    description  text not null default '',
    schema       jsonb not null,
    example      jsonb not null,
    created_at   timestamptz not null default now(),
    updated_at   timestamptz not null default now(),
    constraint kinds_name_check check (name <> '' and length(name) <= 100),
    constraint kinds_schema_size check (pg_column_size(schema) <= 16384),
    constraint kinds_example_is_object check (jsonb_typeof(example) = 'object')
);
