//! The bounds of issue 17 that the producer's database and the pump keep
//! whatever their inputs (docs/security.md, "Bounds"): what one change may
//! be, what one claim may take, how the pump holds payloads, and what a
//! consumer's answers may cost in attempt rows. Each test sits at its bound.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::json;
use watchpump::pump::Pump;

const WAIT: Duration = Duration::from_secs(60);

/// The SQLSTATE and message of a refused emit() in a transaction of its own.
async fn refusal(
    db: &TestDb,
    object: &str,
    kind: &str,
    payload: serde_json::Value,
) -> (String, String) {
    let mut tx = db.pool.begin().await.unwrap();
    let err = watchpump::emit(&mut tx, object, kind, &payload)
        .await
        .expect_err("emit() should refuse this");
    let watchpump::Error::Database(sqlx::Error::Database(e)) = err else {
        panic!("not a database refusal: {err:?}");
    };
    (e.code().unwrap().to_string(), e.message().to_string())
}

async fn changes(db: &TestDb) -> i64 {
    sqlx::query_scalar("select count(*) from watchpump.changes")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn emit_refuses_what_is_over_a_limit_and_accepts_what_is_at_it() {
    let db = TestDb::new().await;
    let (service, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(service.id, "app", "acme/", all()).await;

    // A payload of 1 MiB of JSON text, as PostgreSQL prints it ({"a": "..."},
    // 9 bytes around the string), goes; one byte more does not.
    db.emit(
        "acme/big",
        "push",
        json!({ "a": "x".repeat(1_048_576 - 9) }),
    )
    .await;
    let over = json!({ "a": "x".repeat(1_048_576 - 8) });
    let (code, message) = refusal(&db, "acme/big", "push", over).await;
    assert_eq!(code, "54000");
    assert!(
        message.contains("payload") && message.contains("1048576"),
        "{message}"
    );

    // The limit is watchpump's own setting (watchpump.settings), which a
    // producer's session cannot raise; set outside its range it is refused.
    sqlx::query("update watchpump.settings set max_payload_bytes = 100")
        .execute(&db.pool)
        .await
        .unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("select set_config('watchpump.max_payload_bytes', '16777216', true)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let err = sqlx::query(
        "select watchpump.emit('acme/x', 'push', jsonb_build_object('a', repeat('y', 200)))",
    )
    .execute(&mut *tx)
    .await
    .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().code().unwrap(),
        "54000",
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("watchpump.settings.max_payload_bytes")
            && err.to_string().contains("100"),
        "{err}"
    );
    drop(tx);
    for beyond in ["0", "16777217"] {
        let err = sqlx::query(&format!(
            "update watchpump.settings set max_payload_bytes = {beyond}"
        ))
        .execute(&db.pool)
        .await
        .unwrap_err();
        assert_eq!(
            err.as_database_error().unwrap().code().unwrap(),
            "23514",
            "{err}"
        );
    }
    sqlx::query("update watchpump.settings set max_payload_bytes = default")
        .execute(&db.pool)
        .await
        .unwrap();

    // Objects: up to the 1,024 bytes a watch may follow, random (so that
    // nothing compresses it in an index); never an index error.
    let random: String = (0..1019)
        .map(|_| char::from(b'a' + rand::random::<u8>() % 26))
        .collect();
    let long_object = format!("acme/{random}");
    assert_eq!(long_object.len(), 1024);
    db.emit(&long_object, "push", json!({})).await;
    let (code, message) = refusal(&db, &format!("{long_object}x"), "push", json!({})).await;
    assert_eq!(code, "54000");
    assert!(
        message.contains("object") && message.contains("1024"),
        "{message}"
    );
    for bad in ["/x", "acme//web", ""] {
        let (code, message) = refusal(&db, bad, "push", json!({})).await;
        assert_eq!(code, "22023", "{bad:?}");
        assert!(message.contains("object"), "{message}");
    }

    // Kinds: 128 bytes at most.
    db.emit("acme/k", &"k".repeat(128), json!({})).await;
    let (code, message) = refusal(&db, "acme/k", &"k".repeat(129), json!({})).await;
    assert_eq!((code.as_str(), message.contains("kind")), ("54000", true));

    // Nothing refused was recorded: the accepted three are all there are.
    assert_eq!(changes(&db).await, 3);
    let stored: Vec<i32> =
        sqlx::query_scalar("select payload_bytes from watchpump.changes order by id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(stored, vec![1_048_576, 2, 2]);
}

#[tokio::test]
async fn a_null_payload_is_the_empty_object_for_filters_too() {
    let db = TestDb::new().await;
    let (service, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(service.id, "app", "acme/web", matching("!exists($.after)"))
        .await;
    let change: i64 = sqlx::query_scalar("select watchpump.emit('acme/web', 'push', null)")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let (payload, deliveries): (serde_json::Value, i64) = sqlx::query_as(
        "select c.payload, (select count(*) from watchpump.queue q where q.change_id = c.id)
         from watchpump.changes c where c.id = $1",
    )
    .bind(change)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(payload, json!({}));
    assert_eq!(deliveries, 1, "the filter saw {{}}, not NULL");
}

#[tokio::test]
async fn object_prefixes_stop_at_the_longest_object_a_watch_may_follow() {
    let db = TestDb::new().await;
    let prefixes: Vec<String> =
        sqlx::query_scalar("select unnest(watchpump.object_prefixes(repeat('a/', 20000)))")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert!(prefixes.len() <= 513, "{} prefixes", prefixes.len());
    assert!(prefixes[..prefixes.len() - 1]
        .iter()
        .all(|p| p.len() <= 1024));
    let ordinary: Vec<String> =
        sqlx::query_scalar("select unnest(watchpump.object_prefixes('acme/web/refs/heads/main'))")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        ordinary,
        [
            "acme/",
            "acme/web/",
            "acme/web/refs/",
            "acme/web/refs/heads/",
            "acme/web/refs/heads/main"
        ]
    );
}

/// `count` watches of one service on `acme/`.
async fn fan_out(db: &TestDb, count: usize) {
    let (service, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    for i in 0..count {
        db.add_watch(service.id, &format!("app-{i}"), "acme/", all())
            .await;
    }
}

/// (deliveries, changes, payloads returned) of one claim with these bounds.
async fn claim_with(db: &TestDb, rows: i32, bytes: i64) -> (i64, i64, i64) {
    sqlx::query_as(
        "select count(*), count(distinct change_id), count(payload)
         from watchpump.claim('test', '{}', 1000, '1 minute', $1, $2)",
    )
    .bind(rows)
    .bind(bytes)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_claim_is_bounded_by_rows_and_payload_bytes_and_returns_each_payload_once() {
    let db = TestDb::new().await;
    fan_out(&db, 4).await;
    for n in 0..3 {
        db.emit(
            &format!("acme/{n}"),
            "push",
            json!({"a": "x".repeat(100_000)}),
        )
        .await;
    }
    // Three changes of 100 KB, four deliveries each. 150 KB: the first
    // change, and the second (the bytes before it, 100 KB, are under the
    // bound), not the third.
    assert_eq!(claim_with(&db, 1000, 150_000).await, (8, 2, 2));
    // The rest: 1 byte still takes a whole first change.
    assert_eq!(claim_with(&db, 1000, 1).await, (4, 1, 1));

    let db = TestDb::new().await;
    fan_out(&db, 64).await;
    db.emit("acme/web", "push", json!({"a": 1})).await;
    assert_eq!(claim_with(&db, 10, 1 << 30).await, (10, 1, 1));
    assert_eq!(claim_with(&db, 1000, 1 << 30).await, (54, 1, 1));
}

#[tokio::test]
async fn the_claim_stays_an_index_lookup_on_a_queue_analyzed_empty() {
    let db = TestDb::new().await;
    // The statistics of an empty queue, its usual state, kept while a
    // backlog builds up (autovacuum would analyze it again).
    sqlx::query("alter table watchpump.queue set (autovacuum_enabled = false)")
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query("analyze watchpump.queue")
        .execute(&db.pool)
        .await
        .unwrap();
    fan_out(&db, 50).await;
    // 50 watches x 60 objects, and a second change of 20 of them: streams
    // with older news to supersede.
    sqlx::raw_sql(
        "select watchpump.emit('acme/' || i, 'push', '{}') from generate_series(1, 60) i;
         select watchpump.emit('acme/' || i, 'push', '{}') from generate_series(1, 20) i;",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let plan: serde_json::Value = sqlx::query_scalar(
        "explain (analyze, buffers, format json)
         select * from watchpump.claim('test', '{}', 10000, '1 minute', 5000, 1000000000)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let top = &plan[0]["Plan"];
    let rows = top["Actual Rows"].as_i64().unwrap();
    let buffers =
        top["Shared Hit Blocks"].as_i64().unwrap() + top["Shared Read Blocks"].as_i64().unwrap();
    assert_eq!(rows, 3000, "every stream's newest delivery");
    // Index lookups touch a few pages per delivery; a plan that scans the
    // queue (or one of its indexes) per delivery touches thousands.
    assert!(
        buffers < rows * 100,
        "{buffers} buffers for {rows} deliveries: the claim scans instead of looking up"
    );
}

/// A pump stepped by the test, with retries far enough ahead that only
/// `make_due` brings them, and a consumer never taken for down (which
/// would hold deliveries back for a probe).
fn stepped_pump(db: &TestDb) -> Pump {
    let mut cfg = pump_config();
    cfg.retry_initial_ms = 60_000;
    cfg.retry_max_ms = 120_000;
    cfg.down_after_failures = 1000;
    Pump::new(db.pool.clone(), cfg).expect("valid pump config")
}

async fn make_due(db: &TestDb) {
    sqlx::query("update watchpump.queue set next_attempt_at = now()")
        .execute(&db.pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn failures_fold_into_one_row_whatever_their_status() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (service, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(service.id, "app", "acme/web", all()).await;
    let change = db.emit("acme/web", "push", json!({})).await;
    let delivery = delivery_of(&db, change).await;
    let pump = stepped_pump(&db);
    consumer.reply_header("Retry-After", "1");
    for status in [400, 401, 403, 404, 422, 400] {
        consumer.reply_with(status);
        make_due(&db).await;
        assert_eq!(pump.step().await.unwrap().sent, 1);
    }
    /// attempt, repeats, first_status, status, statuses
    type Run = (i32, i32, Option<i32>, Option<i32>, serde_json::Value);
    let rows: Vec<Run> = sqlx::query_as(
        "select attempt, repeats, first_status, status, statuses from watchpump.attempt_log
         where delivery_id = $1",
    )
    .bind(delivery)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        vec![(
            1,
            6,
            Some(400),
            Some(400),
            json!({"400": 2, "401": 1, "403": 1, "404": 1, "422": 1})
        )]
    );
    let history: Vec<String> = sqlx::query_scalar(
        "select event || ': ' || detail from watchpump.delivery_history where delivery_id = $1
         order by at, seq",
    )
    .bind(delivery)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        history.iter().any(
            |h| h.starts_with("attempt 1-6: HTTP 400") && h.contains("6 attempts: HTTP 400 x2")
        ),
        "{history:?}"
    );
    // Retry-After: 1 did not replace the back-off: the next try is a
    // minute away, as the back-off says.
    let wait: f64 = sqlx::query_scalar(
        "select extract(epoch from next_attempt_at - now())::float8 from watchpump.queue where id = $1",
    )
    .bind(delivery)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(wait > 30.0, "next attempt in {wait} s");
}

#[tokio::test]
async fn a_delivery_keeps_at_most_twenty_attempt_rows() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (service, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(service.id, "app", "acme/web", all()).await;
    let change = db.emit("acme/web", "push", json!({})).await;
    let delivery = delivery_of(&db, change).await;
    // Twenty runs already, each broken off (attempt numbers with gaps, as
    // when pumps die mid-send), the last ending at attempt 40.
    sqlx::query(
        "insert into watchpump.attempt_log (delivery_id, attempt, started_at, duration_ms, status, pump,
                                            first_status, statuses)
         select $1, 2 * i, now(), 1, 500, 'gone', 500, '{\"500\": 1}' from generate_series(1, 20) i",
    )
    .bind(delivery)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query("update watchpump.queue set attempts = 45 where id = $1")
        .bind(delivery)
        .execute(&db.pool)
        .await
        .unwrap();
    consumer.reply_with(503);
    let pump = stepped_pump(&db);
    make_due(&db).await;
    assert_eq!(pump.step().await.unwrap().sent, 1);
    let (rows, newest): (i64, serde_json::Value) = sqlx::query_as(
        "select count(*), (select statuses from watchpump.attempt_log where delivery_id = $1
                           order by attempt desc limit 1)
         from watchpump.attempt_log where delivery_id = $1",
    )
    .bind(delivery)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(rows, 20, "attempt 46 folds into the newest row");
    assert_eq!(newest, json!({"500": 1, "503": 1}));
}

#[tokio::test]
async fn the_pump_keeps_its_global_in_flight_cap_across_services() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    for s in 0..3 {
        let (service, _) = db
            .add_service(&format!("svc-{s}"), &consumer.base_url())
            .await;
        for w in 0..5 {
            db.add_watch(service.id, &format!("app-{w}"), "acme/", all())
                .await;
        }
    }
    consumer.hold();
    db.emit("acme/web", "push", json!({})).await;
    let mut cfg = pump_config();
    cfg.max_in_flight = 4;
    let pump = RunningPump::start(&db.pool, cfg);
    consumer.wait_for_arrivals(4, WAIT).await;
    // Several sweeps and claims later, still only four on the wire.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let in_flight: i64 =
        sqlx::query_scalar("select count(*) from watchpump.queue where lease_until > now()")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(in_flight, 4);
    consumer.release();
    until(WAIT, "all 15 delivered", || async {
        let n = db.count_state("delivered").await;
        check(n == 15, format!("{n} delivered"))
    })
    .await;
    pump.stop().await.unwrap();
}

#[tokio::test]
async fn a_consumer_earns_its_concurrency_by_answering() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (service, _) = db.add_service("deploy", &consumer.base_url()).await;
    for w in 0..8 {
        db.add_watch(service.id, &format!("app-{w}"), "acme/", all())
            .await;
    }
    consumer.hold();
    db.emit("acme/web", "push", json!({})).await;
    let mut cfg = pump_config();
    cfg.initial_concurrency = 1;
    let pump = RunningPump::start(&db.pool, cfg);
    consumer.wait_for_arrivals(1, WAIT).await;
    // Several sweeps and claims later: a consumer that has not answered
    // yet has one request on the wire, not its 64, and the pump holds one
    // more claimed ahead of it (one window).
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(consumer.arrivals(), 1, "one request on the wire");
    let leased: i64 =
        sqlx::query_scalar("select count(*) from watchpump.queue where lease_until > now()")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(leased, 2, "one in flight and one window (1) claimed ahead");
    consumer.release();
    until(WAIT, "all 8 delivered", || async {
        let n = db.count_state("delivered").await;
        check(n == 8, format!("{n} delivered"))
    })
    .await;
    pump.stop().await.unwrap();
}

#[tokio::test]
async fn a_pump_killed_on_a_backlog_of_large_payloads_is_followed_by_one_that_makes_progress() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (service, _) = db.add_service("deploy", &consumer.base_url()).await;
    for w in 0..16 {
        db.add_watch(service.id, &format!("app-{w}"), "big/", all())
            .await;
    }
    for n in 0..6 {
        db.emit(
            &format!("big/{n}"),
            "push",
            json!({"a": "x".repeat(900_000)}),
        )
        .await;
    }
    // A payload from before the limit: far larger than the pump's budget.
    sqlx::query(
        "with c as (
             insert into watchpump.changes (object, kind, sequence, payload)
             values ('big/old', 'push', 1, jsonb_build_object('a', repeat('y', 1500000)))
             returning id)
         insert into watchpump.queue (change_id, watch_id, service_id, object, sequence, deadline)
         select c.id, w.id, w.service_id, 'big/old', 1, now() + interval '1 day'
         from c, watchpump.watches w",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    consumer.hold();
    let serve = |name: &str| {
        KillOnDrop(
            watchpump_cli(Some(&db.url))
                .arg("serve")
                .env("WATCHPUMP_LISTEN", "127.0.0.1:0")
                .env("WATCHPUMP_METRICS_LISTEN", "off")
                .env("WATCHPUMP_PRODUCER", PRODUCER)
                .env("WATCHPUMP_PRODUCER_TOKEN", PRODUCER_TOKEN)
                .env("WATCHPUMP_ALLOWED_DESTINATIONS", "127.0.0.0/8")
                .env("WATCHPUMP_REQUEST_TIMEOUT_MS", "4000")
                // Room beyond the request timeout for a claim of large
                // payloads to start sending (src/pump/fence.rs).
                .env("WATCHPUMP_LEASE_MS", "8000")
                .env("WATCHPUMP_MAX_IN_FLIGHT_BYTES", "1000000")
                .env("WATCHPUMP_PUMP_NAME", name)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let mut first = serve("doomed");
    consumer.wait_for_arrivals(16, WAIT).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The budget (1 MB) holds a change and the next one at most, whatever
    // the backlog: two 900 KB changes, or the old 1.5 MB one alone.
    let changes_on_the_wire: i64 = sqlx::query_scalar(
        "select count(distinct change_id) from watchpump.queue where lease_until > now()",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        (1..=2).contains(&changes_on_the_wire),
        "{changes_on_the_wire} changes on the wire"
    );
    first.0.kill().unwrap(); // SIGKILL: its leases stay until they run out
    first.0.wait().unwrap();
    consumer.release();

    let _second = serve("successor");
    until(WAIT, "the whole backlog delivered", || async {
        let n = db.count_state("delivered").await;
        check(n == 7 * 16, format!("{n} of {} delivered", 7 * 16))
    })
    .await;
}
