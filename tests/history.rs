//! The history tells the truth (issue 18): a delivered delivery shows the
//! answer that delivered it, the last retry is made at the deadline and
//! "failed" means the deadline passed, a failure an operator retried stays
//! in the history, the delivery window is read where each delivery is
//! created, and the sweep reports only what it did.
//! (A NULL payload is `{}` for filters too: tests/bounds.rs.)

mod common;

use std::time::Duration;

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
async fn a_delivered_delivery_shows_its_delivering_answer_and_keeps_earlier_errors_in_its_attempts(
) {
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
        "select delivery_id, attempt from watchpump.claim('p', '{}', '{}', '{}', 10, '1 minute')
         where delivery_id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// Reports a failed attempt (HTTP 500) whose back-off says `next`.
async fn report_500(db: &TestDb, id: i64, attempt: i32, next: &str) -> Vec<(String, Option<bool>)> {
    sqlx::query_as(&format!(
        "select c.state, c.next_attempt_at = q.deadline
         from watchpump.complete('p', array[$1::bigint], array[$2::int], '{{retry}}', '{{500}}',
                                 '{{\"HTTP 500\"}}', array[now()], '{{1.0}}', '{{\"\"}}',
                                 array[{next}]) c
         left join watchpump.queue q on q.id = c.delivery_id"
    ))
    .bind(id)
    .bind(attempt)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn the_last_retry_is_made_at_the_deadline_and_failed_means_the_deadline_passed() {
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "app", "acme/web/", all()).await;

    // The back-off says in an hour; the deadline is in ten minutes: the
    // delivery stays pending, due at its deadline (before, it failed here).
    let (id, attempt) = claimed(&db, "acme/web/a").await;
    sqlx::query("update watchpump.queue set deadline = now() + interval '10 minutes' where id = $1")
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
    let attempt_of_first: i32 = sqlx::query_scalar("select attempts from watchpump.queue where id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(attempt_of_first, 2, "claimed again at its deadline");
    let outcome = report_500(&db, id, attempt_of_first, "now() + interval '1 hour'").await;
    assert_eq!(outcome, vec![("failed".to_string(), None)]);
    let error: String = sqlx::query_scalar("select last_error from watchpump.settled where id = $1")
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
