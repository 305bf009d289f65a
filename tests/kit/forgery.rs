//! Requests that are not the producer's deliveries for this consumer: each
//! is refused with 401, 403, 400, 404, 405 or 413 and a JSON error, the
//! handler never runs, and the consumer's database is exactly as before.
//! A genuine delivery through the real pump then still goes through, so
//! each refusal is for its own reason, not a broken setup.

use std::sync::atomic::Ordering;
use std::time::Duration;

use watchpump::kit::WatchRequest;
use watchpump::signing::SigningSecret;

use crate::common::{operator_config, pump_config, AppServer, RunningPump, TestDb};
use crate::support::{delivery, now, post, signed, Consumer, Work, WORK_SCHEMA};

const MAIN: &str = "acme/web/refs/heads/main";

type Headers = Vec<(String, String)>;

fn without(headers: &Headers, name: &str) -> Headers {
    headers.iter().filter(|(n, _)| n != name).cloned().collect()
}

fn replaced(headers: &Headers, name: &str, value: &str) -> Headers {
    let mut out = without(headers, name);
    out.push((name.into(), value.into()));
    out
}

#[tokio::test]
async fn forged_and_malformed_requests_are_refused_and_change_nothing() {
    let producer = TestDb::new().await;
    let api = AppServer::start(&producer.pool, &operator_config()).await;
    let work = Work::default();
    let us = Consumer::start(&producer, &api, "deploy", WORK_SCHEMA, work.clone()).await;
    let ours = us.watch(WatchRequest::new("app-1", MAIN)).await;
    let them = Consumer::start(&producer, &api, "preview", WORK_SCHEMA, Work::default()).await;
    let theirs = them.watch(WatchRequest::new("app-2", MAIN)).await;
    let before = us.db.footprint().await;
    assert_eq!(before, (0, 0, 1, 0));

    let body = serde_json::to_vec(&delivery(10, ours, MAIN, 1)).unwrap();
    let good = signed(10, now(), &body, &us.secret);
    let url = us.events_url();
    let other_secret = SigningSecret::generate();

    let mut cases: Vec<(&str, String, Headers, Vec<u8>, u16)> = vec![
        (
            "signed with another secret",
            url.clone(),
            signed(10, now(), &body, &other_secret),
            body.clone(),
            401,
        ),
        (
            "signed with the other consumer's secret",
            url.clone(),
            signed(10, now(), &body, &them.secret),
            body.clone(),
            401,
        ),
        (
            "a stale timestamp",
            url.clone(),
            signed(10, now() - 600, &body, &us.secret),
            body.clone(),
            401,
        ),
        (
            "a timestamp from the future",
            url.clone(),
            signed(10, now() + 600, &body, &us.secret),
            body.clone(),
            401,
        ),
        (
            "a body changed after signing",
            url.clone(),
            good.clone(),
            body.iter()
                .map(|b| if *b == b'1' { b'2' } else { *b })
                .collect(),
            401,
        ),
        (
            "a wrong bearer token",
            url.clone(),
            replaced(&good, "authorization", "Bearer not-the-producers-token"),
            body.clone(),
            401,
        ),
        (
            "the consumer's own service token instead of the producer's",
            url.clone(),
            replaced(&good, "authorization", &format!("Bearer {}", us.token)),
            body.clone(),
            401,
        ),
        (
            "no authorization",
            url.clone(),
            without(&good, "authorization"),
            body.clone(),
            401,
        ),
        (
            "no signature",
            url.clone(),
            without(&good, "webhook-signature"),
            body.clone(),
            401,
        ),
        (
            "no timestamp",
            url.clone(),
            without(&good, "webhook-timestamp"),
            body.clone(),
            401,
        ),
        (
            "no id",
            url.clone(),
            without(&good, "webhook-id"),
            body.clone(),
            401,
        ),
        (
            "garbage, unsigned",
            url.clone(),
            good.clone(),
            b"\x00\xffnot json".to_vec(),
            401,
        ),
        (
            "an unknown producer",
            url.replace("/git/", "/gitlab/"),
            good.clone(),
            body.clone(),
            404,
        ),
    ];
    // Signed correctly, so from the producer, but not acceptable.
    let garbage = b"{\"delivery_id\": 11, not json".to_vec();
    cases.push((
        "garbage, signed",
        url.clone(),
        signed(11, now(), &garbage, &us.secret),
        garbage,
        400,
    ));
    let mismatched = serde_json::to_vec(&delivery(12, ours, MAIN, 1)).unwrap();
    cases.push((
        "a body for another id than the signed one",
        url.clone(),
        signed(13, now(), &mismatched, &us.secret),
        mismatched,
        400,
    ));
    let mut wrong_producer = delivery(14, ours, MAIN, 1);
    wrong_producer.producer = "gitlab".into();
    let wrong_producer = serde_json::to_vec(&wrong_producer).unwrap();
    cases.push((
        "a body naming another producer",
        url.clone(),
        signed(14, now(), &wrong_producer, &us.secret),
        wrong_producer,
        400,
    ));
    let theirs_body = serde_json::to_vec(&delivery(15, theirs, MAIN, 1)).unwrap();
    cases.push((
        "validly signed, for the other consumer's watch",
        url.clone(),
        signed(15, now(), &theirs_body, &us.secret),
        theirs_body,
        403,
    ));
    let unknown = serde_json::to_vec(&delivery(16, 999_999, MAIN, 1)).unwrap();
    cases.push((
        "validly signed, for a watch that does not exist",
        url.clone(),
        signed(16, now(), &unknown, &us.secret),
        unknown,
        403,
    ));
    let huge = vec![b' '; 65 * 1024];
    cases.push((
        "a body over the limit",
        url.clone(),
        signed(17, now(), &huge, &us.secret),
        huge,
        413,
    ));

    for (what, url, headers, body, expected) in cases {
        let (status, answer) = post(&url, &headers, body).await;
        assert_eq!(status, expected, "{what}: {answer}");
        assert!(
            answer["error"]["code"].is_string(),
            "{what}: a JSON error, got {answer}"
        );
        assert!(answer["error"]["message"].is_string(), "{what}: {answer}");
    }
    let get = reqwest::get(&url).await.unwrap();
    assert_eq!(get.status().as_u16(), 405);

    assert_eq!(
        work.calls.load(Ordering::SeqCst),
        0,
        "the handler never ran"
    );
    assert_eq!(us.db.footprint().await, before, "nothing changed");

    // The same consumer takes a genuine delivery from the real pump.
    let pump = RunningPump::start(&producer.pool, pump_config());
    let change = producer
        .emit(MAIN, "push", serde_json::json!({"after": "1"}))
        .await;
    let deliveries: Vec<i64> = sqlx::query_scalar(
        "select delivery_id from watchpump.delivery_log where change_id = $1 and service = 'deploy'",
    )
    .bind(change)
    .fetch_all(&producer.pool)
    .await
    .unwrap();
    let id = deliveries[0];
    producer
        .wait_state(id, "delivered", Duration::from_secs(30))
        .await;
    assert_eq!(work.calls.load(Ordering::SeqCst), 1);
    assert_eq!(us.db.footprint().await, (1, 1, 1, 1));
    pump.stop().await.unwrap();
}
