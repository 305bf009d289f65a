//! What docs/protocol.md promises a consumer team beyond the body and the
//! headers (tests/delivery.rs has those), against the real pump: payloads
//! are re-serialised, and a redirect is an answer like any other failure,
//! never followed.

mod common;

use std::time::Duration;

use common::*;

const WAIT: Duration = Duration::from_secs(15);

/// docs/protocol.md, "Payloads are re-serialised".
#[tokio::test]
async fn payloads_arrive_re_serialised_keys_reordered_and_numbers_normalised() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (service, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(service.id, "app", "acme/", all()).await;
    let pump = RunningPump::start(&db.pool, pump_config());

    // As a producer in another language would: the payload as JSON text.
    sqlx::query("select watchpump.emit('acme/web', 'push', $1::text::jsonb)")
        .bind(r#"{"zeta": 1.50, "alpha": {"b": 2, "a": 1}, "big": 1e2, "same": 1, "same": 2}"#)
        .execute(&db.pool)
        .await
        .unwrap();
    let got = consumer.wait_for(1, WAIT).await;
    let raw = String::from_utf8(got[0].raw.clone()).unwrap();
    let payload = raw
        .split_once(r#""payload":"#)
        .map(|(_, p)| p.strip_suffix('}').unwrap())
        .unwrap_or_else(|| panic!("no payload in {raw}"));
    let compact: String = payload.chars().filter(|c| !c.is_whitespace()).collect();
    assert_eq!(
        compact, r#"{"big":100,"same":2,"zeta":1.50,"alpha":{"a":1,"b":2}}"#,
        "keys in jsonb's order (shorter first), the last duplicate kept, 1e2 written 100"
    );

    // Through the CLI (or the Rust emit()), a number is parsed first: 1.50
    // arrives as 1.5.
    let out = watchpump_cli(Some(&db.url))
        .args(["emit", "acme/web", "push", r#"{"price": 1.50}"#])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = consumer.wait_for(2, WAIT).await;
    assert_eq!(got[1].body["payload"]["price"].to_string(), "1.5");
    assert!(String::from_utf8_lossy(&got[1].raw).contains("1.5}"));
    pump.stop().await.unwrap();
}

/// docs/protocol.md, "Answer": 3xx is not followed.
#[tokio::test]
async fn a_redirect_is_not_followed_and_the_delivery_is_retried() {
    let db = TestDb::new().await;
    let moved = Receiver::start().await;
    let elsewhere = Receiver::start().await;
    moved.reply_with(307);
    moved.reply_header(
        "location",
        &format!("{}/api/v1/git/events", elsewhere.base_url()),
    );
    let (service, _) = db.add_service("deploy", &moved.base_url()).await;
    db.add_watch(service.id, "app", "acme/", all()).await;
    let pump = RunningPump::start(&db.pool, pump_config());

    let change = db.emit("acme/web", "push", serde_json::json!({})).await;
    moved.wait_for(2, WAIT).await;
    pump.stop().await.unwrap();
    assert_eq!(elsewhere.count(), 0, "the Location was not followed");
    let delivery = delivery_of(&db, change).await;
    let statuses: Vec<Option<i32>> =
        sqlx::query_scalar("select status from watchpump.attempts where delivery_id = $1")
            .bind(delivery)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert!(
        !statuses.is_empty() && statuses.iter().all(|s| *s == Some(307)),
        "{statuses:?}"
    );
    assert_ne!(db.delivery_state(delivery).await, "delivered");
}
