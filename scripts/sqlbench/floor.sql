-- pgbench: the least a delivery's storage can cost, for comparison with
-- claim_complete.sql: lease :batch due deliveries through the index
-- claim() reads (their changes read as claim() reads them), then move them
-- to the history as delivered. No order rule, no lease check, no attempt,
-- no PL/pgSQL: only the row work a queue and a history do.
with taken as (
    select q.id from watchpump.queue q
    where q.service_id = (select min(s.id) from watchpump.services s)
      and q.next_attempt_at <= now() and not coalesce(q.lease_until > now(), false)
    order by q.next_attempt_at limit :batch
    for update skip locked
),
leased as (
    update watchpump.queue q
    set attempts = q.attempts + 1, lease_until = now() + interval '1 minute', leased_by = 'p'
    from taken t where q.id = t.id
    returning q.id, q.change_id, q.created_at
)
select array_agg(l.id) as ids, count(c.payload) as n from leased l
join watchpump.changes c on c.id = l.change_id and c.occurred_at = l.created_at
\gset
with moved as (
    delete from watchpump.queue q where q.id = any (:ids::bigint[])
    returning q.*
)
insert into watchpump.settled (id, change_id, watch_id, service_id, object, state, attempts,
                               next_attempt_at, deadline, last_status, created_at, finished_at,
                               last_started_at, last_duration_ms, last_response_head, last_pump)
select m.id, m.change_id, m.watch_id, m.service_id, m.object, 'delivered', m.attempts,
       m.next_attempt_at, m.deadline, 200, m.created_at, clock_timestamp(),
       now(), 1.0, 'HTTP/1.1 200', 'p'
from moved m;
