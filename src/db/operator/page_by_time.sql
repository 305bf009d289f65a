-- One page of deliveries in creation order, newest first
-- (`db::operator::page_by_time`): a time window (`until`) with no other
-- filter. $1 since (or null), $2 until, $3 before (the previous page's
-- last delivery, or null), $4 limit.
--
-- The history's index on `(created_at, id)` reads it backwards from
-- `until` and stops after the page, at any history; the rest is as in
-- page_by_id.sql (a custom plan, ids first, then one lookup by key each).
--
-- `cursor` is where the previous page ended: its last delivery's creation
-- time, in the queue or the history (one probe of each day's index on id).
-- A cursor that retention has since removed finds none, and the listing
-- ends there.
with cursor as (
    select coalesce((select c.created_at from watchpump.queue c where c.id = $3::bigint),
                    (select c.created_at from watchpump.settled c where c.id = $3)) as created_at
),
page as (
    select u.id, u.created_at
    from ((select d.id, d.created_at
           from watchpump.queue d
           where ($1::timestamptz is null or d.created_at >= $1)
             and d.created_at < $2::timestamptz
             and ($3 is null or (d.created_at, d.id) < ((select created_at from cursor), $3))
           order by d.created_at desc, d.id desc
           limit $4)
          union all
          (select d.id, d.created_at
           from watchpump.settled d
           where ($1 is null or d.created_at >= $1)
             and d.created_at < $2
             and ($3 is null or (d.created_at, d.id) < ((select created_at from cursor), $3))
           order by d.created_at desc, d.id desc
           limit $4)) u
    order by u.created_at desc, u.id desc
    limit $4
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
order by p.created_at desc, p.id desc
