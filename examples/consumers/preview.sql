-- The preview example's own table (examples/consumers/preview.rs): one
-- preview environment per open merge request.
create table if not exists previews (
    merge_request  text primary key,
    head           text not null,
    url            text not null,
    sequence       bigint not null,
    updated_at     timestamptz not null default now()
);
