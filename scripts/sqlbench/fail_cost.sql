-- pgbench: claim a batch of :batch deliveries as pump 'p' and report each
-- answered 503 past its deadline, so that complete() settles it failed.
select count(*) from watchpump.complete('p', (
    select array_agg(row(c.delivery_id, c.attempt, 'retry', 503, 'HTTP 503', now(), 1.0, 'HTTP/1.1 503',
                         now())::watchpump.attempt_report)
    from watchpump.claim('p', '{}', '{}', '{}', 1000, '1 minute', :batch) c));
