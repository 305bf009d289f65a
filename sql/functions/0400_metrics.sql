-- The numbers behind the backlog gauges (src/metrics/backlog.rs): one row
-- per consumer service, every service included even when it has nothing
-- waiting, so that dashboards show a 0 rather than no data.
--
-- The definitions are those of the view watchpump.backlog:
--   pending         deliveries waiting to be sent, scheduled retries included
--   in_flight       deliveries a pump has claimed and is sending
--   due_now         pending deliveries whose next attempt is due
--   failed_24h      deliveries that ended 'failed' in the last 24 hours
--   oldest_due_age  seconds since the oldest due delivery became due
--                   (0 when nothing is due)
--
-- One pump calls this every few seconds: the queue is read once (it holds
-- only what is not settled), failures through the settled table's
-- partial index of failed rows (0002_operator.sql).
create or replace function watchpump.backlog_counts()
returns table (
    service         text,
    pending         bigint,
    in_flight       bigint,
    due_now         bigint,
    failed_24h      bigint,
    oldest_due_age  double precision
)
language sql stable as $$
    with waiting as (
        select d.service_id,
               count(*) filter (where not coalesce(d.lease_until > now(), false)) as pending,
               count(*) filter (where d.lease_until > now()) as in_flight,
               count(*) filter (where not coalesce(d.lease_until > now(), false)
                                  and d.next_attempt_at <= now()) as due_now,
               min(d.next_attempt_at) filter (where not coalesce(d.lease_until > now(), false)
                                                and d.next_attempt_at <= now()) as oldest_due_at
        from watchpump.queue d
        group by d.service_id
    ),
    failed as (
        select d.service_id, count(*) as failed_24h
        from watchpump.settled d
        where d.state = 'failed' and d.finished_at > now() - interval '24 hours'
        group by d.service_id
    )
    select s.name,
           coalesce(w.pending, 0),
           coalesce(w.in_flight, 0),
           coalesce(w.due_now, 0),
           coalesce(f.failed_24h, 0),
           coalesce(extract(epoch from now() - w.oldest_due_at), 0)::double precision
    from watchpump.services s
    left join waiting w on w.service_id = s.id
    left join failed f on f.service_id = s.id
    where s.removed_at is null
    order by s.name
$$;
