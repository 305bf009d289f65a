-- One day (:day days ago) of :per_day deliveries to every watch, one in
-- :fail_every failed (with one attempt). psql -v day=10 -v per_day=2500000
-- -v fail_every=20 -f fill_day.sql
set synchronous_commit = off;
select watchpump.add_partition(t, d, d + interval '1 day')
from unnest(array['changes', 'settled', 'attempt_log']) t,
     lateral (select date_trunc('day', now() at time zone 'UTC') at time zone 'UTC' - :day * interval '1 day' as d) day
where not exists (select from watchpump.partitions p where p.parent = t and p.from_at = d);
with day as (select date_trunc('day', now() at time zone 'UTC') at time zone 'UTC' - :day * interval '1 day' as d),
c as (
    insert into watchpump.changes (object, kind, sequence, payload, occurred_at, payload_bytes)
    select 'acme/repo/refs/heads/h' || (n % 100000), 'push', n,
           '{"after": "9f2c1e", "paths": ["src/main.rs"]}',
           d + n * (interval '1 day' / :per_day), 50
    from day, generate_series(1, :per_day) n
    returning id, object, occurred_at
),
s as (
    insert into watchpump.settled (id, change_id, watch_id, service_id, object, state,
                                   attempts, next_attempt_at, deadline, last_status,
                                   last_error, created_at, finished_at, last_started_at,
                                   last_duration_ms, last_pump)
    select nextval('watchpump.delivery_ids'), c.id, w.id, w.service_id, c.object,
           case when c.id % :fail_every = 0 then 'failed' else 'delivered' end,
           case when c.id % :fail_every = 0 then 2 else 1 end, c.occurred_at,
           c.occurred_at + interval '1 day',
           case when c.id % :fail_every = 0 then 503 else 200 end,
           case when c.id % :fail_every = 0 then 'deadline passed; last error: HTTP 503' end,
           c.occurred_at, c.occurred_at + interval '40 ms',
           c.occurred_at + interval '30 ms', 4.5, 'bench'
    from c cross join watchpump.watches w
    returning id, state, created_at
)
insert into watchpump.attempt_log (delivery_id, attempt, started_at, duration_ms, status,
                                   error, pump, first_status, first_error, statuses)
select s.id, 1, s.created_at + interval '10 ms', 5, 503, 'HTTP 503', 'bench', 503,
       'HTTP 503', '{"503": 1}'
from s where s.state = 'failed';
-- As settle() does when they fail (0017_staged_failures.sql): the failures
-- written where retention keeps them too.
select watchpump.stage_failed(array(
    select s.id from watchpump.settled s
    where s.state = 'failed'
      and s.created_at >= date_trunc('day', now() at time zone 'UTC') at time zone 'UTC' - :day * interval '1 day'
      and s.created_at < date_trunc('day', now() at time zone 'UTC') at time zone 'UTC' - (:day - 1) * interval '1 day'));
