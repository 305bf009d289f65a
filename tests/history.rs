//! The history tells the truth (issue 18): a delivered delivery shows the
//! answer that delivered it, the last retry is made at the deadline and
//! "failed" means the deadline passed, a failure an operator retried stays
//! in the history, the delivery window is read where each delivery is
//! created, and the sweep reports only what it did.
//! (A NULL payload is `{}` for filters too: tests/bounds.rs.)

mod common;
#[path = "fixtures/storage_v2/mod.rs"]
mod storage_v2;

use std::time::Duration;

use common::prometheus::Scrape;
use common::*;
use serde_json::json;
use sqlx::{Column, Row};

const WAIT: Duration = Duration::from_secs(30);

/// A delivery that failed (its consumer answered 500 until its one-second
/// window passed), then retried by an operator and delivered.
async fn failed_then_delivered(db: &TestDb) -> i64 {
    let pump = RunningPump::start(&db.pool, pump_config());
    let (consumer, id) = failed_delivery(db, "deploy", "acme/web/main", json!({})).await;
    consumer.reply_with(200);
    sqlx::query("select watchpump.retry($1, 'ada')")
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    db.wait_state(id, "delivered", WAIT).await;
    pump.stop().await.unwrap();
    id
}

#[tokio::test]
async fn a_delivered_delivery_shows_its_delivering_answer_and_keeps_earlier_errors_in_its_attempts()
{
    let db = TestDb::new().await;
    let id = failed_then_delivered(&db).await;

    let (status, error): (Option<i32>, Option<String>) = sqlx::query_as(
        "select last_status, last_error from watchpump.delivery_log where delivery_id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((status, error), (Some(200), None));
    let settled_error: Option<String> =
        sqlx::query_scalar("select last_error from watchpump.settled where id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(settled_error, None, "no error beside status 200");

    // The earlier failures are still there, in the attempts.
    let failures: Vec<(Option<i32>, Option<String>)> = sqlx::query_as(
        "select status, error from watchpump.attempts
         where delivery_id = $1 and status is distinct from 200 order by attempt",
    )
    .bind(id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(!failures.is_empty());
    assert!(
        failures.iter().all(|(s, _)| *s == Some(500)),
        "{failures:?}"
    );
}

#[tokio::test]
async fn the_history_keeps_a_failure_that_an_operator_retried() {
    let db = TestDb::new().await;
    let id = failed_then_delivered(&db).await;

    let events: Vec<(String, Option<String>)> = sqlx::query_as(
        "select event, detail from watchpump.delivery_history
         where delivery_id = $1 order by at, seq",
    )
    .bind(id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    let failed = names
        .iter()
        .position(|e| *e == "failed")
        .unwrap_or_else(|| panic!("the failure is kept: {names:?}"));
    assert_eq!(names[failed + 1], "retry", "{names:?}");
    assert_eq!(names.last(), Some(&"delivered"), "{names:?}");
    let detail = events[failed].1.as_deref().unwrap_or_default();
    assert!(detail.contains("deadline passed"), "{detail}");
}

/// A delivery claimed by pump "p" by hand, as a pump would.
async fn claimed(db: &TestDb, object: &str) -> (i64, i32) {
    let change = db.emit(object, "push", json!({})).await;
    let id = delivery_of(db, change).await;
    sqlx::query_as(
        "select delivery_id, attempt from watchpump.claim('p', '{}', 10, '1 minute')
         where delivery_id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// A report of pump `pump`: attempt `attempt` of delivery `id` ended with
/// `outcome` and HTTP `status`, its back-off saying `next` (SQL). Returns
/// where the delivery stands, and whether a pending one is due at its
/// deadline.
async fn report_as(
    db: &TestDb,
    pump: &str,
    (id, attempt): (i64, i32),
    (outcome, status): (&str, i32),
    next: &str,
) -> Vec<(String, Option<bool>)> {
    sqlx::query_as(&format!(
        "select c.state, c.next_attempt_at = q.deadline
         from watchpump.complete($1, array[row($2, $3, $4, $5, 'HTTP ' || $5, now(), 1.0, '',
                                                {next})::watchpump.attempt_report]) c
         left join watchpump.queue q on q.id = c.delivery_id"
    ))
    .bind(pump)
    .bind(id)
    .bind(attempt)
    .bind(outcome)
    .bind(status)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// Reports a failed attempt (HTTP 500) whose back-off says `next`.
async fn report_500(db: &TestDb, id: i64, attempt: i32, next: &str) -> Vec<(String, Option<bool>)> {
    report_as(db, "p", (id, attempt), ("retry", 500), next).await
}

#[tokio::test]
async fn the_last_retry_is_made_at_the_deadline_and_failed_means_the_deadline_passed() {
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "app", "acme/web/", all()).await;

    // The back-off says in an hour; the deadline is in ten minutes: the
    // delivery stays pending, due at its deadline (before, it failed here).
    let (id, attempt) = claimed(&db, "acme/web/a").await;
    sqlx::query(
        "update watchpump.queue set deadline = now() + interval '10 minutes' where id = $1",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
    let outcome = report_500(&db, id, attempt, "now() + interval '1 hour'").await;
    assert_eq!(outcome, vec![("pending".to_string(), Some(true))]);
    assert_eq!(db.delivery_state(id).await, "pending");

    // Its last attempt, made at the deadline, fails: now it is failed.
    sqlx::query(
        "update watchpump.queue set deadline = now() - interval '1 millisecond',
                next_attempt_at = now() - interval '1 millisecond' where id = $1",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
    let (again, attempt) = claimed(&db, "acme/web/b").await;
    let attempt_of_first: i32 =
        sqlx::query_scalar("select attempts from watchpump.queue where id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(attempt_of_first, 2, "claimed again at its deadline");
    let outcome = report_500(&db, id, attempt_of_first, "now() + interval '1 hour'").await;
    assert_eq!(outcome, vec![("failed".to_string(), None)]);
    let error: String =
        sqlx::query_scalar("select last_error from watchpump.settled where id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(error.starts_with("deadline passed"), "{error}");
    // The other one, well before its deadline, just waits for its retry.
    let outcome = report_500(&db, again, attempt, "now() + interval '1 second'").await;
    assert_eq!(outcome, vec![("pending".to_string(), Some(false))]);
}

#[tokio::test]
async fn the_sweep_leaves_a_last_retry_due_at_the_deadline_a_minute_and_reports_only_failures() {
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "app", "acme/web/", all()).await;
    let last_retry = delivery_of(&db, db.emit("acme/web/a", "push", json!({})).await).await;
    let overdue = delivery_of(&db, db.emit("acme/web/b", "push", json!({})).await).await;
    let long_past = delivery_of(&db, db.emit("acme/web/c", "push", json!({})).await).await;
    sqlx::query(
        "update watchpump.queue set
             deadline = case id when $1 then now() - interval '10 seconds'
                                when $2 then now() - interval '10 seconds'
                                else now() - interval '2 minutes' end,
             next_attempt_at = case id when $2 then now() - interval '1 hour'
                                       else now() + interval '1 hour' end",
    )
    .bind(last_retry)
    .bind(overdue)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query("update watchpump.queue set next_attempt_at = deadline where id <> $1")
        .bind(overdue)
        .execute(&db.pool)
        .await
        .unwrap();

    let rows = sqlx::query("select * from watchpump.sweep('p', '0 seconds')")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    let columns: Vec<&str> = rows[0].columns().iter().map(|c| c.name()).collect();
    assert_eq!(columns, vec!["service_id", "service", "failed"]);
    assert_eq!(rows[0].get::<i32, _>("failed"), 2);
    assert_eq!(db.delivery_state(last_retry).await, "pending");
    assert_eq!(db.delivery_state(overdue).await, "failed");
    assert_eq!(db.delivery_state(long_past).await, "failed");
}

#[tokio::test]
async fn the_delivery_window_is_read_where_each_delivery_is_created() {
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "app", "acme/web/", all()).await;
    // One connection, kept: a running producer's (or pump's).
    let mut producer = db.pool.acquire().await.unwrap();
    let window_of = |change: i64| {
        let pool = db.pool.clone();
        async move {
            let hours: f64 = sqlx::query_scalar(
                "select (extract(epoch from deadline - created_at) / 3600)::float8
                 from watchpump.queue where change_id = $1",
            )
            .bind(change)
            .fetch_one(&pool)
            .await
            .unwrap();
            hours.round() as i64
        }
    };
    let emit = "select watchpump.emit('acme/web/main', 'push', '{}')";
    let before: i64 = sqlx::query_scalar(emit)
        .fetch_one(&mut *producer)
        .await
        .unwrap();
    assert_eq!(window_of(before).await, 24);

    // Changed from elsewhere: the open connection's next emit sees it.
    sqlx::query("update watchpump.settings set delivery_window = '2 hours'")
        .execute(&db.pool)
        .await
        .unwrap();
    let after: i64 = sqlx::query_scalar(emit)
        .fetch_one(&mut *producer)
        .await
        .unwrap();
    assert_eq!(window_of(after).await, 2);

    // An operator's retry on any connection gives the new window too.
    let id = delivery_of(&db, after).await;
    set_state(&db, &[id], "failed", None).await;
    sqlx::query("select watchpump.retry($1)")
        .bind(id)
        .execute(&mut *producer)
        .await
        .unwrap();
    let hours: f64 = sqlx::query_scalar(
        "select (extract(epoch from deadline - now()) / 3600)::float8 from watchpump.queue where id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(hours.round() as i64, 2);

    // A window that is not a positive interval is refused.
    let refused = sqlx::query("update watchpump.settings set delivery_window = '-1 hour'")
        .execute(&db.pool)
        .await;
    assert!(refused.is_err());
}

/// A digest of every row of a table, in id order (of the columns v2 had:
/// actions gained two).
async fn digest(pool: &sqlx::PgPool, table: &str) -> (i64, String) {
    let row = match table {
        "actions" => "(t.id, t.delivery_id, t.at, t.action, t.actor, t.from_state, t.note)",
        // v2's columns: later migrations add columns (0009's trace context).
        "changes" => {
            "(t.id, t.object, t.kind, t.sequence, t.payload, t.occurred_at, t.payload_bytes)"
        }
        // ... and 0012's replay flag.
        "settled" => {
            "(t.id, t.change_id, t.watch_id, t.service_id, t.object, t.state, t.attempts,
              t.next_attempt_at, t.deadline, t.superseded_by, t.last_status, t.last_error,
              t.created_at, t.finished_at, t.last_started_at, t.last_duration_ms,
              t.last_response_head, t.last_pump)"
        }
        _ => "t",
    };
    sqlx::query_as(&format!(
        "select count(*), coalesce(md5(string_agg({row}::text, '|' order by t.id)), '')
         from watchpump.{table} t"
    ))
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_populated_v2_database_migrates_in_place_without_losing_a_row() {
    let (_url, pool) = blank_database().await;
    watchpump::sql_files::apply(&pool, "watchpump", &storage_v2::files())
        .await
        .unwrap();
    // Eight days of history shaped like the pump's: 2,000 changes, most
    // delivered, one in twenty failed (with its attempts), one in ten
    // still queued, an operator's retry.
    sqlx::raw_sql(&storage_v2::fill(2000))
        .execute(&pool)
        .await
        .unwrap();
    let failed: i64 =
        sqlx::query_scalar("select id from watchpump.settled where state = 'failed' limit 1")
            .fetch_one(&pool)
            .await
            .unwrap();
    sqlx::query("select watchpump.retry($1, 'ada')")
        .bind(failed)
        .execute(&pool)
        .await
        .unwrap();
    let mut before = Vec::new();
    for table in ["changes", "settled", "attempt_log", "actions"] {
        before.push(digest(&pool, table).await);
    }
    let queued: Vec<i64> = sqlx::query_scalar("select id from watchpump.queue order by id")
        .fetch_all(&pool)
        .await
        .unwrap();
    let last_change: i64 = sqlx::query_scalar("select max(id) from watchpump.changes")
        .fetch_one(&pool)
        .await
        .unwrap();

    watchpump::schema::migrate(&pool).await.unwrap();

    // Every row is where it was, in place: the v2 tables are partitions.
    let mut after = Vec::new();
    for table in ["changes", "settled", "attempt_log", "actions"] {
        after.push(digest(&pool, table).await);
    }
    assert_eq!(before, after);
    assert!(before[1].0 > 1700 && before[0].0 == 2000);
    let v2: Vec<(String, String)> = sqlx::query_as(
        "select c.relname::text, p.relname::text from pg_inherits i
         join pg_class c on c.oid = i.inhrelid join pg_class p on p.oid = i.inhparent
         where c.relname like '%\\_v2' order by 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        v2,
        vec![
            ("attempt_log_v2".into(), "attempt_log".into()),
            ("changes_v2".into(), "changes".into()),
            ("settled_v2".into(), "settled".into())
        ]
    );
    let still_queued: Vec<i64> = sqlx::query_scalar("select id from watchpump.queue order by id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(queued, still_queued);

    // Reads and writes work on the old rows and the new.
    let (state, error): (String, Option<String>) = sqlx::query_as(
        "select state, last_error from watchpump.delivery_log
         where state = 'failed' order by delivery_id desc limit 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (state.as_str(), error.as_deref()),
        ("failed", Some("deadline passed"))
    );
    let history: i64 = sqlx::query_scalar(
        "select count(*) from watchpump.delivery_history where delivery_id = $1",
    )
    .bind(failed)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(history >= 3, "created, the attempt, the retry: {history}");
    let payload: String = sqlx::query_scalar("select payload from watchpump.message($1)")
        .bind(queued[0])
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(payload.contains("\"n\""), "{payload}");
    let change: i64 = sqlx::query_scalar("select watchpump.emit('acme/new', 'push', '{}')")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        change > last_change,
        "ids go on: {change} after {last_change}"
    );
    // The newest of each of the 10 queued objects and of the retried one,
    // and the new one, each with its change.
    let (old, new, with_change): (i64, i64, i64) = sqlx::query_as(
        "select count(*) filter (where change_id <= $1), count(*) filter (where change_id > $1),
                count(*) filter (where payload is not null and kind = 'push')
         from watchpump.claim('p', '{}', 10000, '1 minute', 10000)",
    )
    .bind(last_change)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((old, new), (11, 1), "old and new deliveries are claimed");
    assert_eq!(with_change, 12, "each with its change");
    let pruned: (i32, bool) =
        sqlx::query_as("select deliveries, more from watchpump.prune('7 days', '30 days', 500)")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        pruned,
        (0, false),
        "the v2 days are kept until they are all past retention"
    );

    // Retired (here with a retention of zero), the v2 tables leave what is
    // kept in partitions of their own for everything before the first day.
    let failed_before: i64 =
        sqlx::query_scalar("select count(*) from watchpump.settled where state = 'failed'")
            .fetch_one(&pool)
            .await
            .unwrap();
    sqlx::query(
        "select * from watchpump.retire_partitions(
             (select to_at from watchpump.partitions where name = 'settled_v2'),
             interval '0', interval '30 days')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let bounds: Vec<(String, String)> = sqlx::query_as(
        "select c.relname::text, pg_get_expr(c.relpartbound, c.oid)
         from pg_class c where c.relname in ('settled_v2_kept', 'changes_v2_kept', 'settled_v2')
         order by 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        bounds.len(),
        2,
        "settled_v2 dropped, kept ones attached: {bounds:?}"
    );
    for (name, bound) in &bounds {
        assert!(
            bound.starts_with("FOR VALUES FROM (MINVALUE)"),
            "{name}: {bound}"
        );
    }
    let (failed_after, delivered_after, orphans): (i64, i64, i64) = sqlx::query_as(
        "select (select count(*) from watchpump.settled where state = 'failed'),
                (select count(*) from watchpump.settled where state = 'delivered'),
                (select count(*) from watchpump.deliveries d
                 where not exists (select 1 from watchpump.changes c where c.id = d.change_id))",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (failed_after, delivered_after, orphans),
        (failed_before, 0, 0),
        "failures kept, delivered gone, every delivery left keeps its change"
    );
}

#[tokio::test]
async fn retention_drops_whole_days_and_keeps_failed_deliveries_with_what_they_need() {
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "app", "acme/", all()).await;
    // A day ten days ago, with its partitions.
    sqlx::query(
        "select watchpump.add_partition(t, d, d + interval '1 day')
         from unnest(array['changes', 'settled', 'attempt_log']) t,
              (select date_trunc('day', now() at time zone 'UTC') at time zone 'UTC'
                      - interval '10 days' as d) day",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    for n in 0..10 {
        db.emit(&format!("acme/o{n}"), "push", json!({"n": n}))
            .await;
    }
    db.emit("elsewhere/unwatched", "push", json!({})).await;
    sqlx::raw_sql(
        "update watchpump.changes set occurred_at = occurred_at - interval '10 days';
         update watchpump.queue set created_at = created_at - interval '10 days';",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let delivered = ids_where(
        &db,
        "object in ('acme/o0', 'acme/o1', 'acme/o2', 'acme/o3')",
    )
    .await;
    let failed = ids_where(&db, "object in ('acme/o4', 'acme/o5')").await;
    let failed_long_ago = ids_where(&db, "object = 'acme/o6'").await;
    let retried = ids_where(&db, "object = 'acme/o7'").await;
    set_state(&db, &delivered, "delivered", Some(9)).await;
    set_state(&db, &failed, "failed", Some(9)).await;
    set_state(&db, &failed_long_ago, "failed", Some(9)).await;
    set_state(&db, &retried, "delivered", Some(1)).await;
    sqlx::raw_sql(
        "update watchpump.settled set finished_at = now() - interval '31 days'
         where object = 'acme/o6';
         insert into watchpump.attempt_log (delivery_id, attempt, started_at, duration_ms, status, pump)
         select id, 1, created_at, 1, 500, 'p' from watchpump.deliveries;",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let day: String = scalar_text(
        &db,
        "select name from watchpump.partitions where parent = 'settled' order by from_at limit 1",
    )
    .await;
    assert!(day.starts_with("settled_"), "{day}");
    // The counts of a retired day are the statistics' (exact when small).
    sqlx::query("analyze watchpump.settled, watchpump.changes")
        .execute(&db.pool)
        .await
        .unwrap();

    let (deliveries, failed_gone, changes, more): (i32, i32, i32, bool) =
        sqlx::query_as("select * from watchpump.prune('7 days', '30 days', 500)")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((deliveries, failed_gone, more), (4, 1, false));
    assert_eq!(changes, 6, "the day's 11 changes less the 5 kept");

    // The day's partitions are gone; what retention keeps is kept.
    let gone: bool = sqlx::query_scalar("select to_regclass('watchpump.' || $1) is null")
        .bind(&day)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(gone, "{day} dropped");
    let kept: Vec<String> = sqlx::query_scalar(
        "select d.object || ':' || d.state from watchpump.deliveries d order by d.object",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        kept,
        vec![
            "acme/o4:failed",
            "acme/o5:failed",
            "acme/o7:delivered",
            "acme/o8:pending",
            "acme/o9:pending"
        ]
    );
    // Each keeps its change and its attempt; nothing else is left.
    let complete: i64 = scalar(
        &db,
        "select count(*) from watchpump.deliveries d
         where exists (select 1 from watchpump.changes c where c.id = d.change_id)
           and exists (select 1 from watchpump.attempt_log a where a.delivery_id = d.id)",
    )
    .await;
    assert_eq!(complete, 5);
    assert_eq!(
        scalar(&db, "select count(*) from watchpump.changes").await,
        5
    );
    assert_eq!(
        scalar(&db, "select count(*) from watchpump.attempt_log").await,
        5
    );
    // What was kept is a small partition of its own per table, in the
    // day's place, not rows copied into the DEFAULT partitions.
    let kept_partitions: Vec<String> =
        sqlx::query_scalar("select name from watchpump.partitions where kept order by name")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let suffix = day.trim_start_matches("settled_");
    assert_eq!(
        kept_partitions,
        vec![
            format!("attempt_log_{suffix}_kept"),
            format!("changes_{suffix}_kept"),
            format!("settled_{suffix}_kept"),
        ]
    );
    assert_eq!(
        scalar(
            &db,
            &format!("select count(*) from watchpump.settled_{suffix}_kept")
        )
        .await,
        3,
        "the two failures and the delivery retried late"
    );
    for table in ["settled_kept", "changes_kept", "attempt_log_kept"] {
        assert_eq!(
            scalar(&db, &format!("select count(*) from watchpump.{table}")).await,
            0,
            "{table}"
        );
    }
    // Emitting and settling still work.
    db.emit("acme/new", "push", json!({})).await;

    // The kept partitions wait for the failed retention (here 8 days: the
    // day ended 9 days ago, plus the delivery window): then the failures,
    // which finished 9 days ago, go, and the delivery retried late (a day
    // ago) moves to the DEFAULT partitions with its change and attempt.
    let still: (i32, i32, bool) = sqlx::query_as(
        "select deliveries, failed, more from watchpump.prune('7 days', '30 days', 500)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(still, (0, 0, false), "kept until the failed retention");
    let (deliveries, failed_gone, _, more): (i32, i32, i32, bool) =
        sqlx::query_as("select * from watchpump.prune('7 days', '8 days', 500)")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((deliveries, failed_gone, more), (0, 2, false));
    assert_eq!(
        scalar(&db, "select count(*) from watchpump.partitions where kept").await,
        0
    );
    let left: Vec<String> = sqlx::query_scalar(
        "select d.object || ':' || d.state from watchpump.deliveries d
         where d.object <> 'acme/new' order by d.object",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        left,
        vec!["acme/o7:delivered", "acme/o8:pending", "acme/o9:pending"]
    );
    assert_eq!(
        scalar(
            &db,
            "select count(*) from watchpump.deliveries d
             where d.object <> 'acme/new'
               and exists (select 1 from watchpump.changes c where c.id = d.change_id)
               and exists (select 1 from watchpump.attempt_log a where a.delivery_id = d.id)",
        )
        .await,
        3
    );
}

async fn scalar(db: &TestDb, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(&db.pool).await.unwrap()
}

async fn scalar_text(db: &TestDb, sql: &str) -> String {
    sqlx::query_scalar(sql).fetch_one(&db.pool).await.unwrap()
}

/// The plan of `sql`, as text.
async fn plan(db: &TestDb, sql: &str) -> String {
    let lines: Vec<String> = sqlx::query_scalar(&format!("explain (costs off) {sql}"))
        .fetch_all(&db.pool)
        .await
        .unwrap();
    lines.join("\n")
}

/// No day of the history that holds rows is read whole (`days`: their
/// names; an empty day ahead may be, at no cost).
fn assert_bounded(what: &str, plan: &str, days: &[String]) {
    for day in days {
        assert!(
            !plan.contains(&format!("Seq Scan on {day} ")),
            "{what}: a day of the history read whole:\n{plan}"
        );
    }
}

/// The history partitions (`changes_*`, `settled_*`, `attempt_log_*`) a
/// plan run with EXPLAIN ANALYZE scanned, with the most loops of any scan
/// of each: partitions that run-time pruning left out show "never
/// executed" and are not listed.
fn executed_partitions(plan: &str) -> Vec<(String, u64)> {
    let mut seen: Vec<(String, u64)> = Vec::new();
    for line in plan.lines().filter(|l| !l.contains("never executed")) {
        let Some((_, after)) = line.split_once(" on ") else {
            continue;
        };
        let name = after.split_whitespace().next().unwrap_or_default();
        if !["changes_", "settled_", "attempt_log_"]
            .iter()
            .any(|t| name.starts_with(t))
        {
            continue;
        }
        let loops = line
            .split_once("loops=")
            .and_then(|(_, l)| l.trim_end_matches(')').parse().ok())
            .unwrap_or(1);
        match seen.iter_mut().find(|(n, _)| n == name) {
            Some(entry) => entry.1 = entry.1.max(loops),
            None => seen.push((name.to_string(), loops)),
        }
    }
    seen
}

/// A read run at volume stays bounded: no parallel plan (worker start-up
/// costs more than these reads), no hash of a history table, and the
/// lookups it repeats once per row of its page (loops > 1) read at most
/// `days` partitions of each history table: the days its page spans, found
/// by run-time pruning, never every day.
fn assert_pruned(what: &str, plan: &str, days: usize) {
    assert!(!plan.contains("Gather"), "{what}: a parallel plan:\n{plan}");
    for line in plan
        .lines()
        .filter(|l| l.contains("Hash") && !l.contains("never executed"))
    {
        assert!(
            !["changes", "settled", "attempt_log"]
                .iter()
                .any(|t| line.contains(t)),
            "{what}: a history table hashed:\n{plan}"
        );
    }
    let repeated = executed_partitions(plan);
    for table in ["changes_", "settled_", "attempt_log_"] {
        let touched: Vec<&(String, u64)> = repeated
            .iter()
            .filter(|(n, loops)| n.starts_with(table) && *loops > 1)
            .collect();
        assert!(
            touched.len() <= days,
            "{what}: its lookups probed {} partitions of {table}*: {touched:?}\n{plan}",
            touched.len()
        );
    }
}

/// How many rows the scans of the history's partitions that ran once (the
/// page's ids, not its lookups by key) returned, in an EXPLAIN ANALYZE
/// plan.
fn history_rows_read(plan: &str) -> u64 {
    plan.lines()
        .filter(|l| l.contains(" on settled_") && l.contains("loops=1)"))
        .filter_map(|l| {
            let (_, after) = l.split_once("actual rows=")?;
            after.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

#[tokio::test]
async fn every_page_is_a_bounded_index_scan_at_300_000_deliveries() {
    use watchpump::operator::store::{self, DeliveryFilter};
    let db = TestDb::new().await;
    let (deploy, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let (docs, _) = db.add_service("docs", "http://127.0.0.1:9").await;
    db.add_watch(deploy.id, "app", "acme/", all()).await;
    let docs_watch = db.add_watch(docs.id, "app", "acme/", all()).await;
    // Three days of history by SQL: 300,000 deliveries, one in 50 failed.
    sqlx::raw_sql(
        "select watchpump.add_partition(t, d, d + interval '1 day')
         from unnest(array['changes', 'settled', 'attempt_log']) t,
              generate_series(1, 3) n,
              lateral (select date_trunc('day', now() at time zone 'UTC') at time zone 'UTC'
                              - n * interval '1 day' as d) day;
         insert into watchpump.changes (object, kind, sequence, payload, occurred_at, payload_bytes)
         select 'acme/o' || (n % 1000), 'push', n, '{}', now() - (300000 - n) * interval '800 ms', 2
         from generate_series(1, 300000) n;
         insert into watchpump.settled (id, change_id, watch_id, service_id, object, state, attempts,
                                        next_attempt_at, deadline, last_status, created_at,
                                        finished_at)
         select nextval('watchpump.delivery_ids'), c.id, w.id, w.service_id, c.object,
                case when c.id % 50 = 0 then 'failed' else 'delivered' end, 1, c.occurred_at,
                c.occurred_at + interval '1 day', 200, c.occurred_at,
                c.occurred_at + interval '1 second'
         from watchpump.changes c
         join watchpump.watches w on w.id = 1 + c.id % 2;
         insert into watchpump.attempt_log (delivery_id, attempt, started_at, duration_ms, status, pump)
         select id, 1, created_at, 1, 500, 'p' from watchpump.settled where state = 'failed';
         analyze watchpump.changes, watchpump.settled, watchpump.attempt_log;",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let one = scalar(&db, "select max(id) - 1000 from watchpump.settled").await;
    let days: Vec<String> = sqlx::query_scalar(
        "select relname::text from pg_class
         where relnamespace = 'watchpump'::regnamespace and relkind = 'r' and reltuples > 10000",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(days.len() >= 6, "{days:?}");

    // The admin API's and the panel's pages: newest, a service's, an
    // object's, the failed (all, and a service's), a time window, and the
    // next page of each.
    let hour_ago = chrono::Utc::now() - chrono::Duration::hours(1);
    let pages = [
        ("newest", DeliveryFilter::default(), None),
        ("a service's", DeliveryFilter::default(), Some(docs.id)),
        (
            "a watch's (the consumer API's list)",
            DeliveryFilter {
                watch_id: Some(docs_watch.id),
                ..Default::default()
            },
            Some(docs.id),
        ),
        (
            "an object's",
            DeliveryFilter {
                object: Some("acme/o7".into()),
                ..Default::default()
            },
            None,
        ),
        (
            "the failed",
            DeliveryFilter {
                state: Some("failed".into()),
                ..Default::default()
            },
            None,
        ),
        (
            "a service's failed",
            DeliveryFilter {
                state: Some("failed".into()),
                ..Default::default()
            },
            Some(deploy.id),
        ),
        (
            "a time window",
            DeliveryFilter {
                since: Some(hour_ago - chrono::Duration::hours(1)),
                until: Some(hour_ago),
                ..Default::default()
            },
            None,
        ),
        (
            "a time window's next page",
            DeliveryFilter {
                since: Some(hour_ago - chrono::Duration::hours(1)),
                until: Some(hour_ago),
                after: Some(one - 5_000),
                ..Default::default()
            },
            None,
        ),
        (
            "a service's wide time window",
            DeliveryFilter {
                since: Some(hour_ago - chrono::Duration::hours(30)),
                until: Some(hour_ago),
                ..Default::default()
            },
            Some(docs.id),
        ),
        (
            "an object's time window",
            DeliveryFilter {
                object: Some("acme/o7".into()),
                until: Some(hour_ago),
                ..Default::default()
            },
            None,
        ),
        (
            "the failed before a time",
            DeliveryFilter {
                state: Some("failed".into()),
                until: Some(hour_ago),
                ..Default::default()
            },
            Some(deploy.id),
        ),
        (
            "a wide time window",
            DeliveryFilter {
                since: Some(hour_ago - chrono::Duration::hours(30)),
                until: Some(hour_ago),
                ..Default::default()
            },
            None,
        ),
        (
            "a next page",
            DeliveryFilter {
                after: Some(one),
                limit: Some(100),
                ..Default::default()
            },
            Some(deploy.id),
        ),
    ];
    for (what, filter, service) in &pages {
        let lines = store::explain_page(&db.pool, "explain (costs off)", filter, *service)
            .await
            .unwrap();
        let plan = lines.join("\n");
        assert_bounded(what, &plan, &days);
        assert!(plan.contains("Limit"), "{what}: no limit pushed:\n{plan}");
        if what.starts_with("a time window") || *what == "a wide time window" {
            // A range of the index on (created_at, id), walked backwards
            // from `until`, not a walk of the day by id nor a read of the
            // whole window. (Index-only where the day's visibility map is
            // set, as autovacuum leaves it: the bench measures that.)
            assert!(
                plan.contains("Index Cond: ((created_at >= "),
                "{what}: not read through the index on created_at:\n{plan}"
            );
        }
        // And it answers.
        let rows = store::page(&db.pool, filter, *service).await.unwrap();
        assert!(!rows.is_empty(), "{what}: empty");
        // Run, its lookups read only the page's days (a page spans one
        // or two of these days), one lookup per row.
        let lines = store::explain_page(
            &db.pool,
            "explain (analyze, costs off, timing off, summary off)",
            filter,
            *service,
        )
        .await
        .unwrap();
        let analyzed = lines.join("\n");
        assert_pruned(what, &analyzed, 2);
        // The page's ids are read from the history's indexes, stopping
        // after the page: an hour holds 4,500 deliveries here, a wide
        // window 40,000.
        let read = history_rows_read(&analyzed);
        let limit = filter.size() as u64;
        if what.contains("time window")
            || ["newest", "a next page", "the failed before a time"].contains(what)
        {
            assert!(
                read <= 2 * limit,
                "{what}: {read} rows read for a page of {limit}:\n{analyzed}"
            );
        }
    }
    let newest_failures = |explain| store::explain_newest_failures(&db.pool, explain, 50);
    let run = newest_failures("explain (analyze, costs off, timing off, summary off)");
    assert_pruned("newest failures", &run.await.unwrap().join("\n"), 2);
    let planned = newest_failures("explain (costs off)").await.unwrap();
    assert_bounded("newest failures", &planned.join("\n"), &days);

    // The views and functions behind the panel, the admin API and metrics.
    let id = scalar(
        &db,
        "select max(id) from watchpump.settled where state = 'failed'",
    )
    .await;
    for (what, sql) in [
        (
            "one delivery",
            format!("select * from watchpump.delivery_log where delivery_id = {id}"),
        ),
        (
            "its attempts",
            format!("select * from watchpump.attempts where delivery_id = {id}"),
        ),
        (
            "its history",
            format!("select * from watchpump.delivery_history where delivery_id = {id}"),
        ),
        ("backlog", "select * from watchpump.backlog".to_string()),
    ] {
        assert_bounded(what, &plan(&db, &sql).await, &days);
    }
}

/// A page looks each delivery's change up in the change's day only when
/// the delivery was created at its change's time (emit()); one created
/// later (a ping's, a moment after its change) still finds its change.
#[tokio::test]
async fn a_delivery_created_after_its_change_still_shows_its_change() {
    let db = TestDb::new().await;
    let (deploy, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(deploy.id, "app", "acme/", all()).await;
    db.emit("acme/web", "push", json!({})).await;
    let moved = sqlx::query(
        "update watchpump.queue set created_at = created_at + interval '2 days' where object = 'acme/web'",
    )
    .execute(&db.pool)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(moved, 1);
    let rows = watchpump::operator::store::deliveries(
        &db.pool,
        &watchpump::operator::store::DeliveryFilter::default(),
    )
    .await
    .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].object.as_str(), rows[0].kind.as_str()),
        ("acme/web", "push")
    );
}

/// Whether every queued delivery's `created_at` is its change's time.
async fn queued_at_their_changes_time(db: &TestDb) -> bool {
    sqlx::query_scalar(
        "select bool_and(q.created_at = c.occurred_at)
         from watchpump.queue q join watchpump.changes c on c.id = q.change_id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// A delivery emit() queued carries its payload's bytes, so claim() keeps
/// to its byte budget without looking the change up; the change is read
/// once, before the lease. A delivery whose change is not where its row
/// says (edited by hand here: watchpump's own writers never queue one so)
/// is left pending, never leased with nothing to send; the other is sent
/// whole. (Leasing first and reading the change after held it under a
/// lease with nothing sent.)
#[tokio::test]
async fn claim_leases_no_delivery_whose_change_it_cannot_read() {
    let db = TestDb::new().await;
    let (service, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(service.id, "app", "acme/", all()).await;
    let found = db.emit("acme/web/main", "push", json!({"n": 1})).await;
    let lost = db.emit("acme/api/main", "push", json!({"n": 2})).await;
    let bytes: Vec<Option<i32>> =
        sqlx::query_scalar("select payload_bytes from watchpump.queue order by change_id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert!(
        bytes.iter().all(|b| b.is_some()),
        "emit() records the bytes: {bytes:?}"
    );
    sqlx::query(
        "update watchpump.queue set created_at = created_at - interval '3 days' where change_id = $1",
    )
    .bind(lost)
    .execute(&db.pool)
    .await
    .unwrap();
    let claimed: Vec<(i64, Option<String>)> = sqlx::query_as(
        "select change_id, payload from watchpump.claim('test', '{}', 10, '1 minute')",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    assert_eq!(claimed[0].0, found);
    assert!(claimed[0].1.is_some(), "sent with its payload");
    let (leased, attempts): (bool, i32) = sqlx::query_as(
        "select lease_until is not null, attempts from watchpump.queue where change_id = $1",
    )
    .bind(lost)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(!leased && attempts == 0, "left pending, not leased");
}

/// claim() finds a delivery's change by its id and its time (a delivery's
/// `created_at` is its change's `occurred_at`, so the look-up reads one
/// day's partition of `changes`), and by its id alone for a delivery older
/// than that rule (a v2 row, or a ping from before it, that an operator
/// retried): it is sent whole either way, never held under a lease with
/// nothing sent, and takes its change's time, so that the next claim finds
/// it by day.
#[tokio::test]
async fn claim_finds_a_deliverys_change_by_its_day_and_by_its_id_alone_when_the_times_differ() {
    let db = TestDb::new().await;
    let (service, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(service.id, "app", "acme/", all()).await;
    let on_its_day = db.emit("acme/web/main", "push", json!({"n": 1})).await;
    let out_of_rule = db.emit("acme/api/main", "push", json!({"n": 2})).await;
    let same = queued_at_their_changes_time(&db).await;
    assert!(same, "emit() gives a delivery its change's time");
    // Three days off: another day's partition (or the DEFAULT one). Such
    // a row was queued without its payload's bytes (a v2 row, a ping, a
    // retried delivery: only emit() and emit_many() record them).
    sqlx::query(
        "update watchpump.queue set created_at = created_at - interval '3 days', payload_bytes = null
         where change_id = $1",
    )
    .bind(out_of_rule)
    .execute(&db.pool)
    .await
    .unwrap();
    let claimed: Vec<(i64, String, Option<String>)> = sqlx::query_as(
        "select change_id, object, payload
         from watchpump.claim('test', '{}', 10, '1 minute') order by change_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let ids: Vec<i64> = claimed.iter().map(|c| c.0).collect();
    assert_eq!(
        ids,
        vec![on_its_day, out_of_rule],
        "both are claimed: {claimed:?}"
    );
    assert_eq!(claimed[1].1, "acme/api/main");
    let payload: serde_json::Value =
        serde_json::from_str(claimed[1].2.as_deref().unwrap()).unwrap();
    assert_eq!(payload, json!({"n": 2}), "and sent with its payload");
    // Its time is now its change's: the next claim finds it in that day.
    let same = queued_at_their_changes_time(&db).await;
    assert!(
        same,
        "claim() gives an out-of-rule delivery its change's time"
    );
}

/// A ping's delivery takes its change's time, as emit()'s do.
#[tokio::test]
async fn a_ping_delivery_takes_its_changes_time() {
    let db = TestDb::new().await;
    let (service, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let watch = db.add_watch(service.id, "app", "acme/", all()).await;
    let id: i64 = sqlx::query_scalar("select watchpump.ping($1, $2, '1 second')")
        .bind(service.id)
        .bind(watch.id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let same: bool = sqlx::query_scalar(
        "select q.created_at = c.occurred_at
         from watchpump.queue q join watchpump.changes c on c.id = q.change_id where q.id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(same);
}

/// Retention retires a day while producers emit, each change in its own
/// transaction, and a pump delivers: the producers' emits all commit,
/// every change emitted meanwhile is delivered, and the day leaves exactly
/// its failures behind, with their changes and attempts. (prune() gives up
/// when it cannot take its locks within 100 ms; it is called again, as the
/// operator task does.)
#[tokio::test]
async fn retiring_a_day_while_producers_emit_and_a_pump_delivers_loses_nothing() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (svc, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(svc.id, "app", "acme/", all()).await;
    // A day ten days ago: 2,000 changes, each delivered, one in 20 failed
    // (with an attempt).
    old_day(&db, 10, 2000).await;
    let failures: i64 = scalar(
        &db,
        "select count(*) from watchpump.settled where state = 'failed'",
    )
    .await;
    assert_eq!(failures, 100);

    let pump = RunningPump::start(&db.pool, pump_config());
    let producer = tokio::spawn({
        let pool = db.pool.clone();
        async move {
            for n in 0..300 {
                let mut tx = pool.begin().await.unwrap();
                watchpump::emit(&mut tx, &format!("acme/new{n}"), "push", &json!({"n": n}))
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
        }
    });
    let mut retired = false;
    for _ in 0..200 {
        prune(&db).await;
        retired = scalar(&db, "select count(*) from watchpump.partitions where kept").await > 0;
        if retired {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(retired, "the day was retired");
    producer.await.unwrap();

    let arrived = consumer.wait_for(300, WAIT).await;
    let mut objects: Vec<String> = arrived
        .iter()
        .filter_map(|r| r.body["object"].as_str().map(str::to_string))
        .collect();
    objects.sort();
    objects.dedup();
    assert_eq!(objects.len(), 300, "every change emitted meanwhile arrived");
    let (old_failed, old_other, orphans, attempts): (i64, i64, i64, i64) = sqlx::query_as(
        "select count(*) filter (where s.object like 'acme/old%' and s.state = 'failed'),
                count(*) filter (where s.object like 'acme/old%' and s.state <> 'failed'),
                count(*) filter (where not exists (select 1 from watchpump.changes c
                                                   where c.id = s.change_id)),
                (select count(*) from watchpump.attempt_log a
                 where exists (select 1 from watchpump.settled f
                               where f.id = a.delivery_id and f.object like 'acme/old%'))
         from watchpump.settled s",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (old_failed, old_other, orphans, attempts),
        (100, 0, 0, 100),
        "the day's failures stay with their changes and attempts; the rest went"
    );
    pump.stop().await.unwrap();
}

/// A day `days_ago` days ago, with its partitions: `changes` changes of
/// objects acme/old<n>, each delivered to every watch, one in 20 failed
/// (with an attempt).
async fn old_day(db: &TestDb, days_ago: i32, changes: i32) {
    sqlx::query(
        "select watchpump.add_partition(t, d, d + interval '1 day')
         from unnest(array['changes', 'settled', 'attempt_log']) t,
              (select date_trunc('day', now() at time zone 'UTC') at time zone 'UTC'
                      - $1 * interval '1 day' as d) day",
    )
    .bind(days_ago)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "with day as (select date_trunc('day', now() at time zone 'UTC') at time zone 'UTC'
                             - $1 * interval '1 day' as d),
         c as (
             insert into watchpump.changes (object, kind, sequence, payload, occurred_at, payload_bytes)
             select 'acme/old' || n, 'push', 1, jsonb_build_object('n', n),
                    d + n * (interval '1 day' / ($2 + 1)), 8
             from day, generate_series(1, $2) n
             returning id, object, occurred_at
         ),
         s as (
             insert into watchpump.settled (id, change_id, watch_id, service_id, object, state, attempts,
                                            next_attempt_at, deadline, last_status, created_at,
                                            finished_at, last_pump)
             select nextval('watchpump.delivery_ids'), c.id, w.id, w.service_id, c.object,
                    case when c.id % 20 = 0 then 'failed' else 'delivered' end, 1, c.occurred_at,
                    c.occurred_at + interval '1 day',
                    case when c.id % 20 = 0 then 500 else 200 end,
                    c.occurred_at, c.occurred_at + interval '1 second', 'p'
             from c cross join watchpump.watches w
             returning id, state, created_at
         )
         insert into watchpump.attempt_log (delivery_id, attempt, started_at, duration_ms, status, pump)
         select s.id, 1, s.created_at, 1, 500, 'p' from s where s.state = 'failed'",
    )
    .bind(days_ago)
    .bind(changes)
    .execute(&db.pool)
    .await
    .unwrap();
    // As settle() does when they fail: the failures written where
    // retention keeps them too.
    stage_failures_of_day(db, days_ago).await;
}

/// `watchpump.stage_failed()` for the failures of the day `days_ago`.
async fn stage_failures_of_day(db: &TestDb, days_ago: i32) {
    sqlx::query(
        "select watchpump.stage_failed(array(
             select s.id from watchpump.settled s
             where s.state = 'failed'
               and s.created_at >= date_trunc('day', now() at time zone 'UTC') at time zone 'UTC'
                                   - $1 * interval '1 day'
               and s.created_at < date_trunc('day', now() at time zone 'UTC') at time zone 'UTC'
                                  - ($1 - 1) * interval '1 day'))",
    )
    .bind(days_ago)
    .execute(&db.pool)
    .await
    .unwrap();
}

/// Retention exports what it retired, when it last finished, and how far
/// back the history not yet retired reaches (docs/metrics.md).
#[tokio::test]
async fn retention_exports_what_it_retired_and_how_old_the_history_is() {
    let exporter = free_addr();
    watchpump::metrics::install(exporter).expect("install the exporter");
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "app", "acme/", all()).await;
    // A day past retention (7 days and the window's one), and one within.
    old_day(&db, 12, 1000).await;
    old_day(&db, 5, 10).await;
    sqlx::query("analyze watchpump.settled, watchpump.changes")
        .execute(&db.pool)
        .await
        .unwrap();
    let before = Scrape::fetch(exporter).await;
    before
        .expect("watchpump_prune_last_success_timestamp_seconds", &[], 0.0)
        .unwrap();
    before
        .expect("watchpump_pruned_total", &[("what", "deliveries")], 0.0)
        .unwrap();

    let pruned = watchpump::operator::prune::run(
        &db.pool,
        Duration::from_secs(7 * 86_400),
        Duration::from_secs(30 * 86_400),
        500,
    )
    .await
    .unwrap();
    assert_eq!((pruned.deliveries, pruned.failed), (950, 0), "{pruned:?}");

    let scrape = Scrape::fetch(exporter).await;
    scrape
        .expect("watchpump_pruned_total", &[("what", "deliveries")], 950.0)
        .unwrap();
    scrape
        .expect(
            "watchpump_pruned_total",
            &[("what", "changes")],
            pruned.changes as f64,
        )
        .unwrap();
    let finished = scrape.sum("watchpump_prune_last_success_timestamp_seconds", &[]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((now - finished).abs() < 600.0, "{finished} against {now}");
    // The oldest day left is the one 5 days ago: it ended 4 days and part
    // of today ago.
    let age = scrape.sum("watchpump_history_oldest_day_age_seconds", &[]);
    assert!((4.0 * 86_400.0..5.0 * 86_400.0).contains(&age), "{age} s");
}

/// A time window's pages are its deliveries newest created first (then by
/// id), page after page, even where ids and creation times disagree (a
/// replay, a v2 row, overlapping transactions), and a page's cursor is its
/// last delivery wherever it lies.
#[tokio::test]
async fn a_time_windows_pages_are_its_newest_deliveries_page_after_page() {
    use watchpump::operator::store::{self, DeliveryFilter};
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "app", "acme/", all()).await;
    old_day(&db, 1, 3000).await;
    // Creation times shuffled within the day: ids no longer follow them.
    sqlx::query(
        "update watchpump.settled
         set created_at = date_trunc('day', created_at at time zone 'UTC') at time zone 'UTC'
                          + random() * interval '23 hours'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let day = chrono::Utc::now().date_naive() - chrono::Duration::days(1);
    let since = day.and_hms_opt(10, 0, 0).unwrap().and_utc();
    let until = day.and_hms_opt(11, 30, 0).unwrap().and_utc();
    // A run of deliveries created at one time, as one emit() transaction
    // makes them, which pages must split by id; and two still queued,
    // created in the window, one of them among that run.
    let tie = day.and_hms_opt(10, 45, 0).unwrap().and_utc();
    sqlx::query("update watchpump.settled set created_at = $1 where id % 7 = 0")
        .bind(tie)
        .execute(&db.pool)
        .await
        .unwrap();
    for (object, at) in [
        ("acme/q1", tie),
        ("acme/q2", since + chrono::Duration::minutes(5)),
    ] {
        let change = db.emit(object, "push", json!({})).await;
        sqlx::query("update watchpump.queue set created_at = $1 where change_id = $2")
            .bind(at)
            .bind(change)
            .execute(&db.pool)
            .await
            .unwrap();
    }
    let expected: Vec<i64> = sqlx::query_scalar(
        "select id from (select id, created_at from watchpump.settled
                         union all select id, created_at from watchpump.queue) d
         where created_at >= $1 and created_at < $2
         order by created_at desc, id desc",
    )
    .bind(since)
    .bind(until)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(expected.len() > 100, "{}", expected.len());

    // The window's page of 40 after the delivery `after` (or its first).
    let page_after = |after: Option<i64>| {
        let filter = DeliveryFilter {
            since: Some(since),
            until: Some(until),
            after,
            limit: Some(40),
            ..Default::default()
        };
        let pool = db.pool.clone();
        async move {
            store::page(&pool, &filter, None)
                .await
                .unwrap()
                .iter()
                .map(|d| d.delivery_id)
                .collect::<Vec<i64>>()
        }
    };
    let mut read = Vec::new();
    let mut before = None;
    loop {
        let page = page_after(before).await;
        if page.is_empty() {
            break;
        }
        before = page.last().copied();
        read.extend(page);
    }
    assert_eq!(read, expected);

    // A cursor still in the queue: the page after it is what follows it.
    let queued = scalar(&db, "select min(id) from watchpump.queue").await;
    let at = expected.iter().position(|id| *id == queued).unwrap();
    let follows: Vec<i64> = expected[at + 1..].iter().take(40).copied().collect();
    assert!(!follows.is_empty());
    assert_eq!(page_after(Some(queued)).await, follows);
    // A cursor that no longer exists (retention removed it) ends the list.
    let gone = scalar(&db, "select max(id) + 1000 from watchpump.settled").await;
    assert_eq!(page_after(Some(gone)).await, Vec::<i64>::new());
}

/// The rows of (delivery id, attempt, repeats) in `table`, in order.
async fn attempt_rows(db: &TestDb, table: &str, id: i64) -> Vec<(i32, i32)> {
    sqlx::query_as(&format!(
        "select attempt, repeats from watchpump.{table} where delivery_id = $1 order by attempt, id"
    ))
    .bind(id)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// What pump `pump` claims now: (delivery, attempt).
async fn claim_as(db: &TestDb, pump: &str) -> Vec<(i64, i32)> {
    sqlx::query_as("select delivery_id, attempt from watchpump.claim($1, '{}', 10, '1 minute')")
        .bind(pump)
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

/// The lease on delivery `id` runs out.
async fn expire_lease(db: &TestDb, id: i64) {
    sqlx::query(
        "update watchpump.queue set lease_until = now() - interval '1 second' where id = $1",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
}

/// A report of pump `pump` (a retry is due now).
async fn report(db: &TestDb, pump: &str, id: i64, attempt: i32, outcome: &str, status: i32) {
    report_as(db, pump, (id, attempt), (outcome, status), "now()").await;
}

/// A pump whose lease ran out before it recorded its attempt (another pump
/// has since delivered) records that attempt in a row of its own: the
/// attempt rows of a settled delivery never change, which retention relies
/// on to copy them without a lock.
#[tokio::test]
async fn an_attempt_recorded_after_its_lease_ran_out_gets_a_row_of_its_own() {
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "app", "acme/web/", all()).await;
    let (id, attempt) = claimed(&db, "acme/web/a").await;
    assert_eq!(attempt, 1);
    report(&db, "p", id, 1, "retry", 500).await;
    assert_eq!(attempt_rows(&db, "attempt_log", id).await, vec![(1, 1)]);

    // Pump p makes attempt 2; its lease runs out; pump q makes attempt 3,
    // which delivers.
    assert_eq!(claim_as(&db, "p").await, vec![(id, 2)]);
    expire_lease(&db, id).await;
    assert_eq!(claim_as(&db, "q").await, vec![(id, 3)]);
    report(&db, "q", id, 3, "delivered", 200).await;
    assert_eq!(db.delivery_state(id).await, "delivered");

    // p's attempt 2 follows attempt 1's run, but the delivery has settled:
    // its run's row stays as it was, and attempt 2 gets its own.
    report(&db, "p", id, 2, "retry", 500).await;
    assert_eq!(
        attempt_rows(&db, "attempt_log", id).await,
        vec![(1, 1), (2, 1)]
    );
}

/// A delivered attempt settles its delivery only while its pump still holds
/// the lease of that attempt: a pump whose lease ran out and was taken over
/// has its "delivered" logged as an attempt, and the delivery stays with the
/// pump that holds it, which settles it with its own attempt.
#[tokio::test]
async fn a_delivered_attempt_settles_only_while_its_pump_holds_the_lease() {
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "app", "acme/web/", all()).await;
    let (id, attempt) = claimed(&db, "acme/web/a").await;
    assert_eq!(attempt, 1);
    expire_lease(&db, id).await;
    assert_eq!(claim_as(&db, "q").await, vec![(id, 2)]);

    report(&db, "p", id, 1, "delivered", 200).await;
    assert_eq!(db.delivery_state(id).await, "in_flight", "q holds it");
    let held: (Option<String>, i32) =
        sqlx::query_as("select leased_by, attempts from watchpump.queue where id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(held, (Some("q".to_string()), 2));
    assert_eq!(attempt_rows(&db, "attempt_log", id).await, vec![(1, 1)]);

    report(&db, "q", id, 2, "delivered", 201).await;
    let settled: (String, i32, Option<i32>, Option<String>) = sqlx::query_as(
        "select state, attempts, last_status, last_pump from watchpump.settled where id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        settled,
        ("delivered".to_string(), 2, Some(201), Some("q".to_string()))
    );
}

/// One batch may report two attempts of one delivery: an earlier one that
/// failed, recorded after its lease ran out, and the one that delivered
/// (the same pump claimed it again). The delivered one settles it; the
/// earlier one is still kept, as an attempt.
#[tokio::test]
async fn a_batch_with_a_late_failure_and_the_delivery_of_one_delivery_keeps_both() {
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "app", "acme/web/", all()).await;
    let (id, attempt) = claimed(&db, "acme/web/a").await;
    assert_eq!(attempt, 1);
    expire_lease(&db, id).await;
    assert_eq!(claim_as(&db, "p").await, vec![(id, 2)]);

    let states: Vec<(i64, String)> = sqlx::query_as(
        "select delivery_id, state from watchpump.complete('p', array[
             row($1, 1, 'retry', 503, 'HTTP 503', now(), 1.0, '', now())::watchpump.attempt_report,
             row($1, 2, 'delivered', 200, null, now(), 1.0, '', null)::watchpump.attempt_report])",
    )
    .bind(id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(states, vec![(id, "delivered".to_string())]);
    assert_eq!(db.delivery_state(id).await, "delivered");
    let logged: Vec<(i32, Option<i32>)> = sqlx::query_as(
        "select attempt, status from watchpump.attempt_log where delivery_id = $1 order by attempt",
    )
    .bind(id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(logged, vec![(1, Some(503))], "the late failure is kept");
}

/// Retention copies a day's kept attempts without a lock, then copies again
/// under its lock those of deliveries still queued: an attempt folded into
/// such a delivery's row while the copy ran, and committed before the
/// lock, is in the kept partition as committed.
#[tokio::test]
async fn an_attempt_folded_while_retention_copies_the_day_is_kept_as_committed() {
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "app", "acme/", all()).await;
    old_day(&db, 10, 200).await;
    // One of the day's failures, retried by an operator and claimed: its
    // next failed attempt folds into the row of its first.
    let id: i64 = scalar(
        &db,
        "select min(id) from watchpump.settled where state = 'failed'",
    )
    .await;
    sqlx::query("select watchpump.retry($1, 'ada')")
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(claim_as(&db, "p").await, vec![(id, 2)]);
    let day: String = scalar_text(
        &db,
        "select name from watchpump.partitions where parent = 'attempt_log' and to_at < now() - interval '9 days'",
    )
    .await;

    // The fold, left uncommitted while retention copies the day.
    let mut fold = db.pool.begin().await.unwrap();
    sqlx::query(
        "select * from watchpump.complete('p', array[row($1, 2, 'retry', 500, 'HTTP 500', now(), 1.0, '',
                                                          now() + interval '1 hour')::watchpump.attempt_report])",
    )
    .bind(id)
    .execute(&mut *fold)
    .await
    .unwrap();
    let mut retention = db.pool.acquire().await.unwrap();
    let backend = backend_pid(&mut retention).await;
    let retire = tokio::spawn(async move {
        sqlx::query("set lock_timeout = '60s'")
            .execute(&mut *retention)
            .await
            .unwrap();
        sqlx::query(
            "select * from watchpump.retire_partitions(
                 (select to_at from watchpump.partitions where parent = 'attempt_log'
                  and to_at < now() - interval '9 days'), '7 days', '30 days')",
        )
        .execute(&mut *retention)
        .await
    });
    // Retention has copied the day and waits for its lock, which the fold's
    // transaction holds (complete() writes through every attempt_log
    // partition): the fold commits then.
    eventually(WAIT, "retention waits for the fold's locks", || {
        assert!(
            !retire.is_finished(),
            "retention waits for the fold's locks"
        );
        waits_for_a_lock(&db.pool, backend)
    })
    .await;
    fold.commit().await.unwrap();
    retire.await.unwrap().expect("the day is retired");

    assert_eq!(
        attempt_rows(&db, &format!("{day}_kept"), id).await,
        vec![(1, 2)],
        "the folded attempt, as committed"
    );
    let kept: i64 = scalar(&db, &format!("select count(*) from watchpump.{day}_kept")).await;
    assert_eq!(kept, 10, "the day's ten failures, each with its one row");
}

/// The suffix of the partitions of the day `days_ago` (`20261124`).
async fn day_suffix(db: &TestDb, days_ago: i32) -> String {
    sqlx::query_scalar(
        "select to_char(now() at time zone 'UTC' - $1 * interval '1 day', 'YYYYMMDD')",
    )
    .bind(days_ago)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

async fn prune(db: &TestDb) {
    sqlx::query("select * from watchpump.prune('7 days', '30 days', 500)")
        .execute(&db.pool)
        .await
        .unwrap();
}

/// A day made with its kept tables (0017_staged_failures.sql) keeps its
/// failures where settle() wrote them as they failed: retirement attaches
/// that very table in the day's place, without copying the failures out of
/// the day, and adds only what it keeps besides: a failure an operator
/// retried and that was delivered (late: within the retention), with its
/// change and attempt. A failure retried and failed again is there once,
/// with all its attempts.
#[tokio::test]
async fn a_days_failures_are_kept_in_the_table_they_were_written_to_as_they_failed() {
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "app", "acme/", all()).await;
    old_day(&db, 10, 1000).await;
    let suffix = day_suffix(&db, 10).await;
    let failures = scalar(
        &db,
        "select count(*) from watchpump.settled where state = 'failed'",
    )
    .await;
    assert!(failures >= 40, "{failures}");
    let kept_table = format!("watchpump.settled_{suffix}_kept");
    let staged_oid = scalar(
        &db,
        &format!("select '{kept_table}'::regclass::oid::bigint"),
    )
    .await;
    assert_eq!(
        scalar(&db, &format!("select count(*) from {kept_table}")).await,
        failures,
        "written there as they failed"
    );

    // Retried, then delivered now.
    let late = scalar(
        &db,
        "select min(id) from watchpump.settled where state = 'failed'",
    )
    .await;
    sqlx::query("select watchpump.retry($1)")
        .bind(late)
        .execute(&db.pool)
        .await
        .unwrap();
    set_state(&db, &[late], "delivered", None).await;
    // Retried, attempted again today, failed again.
    let again = scalar(
        &db,
        "select max(id) from watchpump.settled where state = 'failed'",
    )
    .await;
    sqlx::query("select watchpump.retry($1)")
        .bind(again)
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query(
        "insert into watchpump.attempt_log (delivery_id, attempt, started_at, duration_ms, status, pump)
         values ($1, 2, now(), 1, 503, 'p')",
    )
    .bind(again)
    .execute(&db.pool)
    .await
    .unwrap();
    set_state(&db, &[again], "failed", None).await;

    prune(&db).await;
    assert_eq!(
        scalar(
            &db,
            &format!("select '{kept_table}'::regclass::oid::bigint")
        )
        .await,
        staged_oid,
        "the table written as they failed is the day's kept partition: nothing was copied"
    );
    let (failed, delivered, without_change): (i64, i64, i64) = sqlx::query_as(
        "select count(*) filter (where s.state = 'failed'),
                count(*) filter (where s.state = 'delivered' and s.id = $1),
                count(*) filter (where not exists (select 1 from watchpump.changes c
                                                   where c.id = s.change_id))
         from watchpump.settled s where s.object like 'acme/old%'",
    )
    .bind(late)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (failed, delivered, without_change),
        (failures - 1, 1, 0),
        "the failures and the delivery retried late, each with its change; the rest went"
    );
    assert_eq!(
        scalar(&db, "select count(*) from watchpump.settled").await,
        failures,
        "nothing else"
    );
    assert_eq!(
        attempt_rows(&db, "attempt_log", late).await,
        vec![(1, 1)],
        "the late delivery's attempt"
    );
    assert_eq!(
        attempt_rows(&db, "attempt_log", again).await,
        vec![(1, 1), (2, 1)],
        "each attempt once"
    );
    assert_eq!(
        scalar(&db, "select count(*) from watchpump.attempt_log").await,
        failures + 1,
        "an attempt per kept delivery, and the second one"
    );
}

/// A failure that did not go through settle() (written by hand) is not in
/// its day's kept table: retirement sees the count differ and copies what
/// it keeps out of the day, as for a day made before the kept tables.
#[tokio::test]
async fn a_failure_written_by_hand_is_kept_by_copying_its_day() {
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "app", "acme/", all()).await;
    old_day(&db, 10, 200).await;
    let suffix = day_suffix(&db, 10).await;
    let kept_table = format!("watchpump.settled_{suffix}_kept");
    let staged_oid = scalar(
        &db,
        &format!("select '{kept_table}'::regclass::oid::bigint"),
    )
    .await;
    let failures = scalar(
        &db,
        "select count(*) from watchpump.settled where state = 'failed'",
    )
    .await;
    let by_hand = scalar(
        &db,
        "select min(id) from watchpump.settled where state = 'delivered'",
    )
    .await;
    sqlx::query("update watchpump.settled set state = 'failed', last_status = 503 where id = $1")
        .bind(by_hand)
        .execute(&db.pool)
        .await
        .unwrap();

    prune(&db).await;
    assert_ne!(
        scalar(
            &db,
            &format!("select '{kept_table}'::regclass::oid::bigint")
        )
        .await,
        staged_oid,
        "a copy"
    );
    assert_eq!(
        scalar(
            &db,
            "select count(*) from watchpump.settled s
             where s.state = 'failed'
               and exists (select 1 from watchpump.changes c where c.id = s.change_id)",
        )
        .await,
        failures + 1,
        "every failure kept, with its change, the one written by hand too"
    );
    assert_eq!(
        scalar(&db, "select count(*) from watchpump.settled").await,
        failures + 1
    );
    assert_eq!(
        scalar(&db, "select count(*) from watchpump.staged_settled").await,
        0,
        "the kept tables of the day gave way"
    );
}
