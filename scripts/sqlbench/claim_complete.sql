-- pgbench: claim a batch of :batch deliveries as pump 'p' and report them
-- all delivered, in one statement.
select count(*) from watchpump.complete('p', (
    select array_agg(row(c.delivery_id, c.attempt, 'delivered', 200, null, now(), 1.0, 'HTTP/1.1 200',
                         null)::watchpump.attempt_report)
    from watchpump.claim('p', '{}', '{}', '{}', 1000, '1 minute', :batch) c));
