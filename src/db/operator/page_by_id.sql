-- One page of deliveries by id, newest first (`db::operator::page_by_id`).
-- $1 state, $2 service id, $3 watch id, $4 object, $5 object prefix,
-- $6 since, $7 until, $8 before (the previous page's last id), $9 limit;
-- each but the limit may be null: no condition.
--
-- Each `$n is null or ...` is a condition only when given: the statement
-- runs with `plan_cache_mode = force_custom_plan` (`custom_plans()`), so
-- PostgreSQL plans it with the values bound, folding a null's condition
-- away and a value's into a constant: the planner sees which partial
-- index fits, how rare the service is and the limit, as if they were
-- written in. A state the queue
-- (or the history) never holds makes its branch constant false, and the
-- planner leaves that table out.
--
-- Keyset-paginated in two steps, so that the plan cannot depend on
-- statistics that flip: first the page's ids, from the queue and from the
-- history separately, each an index scan that stops after `limit` rows
-- (the history's per-day partitions each walk an index backwards: its
-- primary key, `(service_id, id)`, `(object, id)`, or the partial index of
-- failed rows; a time filter leaves only its days); then each row of
-- `delivery_log`, one lookup by key per id, in a lateral subquery with
-- `limit 1` that the planner cannot flatten into a hash join, and with the
-- delivery's `created_at` (the history's partition key) so that each
-- lookup reads one day.
with page as (
    select u.id, u.created_at
    from ((select d.id, d.created_at
           from watchpump.queue d
           where ($1::text is null or $1 in ('pending', 'in_flight'))
             and ($1 is distinct from 'pending' or not watchpump.in_flight(d.lease_until))
             and ($1 is distinct from 'in_flight' or watchpump.in_flight(d.lease_until))
             and ($2::bigint is null or d.service_id = $2)
             and ($3::bigint is null or d.watch_id = $3)
             and ($4::text is null or d.object = $4)
             and ($5::text is null or starts_with(d.object, $5))
             and ($6::timestamptz is null or d.created_at >= $6)
             and ($7::timestamptz is null or d.created_at < $7)
             and ($8::bigint is null or d.id < $8)
           order by d.id desc
           limit $9)
          union all
          (select d.id, d.created_at
           from watchpump.settled d
           where ($1 is null or ($1 not in ('pending', 'in_flight') and d.state = $1))
             and ($2 is null or d.service_id = $2)
             and ($3 is null or d.watch_id = $3)
             and ($4 is null or d.object = $4)
             and ($5 is null or starts_with(d.object, $5))
             and ($6 is null or d.created_at >= $6)
             and ($7 is null or d.created_at < $7)
             and ($8 is null or d.id < $8)
           order by d.id desc
           limit $9)) u
    order by u.id desc
    limit $9
)
select l.delivery_id as "delivery_id!", l.created_at as "created_at!", l.service as "service!",
       l.watch_id as "watch_id!", l.resource as "resource!", l.watch_object as "watch_object!",
       l.object as "object!", l.kind as "kind!", l.change_id as "change_id!",
       l.sequence as "sequence!", l.state as "state!: State", l.attempts as "attempts!",
       l.next_attempt_at as "next_attempt_at!", l.deadline as "deadline!",
       l.finished_at as "finished_at?", l.last_status as "last_status?",
       l.last_error as "last_error?", l.superseded_by as "superseded_by?",
       l.last_action as "last_action?"
from page p
cross join lateral (
    select l.* from watchpump.delivery_log l
    where l.delivery_id = p.id and l.created_at = p.created_at
    limit 1
) l
order by p.id desc
