//! Retention under chaos (issue 18): days of history ten days old and more
//! are made by SQL and retired beside the producers, the pumps and the
//! faults, with `prune()` called again and again as the operator task does
//! (which the pumps' own operator task does too). A retirement that cannot
//! take its locks within 100 ms, or loses its connection to a restart,
//! rolls back and is tried again. Afterwards, each day made has left
//! exactly its failures, each with its change and its attempt, and nothing
//! else.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;

/// Deliveries in each day made; one in 20 failed.
const PER_DAY: i32 = 1_000;
/// Days made at most: 10, 11, ... days ago.
const MAX_DAYS: i32 = 12;

/// What the retention actor did.
#[derive(Debug, Clone, Default)]
pub struct Retention {
    /// Days made (each with its failures counted), and retired.
    pub days: Vec<(i32, i64)>,
    pub retired: usize,
    pub prune_calls: usize,
    /// prune() calls that failed (a restart, a failover, a cut).
    pub prune_errors: usize,
}

/// Makes a day now and then and prunes, until `done`.
pub async fn run(pool: PgPool, done: Arc<AtomicBool>) -> Retention {
    let mut did = Retention::default();
    let Some((service, watch)) = a_watch(&pool).await else {
        return did;
    };
    let mut next_day = 10;
    while !done.load(Ordering::SeqCst) {
        if next_day < 10 + MAX_DAYS {
            if let Some(failures) = make_day(&pool, next_day, service, watch).await {
                did.days.push((next_day, failures));
                next_day += 1;
            }
        }
        prune_once(&pool, &mut did).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    did
}

/// After the chaos: prunes until no day made is left whole, then says what
/// each day left that it should not have, or lacks.
pub async fn verdict(pool: &PgPool, did: &mut Retention, limit: Duration) -> Vec<String> {
    let started = Instant::now();
    let mut violations = Vec::new();
    if did.days.is_empty() {
        return violations;
    }
    loop {
        let whole: Result<i64, _> = sqlx::query_scalar(
            "select count(*) from watchpump.partitions
             where not kept and to_at < now() - interval '9 days'",
        )
        .fetch_one(pool)
        .await;
        if whole.as_ref().is_ok_and(|n| *n == 0) {
            break;
        }
        if started.elapsed() > limit {
            violations.push(format!(
                "retention: days past retention still whole: {whole:?}"
            ));
            return violations;
        }
        prune_once(pool, did).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (days_ago, failures) in &did.days {
        let (failed, other, complete): (i64, i64, i64) = sqlx::query_as(
            "select count(*) filter (where s.state = 'failed'),
                    count(*) filter (where s.state <> 'failed'),
                    count(*) filter (where s.state = 'failed'
                        and exists (select 1 from watchpump.changes c where c.id = s.change_id)
                        and exists (select 1 from watchpump.attempt_log a where a.delivery_id = s.id))
             from watchpump.settled s where s.object like $1",
        )
        .bind(format!("retention/d{days_ago}/%"))
        .fetch_one(pool)
        .await
        .unwrap();
        if (failed, other, complete) != (*failures, 0, *failures) {
            violations.push(format!(
                "retention: the day {days_ago} days ago left {failed} failures ({complete} with \
                 their change and attempt) and {other} other deliveries; {failures} failures expected"
            ));
        }
    }
    violations
}

async fn a_watch(pool: &PgPool) -> Option<(i64, i64)> {
    sqlx::query_as("select service_id, id from watchpump.watches order by id limit 1")
        .fetch_optional(pool)
        .await
        .ok()
        .flatten()
}

async fn prune_once(pool: &PgPool, did: &mut Retention) {
    did.prune_calls += 1;
    let kept_before = kept_partitions(pool).await;
    match sqlx::query("select * from watchpump.prune('7 days', '30 days', 500)")
        .execute(pool)
        .await
    {
        Ok(_) => {
            if let (Some(before), Some(after)) = (kept_before, kept_partitions(pool).await) {
                if after > before {
                    did.retired += 1;
                }
            }
        }
        Err(_) => did.prune_errors += 1,
    }
}

async fn kept_partitions(pool: &PgPool) -> Option<i64> {
    sqlx::query_scalar(
        "select count(*) from watchpump.partitions where kept and parent = 'settled'",
    )
    .fetch_one(pool)
    .await
    .ok()
}

/// A day `days_ago` days ago with PER_DAY deliveries of objects
/// retention/d<days_ago>/<n> to one watch (one transaction: all or nothing),
/// and the number of its failures. None if the database failed meanwhile
/// and the day is not there (it is made again later); a day whose
/// statement committed unseen is counted from the database.
async fn make_day(pool: &PgPool, days_ago: i32, service: i64, watch: i64) -> Option<i64> {
    let _ = sqlx::query(
        "select watchpump.add_partition(t, d, d + interval '1 day')
         from unnest(array['changes', 'settled', 'attempt_log']) t,
              (select date_trunc('day', now() at time zone 'UTC') at time zone 'UTC'
                      - $1 * interval '1 day' as d) day
         where not exists (select from watchpump.partitions p where p.parent = t and p.from_at = d)",
    )
    .bind(days_ago)
    .execute(pool)
    .await;
    let fill = sqlx::query(
        "with day as (select date_trunc('day', now() at time zone 'UTC') at time zone 'UTC'
                             - $1 * interval '1 day' as d),
         c as (
             insert into watchpump.changes (object, kind, sequence, payload, occurred_at, payload_bytes)
             select 'retention/d' || $1 || '/' || n, 'push', 1, jsonb_build_object('n', n),
                    d + n * (interval '1 day' / ($2 + 1)), 8
             from day, generate_series(1, $2) n
             returning id, object, occurred_at
         ),
         s as (
             insert into watchpump.settled (id, change_id, watch_id, service_id, object, state, attempts,
                                            next_attempt_at, deadline, last_status, created_at,
                                            finished_at, last_pump)
             select nextval('watchpump.delivery_ids'), c.id, $4, $3, c.object,
                    case when c.id % 20 = 0 then 'failed' else 'delivered' end, 1, c.occurred_at,
                    c.occurred_at + interval '1 day',
                    case when c.id % 20 = 0 then 500 else 200 end,
                    c.occurred_at, c.occurred_at + interval '1 second', 'chaos'
             from c
             returning id, state, created_at
         )
         insert into watchpump.attempt_log (delivery_id, attempt, started_at, duration_ms, status, pump)
         select s.id, 1, s.created_at, 1, 500, 'chaos' from s where s.state = 'failed'",
    )
    .bind(days_ago)
    .bind(PER_DAY)
    .bind(service)
    .bind(watch);
    // Every other day's failures are also written where retention keeps
    // them, as settle() does when they fail (0017_staged_failures.sql):
    // those days are retired by swapping that table in, the others by
    // copying, and both meet the faults.
    let made: Result<(), sqlx::Error> = async {
        let mut tx = pool.begin().await?;
        fill.execute(&mut *tx).await?;
        if days_ago % 2 == 0 {
            sqlx::query(
                "select watchpump.stage_failed(array(
                     select s.id from watchpump.settled s
                     where s.state = 'failed' and s.object like 'retention/d' || $1 || '/%'))",
            )
            .bind(days_ago)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await
    }
    .await;
    let _ = made;
    // The failures are what a retirement keeps, so counting them is right
    // whether or not a prune() (this task's, or the pumps' operator task's)
    // retired the day meanwhile.
    for _ in 0..50 {
        let counted: Result<(i64, i64), _> = sqlx::query_as(
            "select count(*), count(*) filter (where state = 'failed')
             from watchpump.settled where object like $1",
        )
        .bind(format!("retention/d{days_ago}/%"))
        .fetch_one(pool)
        .await;
        match counted {
            Ok((0, _)) => return None,
            Ok((_, failures)) => return Some(failures),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    None
}
