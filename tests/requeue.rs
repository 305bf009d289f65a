//! Whatever puts a delivery back in play (an expired lease, an operator's
//! retry) never lets older news of an object overtake newer news already on
//! its way: one (watch, object) has one delivery under way.

mod common;

use common::*;
use serde_json::json;

const OBJECT: &str = "acme/web/refs/heads/main";

/// Two deliveries of one (watch, object); returns their ids, oldest first.
async fn two_deliveries(db: &TestDb) -> (i64, i64) {
    let (service, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(service.id, "app", OBJECT, all()).await;
    let first = db.emit(OBJECT, "push", json!({"n": 1})).await;
    let older: i64 = sqlx::query_scalar("select id from watchpump.deliveries where change_id = $1")
        .bind(first)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    // The older one is taken by a pump that then vanishes (its lease ran out)...
    sqlx::query("update watchpump.queue set attempts = 1, leased_by = 'gone', lease_until = now() - interval '1 second' where id = $1")
        .bind(older)
        .execute(&db.pool)
        .await
        .unwrap();
    // ...while newer news of the object arrives.
    let second = db.emit(OBJECT, "push", json!({"n": 2})).await;
    let newer: i64 = sqlx::query_scalar("select id from watchpump.deliveries where change_id = $1")
        .bind(second)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    (older, newer)
}

/// One claim by a pump named "test"; returns (delivery id, the pump whose
/// lease ran out) of what it claimed.
async fn claim(db: &TestDb) -> Vec<(i64, Option<String>)> {
    sqlx::query_as(
        "select delivery_id, expired_lease_of from watchpump.claim('test', '{}', 10, '1 minute')",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn an_expired_lease_with_newer_news_waiting_is_superseded_not_sent_again() {
    let db = TestDb::new().await;
    let (older, newer) = two_deliveries(&db).await;
    assert_eq!(
        claim(&db).await,
        vec![(newer, None)],
        "only the newer one is sent"
    );
    let (state, by): (String, Option<i64>) =
        sqlx::query_as("select state, superseded_by from watchpump.deliveries where id = $1")
            .bind(older)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), by), ("superseded", Some(newer)));
    assert_eq!(db.delivery_state(newer).await, "in_flight");
}

#[tokio::test]
async fn an_expired_lease_alone_is_sent_again_naming_the_pump_that_lost_it() {
    let db = TestDb::new().await;
    let (older, newer) = two_deliveries(&db).await;
    sqlx::query("delete from watchpump.queue where id = $1")
        .bind(newer)
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(claim(&db).await, vec![(older, Some("gone".to_string()))]);
    let attempts: i32 =
        sqlx::query_scalar("select attempts from watchpump.deliveries where id = $1")
            .bind(older)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(attempts, 2);
}

#[tokio::test]
async fn retry_refuses_older_news_while_newer_is_on_its_way() {
    let db = TestDb::new().await;
    let (older, newer) = two_deliveries(&db).await;
    set_state(&db, &[older], "failed", None).await;
    let err = sqlx::query("select watchpump.retry($1)")
        .bind(older)
        .execute(&db.pool)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("already on its way"), "{err}");
    assert_eq!(db.delivery_state(older).await, "failed", "nothing changed");
    assert_eq!(db.delivery_state(newer).await, "pending");
}

#[tokio::test]
async fn retry_failed_requeues_only_the_newest_failed_delivery_of_each_object() {
    let db = TestDb::new().await;
    let (older, newer) = two_deliveries(&db).await;
    let other = db.emit("acme/web/refs/heads/dev", "push", json!({})).await;
    let _ = other; // no watch on dev: no delivery
    set_state(&db, &[older, newer], "failed", None).await;
    let requeued: i32 =
        sqlx::query_scalar("select watchpump.retry_failed('deploy', now() - interval '1 hour')")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(requeued, 1);
    assert_eq!(db.delivery_state(newer).await, "pending");
    assert_eq!(db.delivery_state(older).await, "failed");
}
