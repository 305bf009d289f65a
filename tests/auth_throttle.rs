//! Failed authentications are throttled per client address (issue 9): the
//! watches API's service tokens, the admin API's token and the panel's
//! log-in. The API and panel are served as `watchpump serve` serves them,
//! through the edge (which gives handlers the client's address), and called
//! from two loopback addresses: 127.0.0.1 guesses, 127.0.0.2 is someone
//! else.
//!
//! The rule under test: 3 failures per address (a lowered limit), then 429
//! with `Retry-After` for every request through that door, the right token
//! included, until the window (10 minutes here, so it never ends during a
//! test) is over; another address is not affected; each failure is logged
//! with the client's address.

mod common;

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::*;
use reqwest::header::{ORIGIN, RETRY_AFTER, SET_COOKIE};
use reqwest::StatusCode;
use serde_json::Value;
use tokio::sync::oneshot;
use watchpump::edge::EdgeLimits;
use watchpump::http::App;
use watchpump::throttle::Throttle;

const FAILURES: u32 = 3;
const WINDOW: Duration = Duration::from_secs(600);
const ELSEWHERE: [u8; 4] = [127, 0, 0, 2];

/// The API, admin API and panel through the edge, with a throttle of
/// `FAILURES` per `WINDOW`.
struct Server {
    addr: SocketAddr,
    _stop: oneshot::Sender<()>,
}

impl Server {
    async fn start(db: &TestDb) -> Server {
        capture_logs();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let throttle = Arc::new(Throttle::new(FAILURES, WINDOW));
        let state = App::new(db.pool.clone(), &pump_config(), &operator_config(), addr)
            .with_throttle(throttle);
        let app = watchpump::api::app(state.clone()).merge(watchpump::operator::router(state));
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(watchpump::edge::serve(
            listener,
            app,
            EdgeLimits::default(),
            "api",
            async move {
                let _ = stopped.await;
            },
        ));
        Server { addr, _stop: stop }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

/// A client from 127.0.0.1 (`None`) or from `from`; redirects not followed.
fn client(from: Option<[u8; 4]>) -> reqwest::Client {
    let mut builder = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
    if let Some(ip) = from {
        builder = builder.local_address(IpAddr::from(ip));
    }
    builder.build().unwrap()
}

/// Every log line of this test process, captured once per process.
fn capture_logs() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<&'static Mutex<Vec<u8>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs: &'static Mutex<Vec<u8>> = Box::leak(Box::new(Mutex::new(Vec::new())));
        struct Sink(&'static Mutex<Vec<u8>>);
        impl Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let _ = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_env_filter("watchpump=warn")
            .with_writer(move || Sink(logs))
            .try_init();
        logs
    })
}

fn logged() -> String {
    String::from_utf8_lossy(&capture_logs().lock().unwrap()).into_owned()
}

/// Asserts a 429 with a `Retry-After` within the window; returns the body.
async fn assert_locked_out(resp: reqwest::Response) -> String {
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = resp.headers()[RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=WINDOW.as_secs()).contains(&wait), "Retry-After {wait}");
    resp.text().await.unwrap()
}

fn assert_json_code(body: &str, code: &str) {
    let v: Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["error"]["code"], code, "{body}");
}

#[tokio::test]
async fn wrong_service_tokens_are_throttled_per_address() {
    let db = TestDb::new().await;
    let (deploy, token) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let server = Server::start(&db).await;
    let watches = server.url("/api/v1/watches");
    let here = client(None);
    let elsewhere = client(Some(ELSEWHERE));
    let wrong = format!("wps_{}_{}", deploy.id, "0".repeat(64));

    // Requests without credentials are not guesses: they do not count.
    for _ in 0..2 * FAILURES {
        let resp = here.get(&watches).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    }
    for _ in 0..FAILURES {
        let resp = here.get(&watches).bearer_auth(&wrong).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    }
    let resp = here.get(&watches).bearer_auth(&wrong).send().await.unwrap();
    let body = assert_locked_out(resp).await;
    assert_json_code(&body, "too_many_failures");
    // Locked out: the right token is refused too, unchecked.
    let resp = here.get(&watches).bearer_auth(&token).send().await.unwrap();
    assert_locked_out(resp).await;

    // Another address is not affected, and has its own count.
    let resp = elsewhere
        .get(&watches)
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = elsewhere
        .get(&watches)
        .bearer_auth(&wrong)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);

    let logs = logged();
    let failures = logs
        .lines()
        .filter(|l| l.contains("wrong service token") && l.contains("client=127.0.0.1"))
        .count();
    assert_eq!(failures, FAILURES as usize, "{logs}");
    assert!(logs.contains("locked out"), "{logs}");
    assert!(
        !logs.contains(&token) && !logs.contains(&wrong),
        "tokens logged: {logs}"
    );
}

#[tokio::test]
async fn wrong_admin_tokens_are_throttled_per_address() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let backlog = server.url("/api/v1/admin/backlog");
    let here = client(None);
    let elsewhere = client(Some(ELSEWHERE));

    for n in 0..FAILURES {
        let resp = here
            .get(&backlog)
            .bearer_auth(format!("not-the-admin-token-{n}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    }
    let resp = here
        .get(&backlog)
        .bearer_auth("again")
        .send()
        .await
        .unwrap();
    assert_json_code(&assert_locked_out(resp).await, "too_many_failures");
    let resp = here
        .get(&backlog)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_locked_out(resp).await;
    // The panel's log-in guesses the same token: it is locked too.
    let resp = here
        .post(server.url("/panel/login"))
        .header(ORIGIN, format!("http://{}", server.addr))
        .form(&[("token", ADMIN_TOKEN)])
        .send()
        .await
        .unwrap();
    assert_locked_out(resp).await;

    let resp = elsewhere
        .get(&backlog)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);

    let logs = logged();
    assert!(
        logs.lines()
            .any(|l| l.contains("wrong admin token") && l.contains("client=127.0.0.1")),
        "{logs}"
    );
}

#[tokio::test]
async fn wrong_panel_logins_are_throttled_per_address() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let login = server.url("/panel/login");
    let origin = format!("http://{}", server.addr);
    let try_login = |c: &reqwest::Client, token: &str| {
        c.post(&login)
            .header(ORIGIN, &origin)
            .form(&[("token", token.to_string())])
            .send()
    };
    let here = client(None);
    let elsewhere = client(Some(ELSEWHERE));

    for _ in 0..FAILURES {
        let resp = try_login(&here, "guess").await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    }
    let page = assert_locked_out(try_login(&here, "guess").await.unwrap()).await;
    assert!(page.contains("Too many failed log-ins"), "{page}");
    let page = assert_locked_out(try_login(&here, ADMIN_TOKEN).await.unwrap()).await;
    assert!(page.contains("Try again in"), "{page}");

    let resp = try_login(&elsewhere, ADMIN_TOKEN).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    assert!(resp.headers().contains_key(SET_COOKIE));

    let logs = logged();
    let failures = logs
        .lines()
        .filter(|l| l.contains("panel log-in with a wrong token") && l.contains("client=127.0.0.1"))
        .count();
    assert_eq!(failures, FAILURES as usize, "{logs}");
}
