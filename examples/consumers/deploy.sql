-- The deploy example's own tables (examples/consumers/deploy.rs).

-- The apps this service deploys. A push for an app that is not here answers
-- 410: the producer then removes the watch.
create table if not exists apps (
    name        text primary key,
    created_at  timestamptz not null default now()
);
insert into apps (name) values ('web-prod') on conflict do nothing;

-- One row per push received. The handler stores a push as 'pending' and
-- supersedes the app's older pending push; the worker deploys the pending
-- one and marks it 'deployed'. So only the newest push waiting is deployed.
create table if not exists deploys (
    id           bigserial primary key,
    app          text not null,
    commit       text not null,
    sequence     bigint not null,
    delivery_id  bigint not null,
    state        text not null default 'pending'
                 check (state in ('pending', 'superseded', 'deployed')),
    received_at  timestamptz not null default now(),
    deployed_at  timestamptz
);
-- At most one push per app waits to be deployed.
create unique index if not exists deploys_one_pending on deploys (app) where state = 'pending';
