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
-- One pump calls this every few seconds, so each part reads a partial index
-- whose size is the backlog, never the whole delivery history:
-- deliveries_due (pending), deliveries_in_flight_per_object (in_flight) and
-- deliveries_failed (0002_operator.sql; failed).
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
               count(*) as pending,
               count(*) filter (where d.next_attempt_at <= now()) as due_now,
               min(d.next_attempt_at) filter (where d.next_attempt_at <= now()) as oldest_due_at
        from watchpump.deliveries d
        where d.state = 'pending'
        group by d.service_id
    ),
    sending as (
        select d.service_id, count(*) as in_flight
        from watchpump.deliveries d
        where d.state = 'in_flight'
        group by d.service_id
    ),
    failed as (
        select d.service_id, count(*) as failed_24h
        from watchpump.deliveries d
        where d.state = 'failed' and d.finished_at > now() - interval '24 hours'
        group by d.service_id
    )
    select s.name,
           coalesce(w.pending, 0),
           coalesce(i.in_flight, 0),
           coalesce(w.due_now, 0),
           coalesce(f.failed_24h, 0),
           coalesce(extract(epoch from now() - w.oldest_due_at), 0)::double precision
    from watchpump.services s
    left join waiting w on w.service_id = s.id
    left join sending i on i.service_id = s.id
    left join failed f on f.service_id = s.id
    order by s.name
$$;
