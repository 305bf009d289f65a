//! Fencing (src/pump/fence.rs, the top of sql/functions/0500_delivery.sql),
//! against `watchpump serve` processes, the test cluster and a consumer on
//! loopback:
//!
//! - a pump whose claim came back too late to send within its lease does
//!   not send it (the database was slow: here a row lock holds the claim's
//!   transaction open past the lease): it gives it back, and the request
//!   that reaches the consumer is under a lease of its own claim;
//! - after a request the pump gave up on, nothing more of its (watch,
//!   object) is sent for the hold, neither its retry nor newer news;
//! - a request whose connection broke after it arrived, long before its
//!   timeout, holds its stream as if it had run the whole timeout, and the
//!   hold after (the partition fault of `make chaos` found the gap: a
//!   consumer's answer cut off by the network).

mod common;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use common::*;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);
const OBJECT: &str = "acme/web/refs/heads/main";

/// One request as the consumer saw it arrive.
#[derive(Debug, Clone)]
struct Arrival {
    delivery_id: i64,
    attempt: i64,
    at: Instant,
    /// What was left of the delivery's lease when it arrived, when the
    /// recorder reads it ([`Recorder::leases`]).
    lease_left_ms: Option<f64>,
}

/// A consumer that records arrivals and keeps the first `hang` requests
/// waiting for `hang_for` before it answers 200 (the others at once).
#[derive(Clone, Default)]
struct Recorder {
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    hang: Arc<Mutex<(usize, Duration)>>,
    /// Where to read each arriving delivery's lease from, if anywhere.
    leases: Option<sqlx::PgPool>,
}

impl Recorder {
    async fn serve(&self) -> Served {
        let app = Router::new()
            .route("/{*path}", post(arrive))
            .with_state(self.clone());
        Served::on_loopback(app).await
    }

    fn arrivals(&self) -> Vec<Arrival> {
        self.arrivals.lock().unwrap().clone()
    }
}

async fn arrive(State(r): State<Recorder>, body: Bytes) -> StatusCode {
    let at = Instant::now();
    let d: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let delivery_id = d["delivery_id"].as_i64().unwrap_or(-1);
    let lease_left_ms = match &r.leases {
        Some(pool) => sqlx::query_scalar(
            "select (extract(epoch from lease_until - clock_timestamp()) * 1000)::float8
             from watchpump.queue where id = $1",
        )
        .bind(delivery_id)
        .fetch_optional(pool)
        .await
        .unwrap()
        .flatten(),
        None => None,
    };
    r.arrivals.lock().unwrap().push(Arrival {
        delivery_id,
        attempt: d["attempt"].as_i64().unwrap_or(-1),
        at,
        lease_left_ms,
    });
    let wait = {
        let mut hang = r.hang.lock().unwrap();
        if hang.0 > 0 {
            hang.0 -= 1;
            Some(hang.1)
        } else {
            None
        }
    };
    if let Some(wait) = wait {
        tokio::time::sleep(wait).await;
    }
    StatusCode::OK
}

/// `watchpump serve` named `name`, with `env` on top of quick settings.
fn pump(db: &TestDb, name: &str, env: &[(&str, &str)]) -> KillOnDrop {
    let mut cmd = watchpump_cli(Some(&db.url));
    cmd.arg("serve")
        .env("WATCHPUMP_LISTEN", "127.0.0.1:0")
        .env("WATCHPUMP_METRICS_LISTEN", "off")
        .env("WATCHPUMP_PRODUCER", PRODUCER)
        .env("WATCHPUMP_PRODUCER_TOKEN", PRODUCER_TOKEN)
        .env("WATCHPUMP_PUMP_NAME", name)
        .env("WATCHPUMP_RETRY_INITIAL_MS", "50")
        .env("WATCHPUMP_RETRY_MAX_MS", "100")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    KillOnDrop(cmd.spawn().unwrap())
}

#[tokio::test]
async fn a_claim_that_comes_back_after_its_lease_ran_short_is_not_sent() {
    let db = TestDb::new().await;
    let consumer = Recorder {
        leases: Some(db.pool.clone()),
        ..Recorder::default()
    };
    let served = consumer.serve().await;
    let (svc, _) = db.add_service("deploy", &served.base_url()).await;
    db.add_watch(svc.id, "app", OBJECT, all()).await;
    // Lease 4 s, request 500 ms, hold 500 ms: a claim may wait 3 s before
    // its sends start (room for a loaded machine's claims). Sweeps only at start, so that the claim is the
    // first statement to touch this pump's sleeper row.
    let _pump = pump(
        &db,
        "slow-db",
        &[
            ("WATCHPUMP_LEASE_MS", "4000"),
            ("WATCHPUMP_REQUEST_TIMEOUT_MS", "500"),
            ("WATCHPUMP_HOLD_AFTER_NO_ANSWER_MS", "500"),
            ("WATCHPUMP_SWEEP_INTERVAL_MS", "3600000"),
        ],
    );
    eventually(WAIT, "the pump sleeps, waiting for NOTIFY", || async {
        sqlx::query_scalar::<_, i64>(
            "select count(*) from watchpump.sleepers where pump = 'slow-db'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap()
            == 1
    })
    .await;

    // The claim ends by deleting the pump's sleeper row: holding that row
    // holds the claim's transaction, leases already written, for 3.5 s.
    let mut blocker = db.pool.begin().await.unwrap();
    sqlx::query("select 1 from watchpump.sleepers where pump = 'slow-db' for update")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let change = db.emit(OBJECT, "push", json!({"n": 1})).await;
    let id = delivery_of(&db, change).await;
    eventually(WAIT, "the pump's claim waits for the row", || async {
        sqlx::query_scalar::<_, i64>(
            "select count(*) from pg_stat_activity
             where application_name = 'watchpump-pump' and wait_event_type = 'Lock'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap()
            == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    blocker.rollback().await.unwrap();

    // The claim came back 3.5 s after it was asked for, later than the 3 s
    // its lease left for starting a send: not sent, but given back
    // (watchpump.release(), which NOTIFYs), claimed again under a lease
    // of its own, and sent as attempt 1, the first made.
    db.wait_state(id, "delivered", WAIT).await;
    let arrivals = consumer.arrivals();
    assert_eq!(arrivals.len(), 1, "{arrivals:?}");
    assert_eq!((arrivals[0].delivery_id, arrivals[0].attempt), (id, 1));
    // The late claim's lease had 0.5 s left when it came back; sent under
    // it, the request would have arrived with less than its timeout and
    // hold (1 s) of lease left. It arrived under the new claim's 4 s.
    let left = arrivals[0]
        .lease_left_ms
        .expect("the lease was read at arrival");
    assert!(
        left >= 1000.0,
        "the request arrived with {left:.0} ms of lease left: sent under the late claim"
    );
}

#[tokio::test]
async fn after_a_request_with_no_answer_nothing_of_its_stream_goes_for_the_hold() {
    let db = TestDb::new().await;
    let consumer = Recorder::default();
    // The first request takes 1.2 s to answer; the pump gives up after
    // 400 ms and must then wait its hold (1 s) before sending the retry or
    // the newer news of the same (watch, object).
    *consumer.hang.lock().unwrap() = (1, Duration::from_millis(1200));
    let served = consumer.serve().await;
    let (svc, _) = db.add_service("deploy", &served.base_url()).await;
    db.add_watch(svc.id, "app", OBJECT, all()).await;
    let _pump = pump(
        &db,
        "holding",
        &[
            ("WATCHPUMP_LEASE_MS", "5000"),
            ("WATCHPUMP_REQUEST_TIMEOUT_MS", "400"),
            ("WATCHPUMP_HOLD_AFTER_NO_ANSWER_MS", "1000"),
            ("WATCHPUMP_SWEEP_INTERVAL_MS", "100"),
        ],
    );
    let first = delivery_of(&db, db.emit(OBJECT, "push", json!({"n": 1})).await).await;
    eventually(WAIT, "the first request arrives", || async {
        !consumer.arrivals().is_empty()
    })
    .await;
    let newer = delivery_of(&db, db.emit(OBJECT, "push", json!({"n": 2})).await).await;
    db.wait_state(newer, "delivered", WAIT).await;

    let arrivals = consumer.arrivals();
    assert_eq!(arrivals[0].delivery_id, first, "{arrivals:?}");
    let gap = arrivals[1].at - arrivals[0].at;
    // The pump gave up 400 ms after it sent (a hair before the consumer
    // saw it arrive) and held the stream 1 s from when it recorded that.
    assert!(
        gap >= Duration::from_millis(1350),
        "the next request of the stream came {gap:?} after the one given up on: {arrivals:?}"
    );
    assert_eq!(
        db.delivery_state(first).await,
        "superseded",
        "the older news gives way to the newer after the hold"
    );
}

/// A consumer on a raw socket that reads each request whole, then answers
/// 200, except the first, whose connection it closes unanswered at once: to
/// the pump, a connection broken long before its request timeout, after
/// the request arrived (the network cut the answer off). Returns the
/// address and the arrivals' times.
async fn breaks_the_first_connection() -> (std::net::SocketAddr, Arc<Mutex<Vec<Instant>>>) {
    let listener = loopback().await;
    let addr = listener.local_addr().unwrap();
    let arrivals: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = arrivals.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(answer_or_break(socket, seen.clone()));
        }
    });
    (addr, arrivals)
}

/// Reads requests off one connection, noting each arrival; closes it at
/// the first request of all, answers 200 to the others.
async fn answer_or_break(mut socket: tokio::net::TcpStream, seen: Arc<Mutex<Vec<Instant>>>) {
    use tokio::io::AsyncWriteExt;
    let mut buf = Vec::new();
    while read_request(&mut socket, &mut buf).await {
        let first = {
            let mut seen = seen.lock().unwrap();
            seen.push(Instant::now());
            seen.len() == 1
        };
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        if first || socket.write_all(ok).await.is_err() {
            return; // dropped unanswered: the connection closes
        }
    }
}

/// Reads one whole request (its head, then content-length bytes) into
/// `buf` and takes it out; false once the connection ends.
async fn read_request(socket: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> bool {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 8192];
    loop {
        let size = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|end| {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            end + 4 + length
        });
        if let Some(size) = size.filter(|&size| buf.len() >= size) {
            buf.drain(..size);
            return true;
        }
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

#[tokio::test]
async fn a_connection_broken_before_the_timeout_holds_the_stream_for_the_timeout_and_the_hold() {
    let db = TestDb::new().await;
    let (addr, arrivals) = breaks_the_first_connection().await;
    let (svc, _) = db.add_service("deploy", &format!("http://{addr}")).await;
    db.add_watch(svc.id, "app", OBJECT, all()).await;
    // Request timeout 1.5 s, hold 300 ms: the consumer had the first
    // request, the pump lost its connection a few milliseconds later. The
    // consumer may work on it for the rest of the 1.5 s, and the hold after:
    // nothing more of the stream may arrive sooner than 1.8 s after it.
    let _pump = pump(
        &db,
        "broken",
        &[
            ("WATCHPUMP_LEASE_MS", "5000"),
            ("WATCHPUMP_REQUEST_TIMEOUT_MS", "1500"),
            ("WATCHPUMP_HOLD_AFTER_NO_ANSWER_MS", "300"),
            ("WATCHPUMP_SWEEP_INTERVAL_MS", "100"),
        ],
    );
    let first = delivery_of(&db, db.emit(OBJECT, "push", json!({"n": 1})).await).await;
    eventually(WAIT, "the first request arrives", || async {
        !arrivals.lock().unwrap().is_empty()
    })
    .await;
    let newer = delivery_of(&db, db.emit(OBJECT, "push", json!({"n": 2})).await).await;
    db.wait_state(newer, "delivered", WAIT).await;

    let attempts: Vec<(Option<i32>, Option<String>, f64)> = sqlx::query_as(
        "select status, error, duration_ms from watchpump.attempts where delivery_id = $1",
    )
    .bind(first)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        attempts.iter().all(|(status, error, ms)| status.is_none()
            && error
                .as_deref()
                .is_some_and(|e| !e.starts_with("not sent: "))
            && *ms < 1000.0),
        "the first request's connection broke, sent, well before its timeout: {attempts:?}"
    );
    let arrivals = arrivals.lock().unwrap().clone();
    let gap = arrivals[1] - arrivals[0];
    assert!(
        gap >= Duration::from_millis(1700),
        "the next request of the stream came {gap:?} after the one whose connection broke"
    );
}
