//! Delivery engine v4 (issue 33), against the test cluster, real pumps and
//! consumers on loopback:
//!
//! - a claim reads, per row it returns, the same buffers on a backlog of
//!   200,000 as on one of 200, a backlog one transaction emitted (every row
//!   due at the same instant), analyzed, with a paused watch and other
//!   services beside it (`EXPLAIN (ANALYZE, BUFFERS)` of `claim()`);
//! - a pump gives back, on a graceful stop, what it claimed ahead and has
//!   not sent: pending again at once, as the same attempt;
//! - a pump killed between a send and the flush of its outcome sends it
//!   again once its lease runs out: never lost, never out of order;
//! - newer news of a (watch, object) waits for the older delivery's
//!   outcome one flush, no longer: the flush wakes the claim.
//!
//! emit_many()'s rules are in tests/emit_many.rs.

mod common;

use std::process::Stdio;
use std::time::{Duration, SystemTime};

use common::*;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

/// Emits `n` changes to distinct objects under `prefix` in one transaction
/// (one emit_many() a 50,000): every delivery due at the same instant, the
/// shape whose statistics once planned a claim that read the whole backlog.
async fn backlog(db: &TestDb, prefix: &str, n: usize) {
    let mut tx = db.pool.begin().await.unwrap();
    let payload = json!({"after": "9f2c1e"});
    let objects: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    for chunk in objects.chunks(50_000) {
        let changes: Vec<watchpump::emit::Change> = chunk
            .iter()
            .map(|object| watchpump::emit::Change {
                object,
                kind: "push",
                payload: &payload,
            })
            .collect();
        watchpump::emit::emit_many(&mut tx, &changes).await.unwrap();
    }
    tx.commit().await.unwrap();
}

/// Shared buffers a claim of up to 64 for the service read, and the rows it
/// returned, by EXPLAIN (ANALYZE, BUFFERS) of `watchpump.claim()` (the
/// function scan's buffers count every statement inside it), rolled back.
async fn claim_buffers(db: &TestDb, service_id: i64) -> (i64, i64) {
    let mut tx = db.pool.begin().await.unwrap();
    let plan: serde_json::Value = sqlx::query_scalar(
        "explain (analyze, buffers, format json)
         select * from watchpump.claim('depth', array[row($1, 64, false)::watchpump.claim_slot],
                                       1, '1 minute')",
    )
    .bind(service_id)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    let node = &plan[0]["Plan"];
    let buffers =
        node["Shared Hit Blocks"].as_i64().unwrap() + node["Shared Read Blocks"].as_i64().unwrap();
    (buffers, node["Actual Rows"].as_i64().unwrap())
}

#[tokio::test]
async fn a_claim_reads_the_same_buffers_a_row_at_any_backlog_depth() {
    let db = TestDb::new().await;
    let (deep, _) = db.add_service("deep", "http://127.0.0.1:9").await;
    let (shallow, _) = db.add_service("shallow", "http://127.0.0.1:9").await;
    // Other services with work, and a paused watch with due deliveries of
    // its own beside each backlog (its rows are stepped over, not claimed).
    for name in ["a", "b", "c"] {
        let (other, _) = db.add_service(name, "http://127.0.0.1:9").await;
        db.add_watch(other.id, "r", &format!("{name}/"), all())
            .await;
        backlog(&db, &format!("{name}/o"), 100).await;
    }
    for (svc, prefix, n) in [(&deep, "deep/", 200_000), (&shallow, "shallow/", 200)] {
        let paused = db.add_watch(svc.id, "paused", prefix, all()).await;
        backlog(&db, prefix, 10).await;
        sqlx::query("update watchpump.watches set paused_at = now() where id = $1")
            .bind(paused.id)
            .execute(&db.pool)
            .await
            .unwrap();
        db.add_watch(svc.id, "live", prefix, all()).await;
        backlog(&db, &format!("{prefix}o"), n).await;
    }
    sqlx::query("analyze watchpump.queue")
        .execute(&db.pool)
        .await
        .unwrap();
    let (deep_buffers, deep_rows) = claim_buffers(&db, deep.id).await;
    let (shallow_buffers, shallow_rows) = claim_buffers(&db, shallow.id).await;
    // 64 for the service asked about, one each for the others (a claim
    // offers services it was not told of their first delivery).
    assert_eq!(deep_rows, 68, "the deep service's claim fills its slots");
    assert_eq!(shallow_rows, 68, "and the shallow one's");
    let per_row = |buffers: i64, rows: i64| buffers as f64 / rows as f64;
    let (deep_per_row, shallow_per_row) = (
        per_row(deep_buffers, deep_rows),
        per_row(shallow_buffers, shallow_rows),
    );
    // A claim that read its service's due range would read over 1,000
    // buffers a row here (200,000 rows, a few thousand pages).
    eprintln!("claim buffers: at 200,000 {deep_buffers} for {deep_rows} rows; at 200 {shallow_buffers} for {shallow_rows}");
    assert!(
        deep_per_row <= 2.0 * shallow_per_row + 5.0,
        "a claim at 200,000 read {deep_buffers} buffers for {deep_rows} rows ({deep_per_row:.1} a row); \
         at 200, {shallow_buffers} for {shallow_rows} ({shallow_per_row:.1} a row)"
    );
}

#[tokio::test]
async fn a_graceful_stop_gives_back_what_was_claimed_ahead_unsent() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    consumer.hold();
    let (svc, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(svc.id, "app", "acme/", all()).await;
    for n in 0..20 {
        db.emit(&format!("acme/web/b{n}"), "push", json!({})).await;
    }
    let mut cfg = pump_config();
    cfg.service_concurrency = 4;
    cfg.initial_concurrency = 4;
    let pump = RunningPump::start(&db.pool, cfg);
    consumer.wait_for_arrivals(4, WAIT).await;
    // Four on the wire (held), four more claimed ahead, waiting.
    let leased = || async {
        sqlx::query_scalar::<_, i64>(
            "select count(*) from watchpump.queue where lease_until > now()",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap()
    };
    eventually(WAIT, "a window claimed ahead", || async {
        leased().await == 8
    })
    .await;
    let sent: Vec<i64> = sqlx::query_scalar(
        "select id from watchpump.queue where lease_until > now() order by id limit 4",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let stopping = tokio::spawn(pump.stop());
    // What waited is given back before the requests on the wire end.
    eventually(WAIT, "the four waiting given back", || async {
        leased().await == 4
    })
    .await;
    let given_back: i64 = sqlx::query_scalar(
        "select count(*) from watchpump.queue
         where lease_until is null and leased_by is null and attempts = 0",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        given_back, 16,
        "the 4 claimed ahead are pending again as attempt 1, beside the 12 never claimed"
    );
    assert_eq!(consumer.arrivals(), 4, "nothing waiting was sent");
    consumer.release();
    stopping.await.unwrap().unwrap();
    for id in sent {
        assert_eq!(db.delivery_state(id).await, "delivered");
    }
    // Another pump sends the rest, each once.
    let pump = RunningPump::start(&db.pool, pump_config());
    consumer.wait_for(20, WAIT).await;
    eventually(WAIT, "all delivered", || async {
        db.count_state("delivered").await == 20
    })
    .await;
    pump.stop().await.unwrap();
    let attempts: Vec<i64> = consumer
        .received()
        .iter()
        .map(|r| r.body["attempt"].as_i64().unwrap())
        .collect();
    assert!(
        attempts.iter().all(|a| *a == 1),
        "each sent once, as attempt 1: {attempts:?}"
    );
}

/// `watchpump serve` with a flush interval longer than the test: nothing it
/// sends is recorded until it stops (or is killed).
fn slow_flushing_pump(db: &TestDb) -> KillOnDrop {
    let mut cmd = watchpump_cli(Some(&db.url));
    cmd.arg("serve")
        .env("WATCHPUMP_LISTEN", "127.0.0.1:0")
        .env("WATCHPUMP_METRICS_LISTEN", "off")
        .env("WATCHPUMP_PRODUCER", PRODUCER)
        .env("WATCHPUMP_PRODUCER_TOKEN", PRODUCER_TOKEN)
        .env("WATCHPUMP_FLUSH_INTERVAL_MS", "600000")
        .env("WATCHPUMP_LEASE_MS", "2000000")
        .env("WATCHPUMP_REQUEST_TIMEOUT_MS", "1000")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    KillOnDrop(cmd.spawn().unwrap())
}

#[tokio::test]
async fn a_pump_killed_between_send_and_flush_sends_again_never_loses_never_reorders() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (svc, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(svc.id, "app", "acme/", all()).await;
    let mut killed = slow_flushing_pump(&db);
    let first = db.emit("acme/web/main", "push", json!({"n": 1})).await;
    let other = db.emit("acme/api/main", "push", json!({"n": 1})).await;
    consumer.wait_for(2, WAIT).await;
    killed.0.kill().unwrap();
    killed.0.wait().unwrap();
    // Both were answered 200 and neither outcome was written.
    for change in [first, other] {
        let id = delivery_of(&db, change).await;
        assert_eq!(db.delivery_state(id).await, "in_flight");
    }
    // Newer news of one object meanwhile; then the leases run out (ended
    // here, as the lease would end) and another pump takes over.
    let newer = db.emit("acme/web/main", "push", json!({"n": 2})).await;
    sqlx::query("update watchpump.queue set lease_until = now() where lease_until is not null")
        .execute(&db.pool)
        .await
        .unwrap();
    let pump = RunningPump::start(&db.pool, pump_config());
    eventually(WAIT, "every delivery settled", || async {
        sqlx::query_scalar::<_, i64>("select count(*) from watchpump.queue")
            .fetch_one(&db.pool)
            .await
            .unwrap()
            == 0
    })
    .await;
    pump.stop().await.unwrap();
    // Nothing lost: the unrecorded delivery alone is sent again; the one
    // with newer news waiting is superseded by it (it had arrived).
    assert_eq!(
        db.delivery_state(delivery_of(&db, other).await).await,
        "delivered"
    );
    assert_eq!(
        db.delivery_state(delivery_of(&db, first).await).await,
        "superseded"
    );
    assert_eq!(
        db.delivery_state(delivery_of(&db, newer).await).await,
        "delivered"
    );
    let received = consumer.received();
    let of = |object: &str| -> Vec<(i64, i64)> {
        received
            .iter()
            .filter(|r| r.body["object"] == object)
            .map(|r| {
                (
                    r.body["sequence"].as_i64().unwrap(),
                    r.body["attempt"].as_i64().unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(
        of("acme/api/main"),
        vec![(1, 1), (1, 2)],
        "sent again after the crash"
    );
    assert_eq!(
        of("acme/web/main"),
        vec![(1, 1), (2, 1)],
        "never older news after newer"
    );
}

#[tokio::test]
async fn newer_news_waits_for_the_older_outcome_one_flush_and_no_longer() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (svc, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(svc.id, "app", "acme/", all()).await;
    let mut cfg = pump_config();
    // No sweep to fall back on: only the flush can wake the claim of the
    // newer news, which waits while the older delivery's lease holds.
    cfg.sweep_interval_ms = 3_600_000;
    cfg.flush_interval_ms = 500;
    let pump = RunningPump::start(&db.pool, cfg);
    let older = db.emit("acme/web/main", "push", json!({"n": 1})).await;
    consumer.wait_for(1, WAIT).await;
    // Answered, its outcome not yet written: newer news now.
    let newer = db.emit("acme/web/main", "push", json!({"n": 2})).await;
    consumer.wait_for(2, WAIT).await;
    pump.stop().await.unwrap();
    let received = consumer.received();
    assert_eq!(received[1].body["change_id"], newer);
    // Both clocks read at once: the arrival's instant as wall-clock time.
    let arrival_of_newer = SystemTime::now() - received[1].at.elapsed();
    // It went after the older one was recorded, not before.
    let settled_at: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("select finished_at from watchpump.settled where change_id = $1")
            .bind(older)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(
        settled_at <= chrono::DateTime::<chrono::Utc>::from(arrival_of_newer),
        "the newer news went before the older outcome was written"
    );
}
