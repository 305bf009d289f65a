//! A second producer embeds watchpump (ADR 0021: the machinery moves "to
//! kit when a second producer needs it"): the tracker of
//! `examples/tracker/mod.rs` runs in this process on a database of its own,
//! mounts the watches API and the panel in its own app, and its own
//! transactions' changes reach a real consumer, signed, under its own
//! producer name; its pump stops with its own shutdown.

mod common;

#[path = "../examples/tracker/mod.rs"]
mod tracker;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_second_producer_embeds_the_api_the_panel_and_the_pump() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let ops = watchpump::services::add_within(
        &db.pool,
        "ops",
        &consumer.base_url(),
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap();
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let cfg = tracker::Config {
        database_url: db.url.clone(),
        listen: "127.0.0.1:0".parse().unwrap(),
        producer_token: "tracker-token".into(),
        admin_token: Some(ADMIN_TOKEN.into()),
    };
    let running = tracker::run(
        cfg,
        move |addr| {
            let _ = bound_tx.send(addr);
        },
        async move {
            let _ = stop_rx.await;
        },
    );
    let (ran, ()) = tokio::join!(
        running,
        follow_the_tracker(&ops, &consumer, bound_rx, stop_tx)
    );
    ran.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(consumer.count(), 1, "the closing did not match the watch");
}

/// What a consumer and the tracker's users do while it runs; stops it.
async fn follow_the_tracker(
    ops: &watchpump::services::Registered,
    consumer: &Receiver,
    bound: tokio::sync::oneshot::Receiver<std::net::SocketAddr>,
    stop: tokio::sync::oneshot::Sender<()>,
) {
    let addr = bound.await.unwrap();
    let http = reqwest::Client::new();
    let url = |path: &str| format!("http://{addr}{path}");

    // The consumer follows the project's issues through the tracker's own
    // mount of the watches API.
    let r = http
        .post(url("/api/v1/watches"))
        .bearer_auth(&ops.token)
        .json(
            &json!({"resource": "oncall", "object": "tracker/acme/issues/",
                      "filters": {"kinds": ["opened"]}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);

    let r = http
        .post(url("/issues/acme"))
        .json(&json!({"title": "flaky deploy"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let opened: Value = r.json().await.unwrap();
    assert_eq!(opened["object"], "tracker/acme/issues/1");
    // Closing is recorded too, but the watch follows openings only.
    let r = http.post(url("/issues/acme/1/close")).send().await.unwrap();
    assert_eq!(r.status(), 204);

    let got = consumer.wait_for(1, WAIT).await;
    let d = &got[0];
    assert_eq!(d.path, "/api/v1/tracker/events");
    assert_eq!(d.body["producer"], "tracker");
    assert_eq!(d.body["object"], "tracker/acme/issues/1");
    assert_eq!(d.body["payload"]["title"], "flaky deploy");
    assert_eq!(d.headers["authorization"], "Bearer tracker-token");
    let secret = watchpump::signing::SigningSecret::parse(&ops.signing_secret).unwrap();
    assert!(watchpump::signing::verify(
        &[&secret],
        d.headers["webhook-id"].to_str().unwrap(),
        d.headers["webhook-timestamp"].to_str().unwrap(),
        d.headers["webhook-signature"].to_str().unwrap(),
        &d.raw,
        chrono::Utc::now().timestamp(),
        watchpump::signing::DEFAULT_TOLERANCE_SECS,
    )
    .is_ok());

    // The panel is mounted too.
    let panel = http.get(url("/panel/login")).send().await.unwrap();
    assert_eq!(panel.status(), 200);

    stop.send(()).unwrap();
}
