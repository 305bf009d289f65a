-- The most recent failures across services (`db::operator::newest_failures`):
-- $1 limit. Keyset in two steps like page_by_id.sql: the ids through the
-- partial index of failures by time, then each row by key in its day.
with page as (
    select d.id, d.created_at, d.finished_at
    from watchpump.settled d
    where d.state = 'failed'
    order by d.finished_at desc
    limit $1
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
order by p.finished_at desc, p.id desc
