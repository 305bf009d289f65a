-- The docs_draft example's own table (examples/consumers/docs_draft.rs):
-- one draft of the docs per push that touched docs/.
create table if not exists drafts (
    branch       text not null,
    commit       text not null,
    pages        jsonb not null,
    sequence     bigint not null,
    built_at     timestamptz not null default now(),
    primary key (branch, commit)
);
