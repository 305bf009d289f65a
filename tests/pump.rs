//! The pump driven one step at a time ([`Pump::step`]): each test stages
//! the queue, takes a turn of the pump, and reads what the turn did, with
//! no live loop to poll and no timer to wait for.

mod common;

use common::*;
use serde_json::json;
use watchpump::delivery::State;
use watchpump::pump::Pump;

const OBJECT: &str = "acme/web/refs/heads/main";

/// A pump that is never run, only stepped; its retries are far enough
/// ahead that only `make_retries_due` brings them, however slow a step.
fn stepped_pump(db: &TestDb) -> Pump {
    let mut cfg = pump_config();
    cfg.retry_initial_ms = 60_000;
    cfg.retry_max_ms = 120_000;
    Pump::new(db.pool.clone(), cfg).expect("valid pump config")
}

/// Makes every queued delivery due now, as time passing would.
async fn make_retries_due(db: &TestDb) {
    sqlx::query("update watchpump.queue set next_attempt_at = now()")
        .execute(&db.pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_step_sends_what_is_due_and_records_the_answer_before_it_returns() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (service, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(service.id, "app", OBJECT, all()).await;
    let change = db.emit(OBJECT, "push", json!({"n": 1})).await;
    let id = delivery_of(&db, change).await;
    let pump = stepped_pump(&db);

    let step = pump.step().await.unwrap();

    assert_eq!(step.sent, 1);
    assert_eq!(step.settled, vec![(id, State::Delivered)]);
    assert_eq!(db.delivery_state(id).await, "delivered");
    assert_eq!(consumer.count(), 1);
    let idle = pump.step().await.unwrap();
    assert_eq!(idle.sent, 0, "nothing is left to send");
    assert_eq!(consumer.count(), 1);
}

#[tokio::test]
async fn a_failed_attempt_waits_for_its_retry_and_newer_news_supersedes_it() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (service, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(service.id, "app", OBJECT, all()).await;
    let pump = stepped_pump(&db);
    consumer.reply_with(500);
    let older_change = db.emit(OBJECT, "push", json!({"n": 1})).await;
    let older = delivery_of(&db, older_change).await;

    let failed = pump.step().await.unwrap();
    assert_eq!(
        failed.settled,
        vec![(older, State::Pending)],
        "a retry is scheduled"
    );
    assert_eq!(
        pump.step().await.unwrap().sent,
        0,
        "the retry is not due yet"
    );

    let newer_change = db.emit(OBJECT, "push", json!({"n": 2})).await;
    let newer = delivery_of(&db, newer_change).await;
    consumer.reply_with(200);
    make_retries_due(&db).await;
    let step = pump.step().await.unwrap();

    assert_eq!(step.settled, vec![(newer, State::Delivered)]);
    assert_eq!(db.delivery_state(older).await, "superseded");
    let changes: Vec<i64> = consumer
        .received()
        .iter()
        .map(|r| r.body["change_id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        changes,
        vec![older_change, newer_change],
        "the older change's failed attempt, then only the newer change"
    );
}

#[tokio::test]
async fn a_410_drops_the_watch_and_every_other_delivery_it_had_queued() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (service, _) = db.add_service("deploy", &consumer.base_url()).await;
    let watch = db.add_watch(service.id, "app", "acme/", all()).await;
    // One delivery on the wire per consumer: the second waits in the queue.
    let mut cfg = pump_config();
    cfg.service_concurrency = 1;
    let pump = Pump::new(db.pool.clone(), cfg).unwrap();
    consumer.reply_with(410);
    let first = delivery_of(&db, db.emit("acme/a", "push", json!({})).await).await;
    let second = delivery_of(&db, db.emit("acme/b", "push", json!({})).await).await;

    let step = pump.step().await.unwrap();

    assert_eq!(step.sent, 1);
    assert_eq!(
        step.settled,
        vec![(first, State::Dropped), (second, State::Dropped)],
        "the answered one, and the one its 410 dropped unsent"
    );
    let removed: bool =
        sqlx::query_scalar("select removed_at is not null from watchpump.watches where id = $1")
            .bind(watch.id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(removed, "the watch is removed");
    let third = db.emit("acme/c", "push", json!({})).await;
    assert_eq!(pump.step().await.unwrap().sent, 0);
    assert_eq!(consumer.count(), 1, "only the first delivery was sent");
    let queued: i64 =
        sqlx::query_scalar("select count(*) from watchpump.deliveries where change_id = $1")
            .bind(third)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(queued, 0, "a removed watch gets no new deliveries");
}

/// `WATCHPUMP_SOURCE_ADDRESS`: deliveries leave from the address it names
/// (one of this host's; all of 127/8 is on Linux's loopback), as the
/// consumer sees the connection's peer.
#[tokio::test]
async fn a_pump_with_a_source_address_sends_from_it() {
    use axum::extract::ConnectInfo;
    use std::net::{IpAddr, SocketAddr};
    use std::sync::{Arc, Mutex};

    let db = TestDb::new().await;
    let peers = Arc::new(Mutex::new(Vec::<SocketAddr>::new()));
    let seen = peers.clone();
    let app = axum::Router::new().route(
        "/{*path}",
        axum::routing::post(move |ConnectInfo(peer): ConnectInfo<SocketAddr>| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(peer);
                "recorded"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    let (service, _) = db.add_service("deploy", &format!("http://{addr}")).await;
    db.add_watch(service.id, "app", OBJECT, all()).await;
    let change = db.emit(OBJECT, "push", json!({"n": 1})).await;
    let id = delivery_of(&db, change).await;
    let source: IpAddr = "127.0.0.11".parse().unwrap();
    let mut cfg = pump_config();
    cfg.source_address = Some(source);
    let pump = Pump::new(db.pool.clone(), cfg).expect("valid pump config");

    let step = pump.step().await.unwrap();

    assert_eq!(step.settled, vec![(id, State::Delivered)]);
    let peers = peers.lock().unwrap().clone();
    assert_eq!(peers.len(), 1);
    assert_eq!(
        peers[0].ip(),
        source,
        "the consumer sees the source address"
    );
    server.abort();
}

/// `WATCHPUMP_SOURCE_ADDRESS` must be one of this host's addresses, checked
/// when the setting is read, with a message naming what is wrong.
#[test]
fn a_source_address_that_is_not_this_hosts_is_refused_at_start() {
    use clap::Parser;
    #[derive(Parser)]
    struct Only {
        #[command(flatten)]
        pump: watchpump::config::PumpConfig,
    }
    let parse = |value: &str| {
        Only::try_parse_from([
            "watchpump",
            "--producer",
            "git",
            "--producer-token",
            "t",
            "--source-address",
            value,
        ])
        .map(|o| o.pump.source_address)
        .map_err(|e| e.to_string())
    };
    assert_eq!(
        parse("127.0.0.12").unwrap(),
        Some("127.0.0.12".parse().unwrap())
    );
    for (value, says) in [
        ("not-an-address", "is not an IP address"),
        ("0.0.0.0", "unspecified or multicast"),
        ("224.0.0.1", "unspecified or multicast"),
        // TEST-NET-1 (RFC 5737): never this host's; only bound, never sent to.
        ("192.0.2.1", "is not an address of this host"),
    ] {
        let err = parse(value).expect_err(value);
        assert!(err.contains(says), "{value}: {err}");
    }
}
