//! Nothing lost when things go wrong: a pump killed mid-send, two pumps on
//! one database, a lost listener connection, a consumer that was down, a
//! consumer that hangs, and a graceful stop with sends in flight.

mod common;

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

async fn in_flight(db: &TestDb) -> i64 {
    db.count_state("in_flight").await
}

#[tokio::test]
async fn a_pump_killed_mid_send_has_its_deliveries_sent_by_another_after_the_lease() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    consumer.delay_replies(Duration::from_secs(60)); // hold every request
    let (deploy, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(deploy.id, "app", "acme/web/", all()).await;
    for n in 0..10 {
        db.emit(
            &format!("acme/web/refs/heads/b{n}"),
            "push",
            json!({"n": n}),
        )
        .await;
    }
    let mut child = KillOnDrop(
        watchpump_cli(Some(&db.url))
            .arg("serve")
            .env("WATCHPUMP_LISTEN", "127.0.0.1:0")
            .env("WATCHPUMP_METRICS_LISTEN", "off")
            .env("WATCHPUMP_PRODUCER", PRODUCER)
            .env("WATCHPUMP_PRODUCER_TOKEN", PRODUCER_TOKEN)
            .env("WATCHPUMP_REQUEST_TIMEOUT_MS", "8000")
            .env("WATCHPUMP_LEASE_MS", "9000")
            .env("WATCHPUMP_PUMP_NAME", "doomed")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    eventually(WAIT, "the first pump holds all ten", || async {
        in_flight(&db).await == 10
    })
    .await;
    child.0.kill().unwrap(); // SIGKILL: no chance to report or release
    child.0.wait().unwrap();
    let leased_by: Vec<Option<String>> =
        sqlx::query_scalar("select distinct leased_by from watchpump.deliveries")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(leased_by, vec![Some("doomed".to_string())]);

    consumer.delay_replies(Duration::ZERO);
    let pump = RunningPump::start(&db.pool, pump_config());
    eventually(WAIT, "all ten delivered by the second pump", || async {
        db.count_state("delivered").await == 10
    })
    .await;
    pump.stop().await.unwrap();

    // The killed pump never reported its attempts; the second pump's are
    // attempt 2, recorded under its own name.
    let attempts: Vec<(i32, String, Option<i32>)> =
        sqlx::query_as("select attempt, pump, status from watchpump.attempts order by delivery_id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(attempts.len(), 10);
    assert!(
        attempts
            .iter()
            .all(|(a, p, s)| *a == 2 && p != "doomed" && *s == Some(200)),
        "{attempts:?}"
    );
}

#[tokio::test]
async fn two_pumps_under_load_deliver_everything_and_never_the_same_delivery_twice() {
    let db = TestDb::new().await;
    let mut consumers = Vec::new();
    for name in ["deploy", "previews", "docs", "search"] {
        let consumer = Receiver::start().await;
        let (service, _) = db.add_service(name, &consumer.base_url()).await;
        db.add_watch(service.id, "r", "acme/", all()).await;
        consumers.push(consumer);
    }
    let a = RunningPump::start(&db.pool, pump_config());
    let b = RunningPump::start(&db.pool, pump_config());
    let mut emitters = Vec::new();
    for e in 0..4 {
        let pool = db.pool.clone();
        emitters.push(tokio::spawn(async move {
            for n in 0..125 {
                let mut tx = pool.begin().await.unwrap();
                // Distinct objects: nothing is superseded, all 2000 must arrive.
                watchpump::emit(
                    &mut tx,
                    &format!("acme/repo{e}/refs/heads/b{n}"),
                    "push",
                    &json!({"n": n}),
                )
                .await
                .unwrap();
                tx.commit().await.unwrap();
            }
        }));
    }
    for e in emitters {
        e.await.unwrap();
    }
    eventually(Duration::from_secs(60), "2000 delivered", || async {
        db.count_state("delivered").await == 2000
    })
    .await;
    a.stop().await.unwrap();
    b.stop().await.unwrap();

    let mut seen: HashMap<i64, usize> = HashMap::new();
    for consumer in &consumers {
        for r in consumer.received() {
            *seen
                .entry(r.body["delivery_id"].as_i64().unwrap())
                .or_default() += 1;
        }
    }
    assert_eq!(seen.len(), 2000);
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "sent more than once: {twice:?}");
    let per_pump: Vec<(String, i64)> =
        sqlx::query_as("select pump, count(*) from watchpump.attempts group by pump order by pump")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        per_pump.iter().map(|(_, n)| n).sum::<i64>(),
        2000,
        "one attempt each: {per_pump:?}"
    );
}

#[tokio::test]
async fn the_pump_reconnects_its_listener_and_still_delivers_on_notify() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (deploy, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(deploy.id, "app", "acme/web/", all()).await;
    let mut cfg = pump_config();
    cfg.sweep_interval_ms = 3_600_000; // no sweep to fall back on: only NOTIFY and reconnects wake it
    let pump = RunningPump::start(&db.pool, cfg);
    let listeners = || async {
        sqlx::query_scalar::<_, i32>(
            "select pid from pg_stat_activity where datname = current_database() and query ilike 'listen%'",
        )
        .fetch_all(&db.pool)
        .await
        .unwrap()
    };
    eventually(WAIT, "the listener is up", || async {
        listeners().await.len() == 1
    })
    .await;
    db.emit("acme/web/refs/heads/main", "push", json!({"n": 1}))
        .await;
    consumer.wait_for(1, WAIT).await;

    let old = listeners().await;
    let killed: bool = sqlx::query_scalar("select pg_terminate_backend($1)")
        .bind(old[0])
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(killed);
    // A change committed while the listener is gone is picked up by the sweep
    // that follows the reconnect; one committed after, by NOTIFY.
    db.emit("acme/web/refs/heads/main", "push", json!({"n": 2}))
        .await;
    eventually(WAIT, "a new listener", || async {
        let now = listeners().await;
        now.len() == 1 && now != old
    })
    .await;
    consumer.wait_for(2, WAIT).await;
    db.emit("acme/web/refs/heads/main", "push", json!({"n": 3}))
        .await;
    let got = consumer.wait_for(3, WAIT).await;
    let ns: Vec<i64> = got
        .iter()
        .map(|r| r.body["payload"]["n"].as_i64().unwrap())
        .collect();
    assert_eq!(ns, vec![1, 2, 3]);
    pump.stop().await.unwrap();
}

#[tokio::test]
async fn a_consumer_that_comes_back_gets_its_backlog_at_once_not_after_each_back_off() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let addr = consumer.addr;
    consumer.stop();
    let (deploy, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(deploy.id, "app", "acme/web/", all()).await;
    let mut cfg = pump_config();
    cfg.retry_initial_ms = 600_000; // each delivery's own retry lies 10 minutes ahead
    cfg.retry_max_ms = 600_000;
    cfg.down_after_failures = 2;
    cfg.probe_interval_ms = 200;
    let pump = RunningPump::start(&db.pool, cfg);
    for n in 0..20 {
        db.emit(
            &format!("acme/web/refs/heads/b{n}"),
            "push",
            json!({"n": n}),
        )
        .await;
    }
    eventually(
        WAIT,
        "every delivery failed once and waits minutes",
        || async {
            let n: i64 = sqlx::query_scalar(
            "select count(*) from watchpump.deliveries where state = 'pending' and attempts >= 1
             and next_attempt_at > now() + interval '5 minutes'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
            n == 20
        },
    )
    .await;
    // Probing stays gentle: one request at a time, with pauses.
    let back = Receiver::start_on(addr).await;
    back.wait_for(20, WAIT).await;
    eventually(WAIT, "all delivered", || async {
        db.count_state("delivered").await == 20
    })
    .await;
    pump.stop().await.unwrap();
}

#[tokio::test]
async fn a_hanging_consumer_does_not_hold_up_the_others() {
    let db = TestDb::new().await;
    let slow = Receiver::start().await;
    slow.delay_replies(Duration::from_secs(4));
    let fast = Receiver::start().await;
    let (slow_service, _) = db.add_service("slow", &slow.base_url()).await;
    let (fast_service, _) = db.add_service("fast", &fast.base_url()).await;
    db.add_watch(slow_service.id, "r", "acme/", all()).await;
    db.add_watch(fast_service.id, "r", "acme/", all()).await;
    let mut cfg = pump_config();
    cfg.service_concurrency = 2;
    cfg.request_timeout_ms = 10_000;
    cfg.lease_ms = 20_000;
    let pump = RunningPump::start(&db.pool, cfg);
    for n in 0..20 {
        db.emit(&format!("acme/web/refs/heads/b{n}"), "push", json!({}))
            .await;
    }
    fast.wait_for(20, WAIT).await;
    let (slow_in_flight, slow_done): (i64, i64) = sqlx::query_as(
        "select count(*) filter (where state = 'in_flight'), count(*) filter (where state = 'delivered')
         from watchpump.deliveries where service_id = $1",
    )
    .bind(slow_service.id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        slow.arrivals() <= 2,
        "the slow consumer's cap on the wire: {}",
        slow.arrivals()
    );
    assert!(
        slow_in_flight <= 4,
        "its cap and one window claimed ahead: {slow_in_flight}"
    );
    assert!(
        slow_done < 20,
        "the fast consumer did not wait for the slow one"
    );
    pump.stop().await.unwrap();
}

#[tokio::test]
async fn a_graceful_stop_finishes_the_sends_in_flight() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    consumer.delay_replies(Duration::from_millis(700));
    let (deploy, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(deploy.id, "app", "acme/web/", all()).await;
    let pump = RunningPump::start(&db.pool, pump_config());
    db.emit("acme/web/refs/heads/main", "push", json!({})).await;
    eventually(WAIT, "in flight", || async { in_flight(&db).await == 1 }).await;
    pump.stop().await.unwrap();
    assert_eq!(
        db.count_state("delivered").await,
        1,
        "the send finished and was recorded"
    );
    let sleepers: i64 = sqlx::query_scalar("select count(*) from watchpump.sleepers")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(sleepers, 0, "a stopped pump asks for no more notifications");
}
