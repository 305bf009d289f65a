//! The core protocol end to end: real PostgreSQL, real HTTP consumers.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(15);

#[tokio::test]
async fn a_committed_change_reaches_the_consumer_with_the_documented_body_and_headers() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (service, _) = db.add_service("deploy", &consumer.base_url()).await;
    let watch = db
        .add_watch(service.id, "app-7", "acme/web/refs/heads/main", all())
        .await;
    let pump = RunningPump::start(&db.pool, pump_config());

    let change_id = db
        .emit(
            "acme/web/refs/heads/main",
            "push",
            json!({"after": "9f2c", "paths": ["a"]}),
        )
        .await;

    let got = consumer.wait_for(1, WAIT).await;
    let r = &got[0];
    assert_eq!(r.path, "/api/v1/git/events");
    assert_eq!(
        r.headers["authorization"],
        format!("Bearer {PRODUCER_TOKEN}")
    );
    assert_eq!(r.headers["content-type"], "application/json");
    let delivery_id: i64 =
        sqlx::query_scalar("select id from watchpump.deliveries where change_id = $1")
            .bind(change_id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(r.headers["watchpump-delivery"], delivery_id.to_string());
    let occurred_at: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("select occurred_at from watchpump.changes where id = $1")
            .bind(change_id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let body = &r.body;
    assert_eq!(body["delivery_id"], delivery_id);
    assert_eq!(body["change_id"], change_id);
    assert_eq!(body["watch_id"], watch.id);
    assert_eq!(body["resource"], "app-7");
    assert_eq!(body["object"], "acme/web/refs/heads/main");
    assert_eq!(body["kind"], "push");
    assert_eq!(body["sequence"], 1);
    assert_eq!(body["attempt"], 1);
    assert_eq!(body["producer"], "git");
    assert_eq!(body["payload"], json!({"after": "9f2c", "paths": ["a"]}));
    let sent_at: chrono::DateTime<chrono::Utc> =
        body["occurred_at"].as_str().unwrap().parse().unwrap();
    assert_eq!(sent_at, occurred_at);

    db.wait_state(delivery_id, "delivered", WAIT).await;
    let (attempts, status): (i64, Option<i32>) = sqlx::query_as(
        "select count(*), max(status) from watchpump.attempts where delivery_id = $1",
    )
    .bind(delivery_id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((attempts, status), (1, Some(200)));
    pump.stop().await.unwrap();
    assert_eq!(consumer.count(), 1, "delivered exactly once");
}

#[tokio::test]
async fn a_rolled_back_change_is_never_sent() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (service, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(service.id, "app", "acme/web/refs/heads/main", all())
        .await;
    let pump = RunningPump::start(&db.pool, pump_config());

    let mut tx = db.pool.begin().await.unwrap();
    watchpump::emit(
        &mut tx,
        "acme/web/refs/heads/main",
        "push",
        &json!({"n": "rolled back"}),
    )
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    // A committed change afterwards is the marker: once it has arrived, the
    // rolled-back one would have arrived before it.
    db.emit(
        "acme/web/refs/heads/main",
        "push",
        json!({"n": "committed"}),
    )
    .await;

    let got = consumer.wait_for(1, WAIT).await;
    // Give sweeps a few rounds to send anything else they could find.
    tokio::time::sleep(Duration::from_millis(800)).await;
    pump.stop().await.unwrap();
    let got_all = consumer.received();
    assert_eq!(got_all.len(), 1, "only the committed change: {got_all:?}");
    assert_eq!(got[0].body["payload"]["n"], "committed");
    let changes: i64 = sqlx::query_scalar("select count(*) from watchpump.changes")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(changes, 1, "the rolled-back change left no row");
}

/// The watches a change was delivered to, by id.
async fn watches_matched(db: &TestDb, change: i64) -> Vec<i64> {
    sqlx::query_scalar(
        "select watch_id from watchpump.deliveries where change_id = $1 order by watch_id",
    )
    .bind(change)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn filters_select_exactly_the_matching_watches() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (service, _) = db.add_service("deploy", &consumer.base_url()).await;
    let main = "acme/web/refs/heads/main";
    let exact = db.add_watch(service.id, "exact", main, all()).await;
    let pushes = db
        .add_watch(service.id, "pushes", main, kinds(&["push"]))
        .await;
    let tags = db
        .add_watch(service.id, "tags", main, kinds(&["tag"]))
        .await;
    let prefix = db.add_watch(service.id, "prefix", "acme/web/", all()).await;
    let other_prefix = db
        .add_watch(service.id, "other-prefix", "acme/api/", all())
        .await;
    let partial = db.add_watch(service.id, "partial", "acme/we", all()).await;
    let docs = db
        .add_watch(
            service.id,
            "docs",
            "acme/",
            matching(r#"$.paths[*] ? (@ starts with "docs/")"#),
        )
        .await;
    let forced = db
        .add_watch(service.id, "forced", main, matching("$.forced == true"))
        .await;
    let other_object = db
        .add_watch(service.id, "other", "acme/web/refs/heads/dev", all())
        .await;

    let change = db
        .emit(
            main,
            "push",
            json!({"paths": ["src/a.rs", "docs/x.md"], "forced": false}),
        )
        .await;
    let matched = watches_matched(&db, change).await;
    assert_eq!(matched, vec![exact.id, pushes.id, prefix.id, docs.id]);

    let change = db
        .emit(main, "tag", json!({"paths": ["src/a.rs"], "forced": true}))
        .await;
    let matched = watches_matched(&db, change).await;
    assert_eq!(matched, vec![exact.id, tags.id, prefix.id, forced.id]);

    // A predicate whose answer is unknown (a string compared with true) does
    // not match; a path that selects nothing does not either.
    let change = db.emit(main, "tag", json!({"forced": "yes"})).await;
    let matched = watches_matched(&db, change).await;
    assert_eq!(matched, vec![exact.id, tags.id, prefix.id]);
    let _ = (other_prefix, partial, other_object);
}

#[tokio::test]
async fn concurrent_emitters_on_one_object_get_increasing_sequences_in_commit_order() {
    let db = TestDb::new().await;
    db.add_service("deploy", "http://127.0.0.1:9").await;
    let mut tasks = Vec::new();
    for writer in 0..8 {
        let pool = db.pool.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                let mut tx = pool.begin().await.unwrap();
                watchpump::emit(
                    &mut tx,
                    "acme/web/refs/heads/main",
                    "push",
                    &json!({"w": writer, "i": i}),
                )
                .await
                .unwrap();
                // Some work after emit, so that transactions overlap.
                if i % 3 == 0 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                tx.commit().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // The test cluster tracks commit timestamps: sequence order must be
    // commit order.
    let rows: Vec<(i64, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "select sequence, pg_xact_commit_timestamp(xmin) from watchpump.changes where object = $1 order by sequence",
    )
    .bind("acme/web/refs/heads/main")
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 200);
    for (i, pair) in rows.windows(2).enumerate() {
        assert_eq!(pair[1].0, pair[0].0 + 1, "sequences are gapless at {i}");
        assert!(
            pair[1].1 >= pair[0].1,
            "sequence {} committed before {}",
            pair[1].0,
            pair[0].0
        );
    }
}

/// At a trickle (one change at a time, the pump asleep between them) a
/// delivery costs the database three claims: the one that takes it, the
/// one that follows the pump's sleeper row (it sees what committed while
/// the pump registered), and the one after its write-back (which ends its
/// lease, and may free newer news of its object). Not a fourth right after
/// the first, nor one when its send finishes with its consumer's window
/// not full: those found nothing. Counted by PostgreSQL
/// (`track_functions`), over 20 changes.
#[tokio::test]
async fn a_delivery_at_a_trickle_costs_three_claims() {
    let db = TestDb::new().await;
    sqlx::query(&format!(
        "alter database {} set track_functions = 'pl'",
        db.name
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let consumer = Receiver::start().await;
    let (service, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(service.id, "app", "acme/", all()).await;
    let mut cfg = pump_config();
    // No sweep, and so no claim after one, while the changes go.
    cfg.sweep_interval_ms = 600_000;
    let pump = RunningPump::start(&db.pool, cfg);
    const CHANGES: usize = 20;
    for n in 0..CHANGES {
        // One at a time: each waits for the last to be written back.
        let change = db
            .emit(&format!("acme/repo/refs/heads/b{n}"), "push", json!({}))
            .await;
        db.wait_state(delivery_of(&db, change).await, "delivered", WAIT)
            .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(consumer.count(), CHANGES);
    pump.stop().await.unwrap();
    // A backend reports its counts as its connection closes.
    let mut claims = 0i64;
    for _ in 0..100 {
        claims = sqlx::query_scalar(
            "select coalesce(sum(calls), 0)::int8 from pg_stat_user_functions
             where schemaname = 'watchpump' and funcname = 'claim'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        let open: i64 = sqlx::query_scalar(
            "select count(*) from pg_stat_activity
             where datname = current_database() and application_name = 'watchpump-pump'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if open == 0 && claims > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The start-up's claim and the one after the sleeper row (and one
    // for the listener's first connection), then three a delivery at most;
    // a fourth a delivery made 80 and more (90 before).
    assert!(
        claims >= CHANGES as i64 && claims <= 3 * CHANGES as i64 + 6,
        "{claims} claims for {CHANGES} deliveries"
    );
}
