//! A real HTTP consumer on loopback that records every request it receives
//! and answers as a test tells it to.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use tokio::sync::Notify;

use super::servers::Served;

/// One request the consumer received.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    pub body: serde_json::Value,
    /// The body's exact bytes, as signed.
    pub raw: Vec<u8>,
    pub at: Instant,
}

/// How the consumer answers.
#[derive(Clone)]
pub struct Reply {
    pub status: u16,
    /// Statuses for deliveries to particular resources, overriding `status`.
    pub status_by_resource: std::collections::HashMap<String, u16>,
    pub delay: Duration,
    pub headers: Vec<(String, String)>,
    /// The answer's body.
    pub body: Vec<u8>,
}

struct ReceiverState {
    received: Mutex<Vec<Received>>,
    reply: Mutex<Reply>,
    arrived: Notify,
    /// Requests that have arrived, answered or not (held ones included).
    arrivals: std::sync::atomic::AtomicUsize,
    /// While true, requests wait after arriving, before they are answered.
    hold: tokio::sync::watch::Sender<bool>,
}

/// A real HTTP consumer on loopback that records every request.
#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    state: Arc<ReceiverState>,
    /// Until [`Receiver::stop`], or until the last clone is dropped.
    server: Arc<Mutex<Option<Served>>>,
}

impl Receiver {
    pub async fn start() -> Receiver {
        Self::start_on("127.0.0.1:0".parse().unwrap()).await
    }

    /// On a given address (to bring a consumer back where it was).
    pub async fn start_on(addr: SocketAddr) -> Receiver {
        let state = Arc::new(ReceiverState {
            received: Mutex::new(Vec::new()),
            reply: Mutex::new(Reply {
                status: 200,
                status_by_resource: Default::default(),
                delay: Duration::ZERO,
                headers: vec![],
                body: b"recorded".to_vec(),
            }),
            arrived: Notify::new(),
            arrivals: std::sync::atomic::AtomicUsize::new(0),
            hold: tokio::sync::watch::channel(false).0,
        });
        let app = Router::new()
            .route("/{*path}", post(record))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("bind the test consumer");
        let server = Served::start(listener, app).await;
        Receiver {
            addr: server.addr,
            state,
            server: Arc::new(Mutex::new(Some(server))),
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn reply_with(&self, status: u16) {
        self.state.reply.lock().unwrap().status = status;
    }

    /// Answers deliveries for `resource` with `status`, others as before.
    pub fn reply_for_resource(&self, resource: &str, status: u16) {
        self.state
            .reply
            .lock()
            .unwrap()
            .status_by_resource
            .insert(resource.into(), status);
    }

    pub fn reply_body(&self, body: &[u8]) {
        self.state.reply.lock().unwrap().body = body.to_vec();
    }

    pub fn delay_replies(&self, delay: Duration) {
        self.state.reply.lock().unwrap().delay = delay;
    }

    pub fn reply_header(&self, name: &str, value: &str) {
        self.state
            .reply
            .lock()
            .unwrap()
            .headers
            .push((name.into(), value.into()));
    }

    /// Holds every request from now on until [`Receiver::release`]: the
    /// request has arrived, but its answer waits (and is decided on release).
    pub fn hold(&self) {
        self.state.hold.send_replace(true);
    }

    /// Lets held requests be answered, with the reply configured now.
    pub fn release(&self) {
        self.state.hold.send_replace(false);
    }

    /// Waits until at least `n` requests have arrived, held ones included.
    pub async fn wait_for_arrivals(&self, n: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let notified = self.state.arrived.notified();
            let arrived = self
                .state
                .arrivals
                .load(std::sync::atomic::Ordering::SeqCst);
            if arrived >= n {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "{arrived} of {n} requests arrived within {limit:?}"
            );
            let _ = tokio::time::timeout(left, notified).await;
        }
    }

    /// Requests that have arrived so far, held ones included.
    pub fn arrivals(&self) -> usize {
        self.state
            .arrivals
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.state.received.lock().unwrap().len()
    }

    /// Waits until at least `n` requests have arrived (panics after `limit`).
    pub async fn wait_for(&self, n: usize, limit: Duration) -> Vec<Received> {
        let deadline = Instant::now() + limit;
        loop {
            let notified = self.state.arrived.notified();
            if self.count() >= n {
                return self.received();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                panic!(
                    "consumer received {} of {n} requests within {limit:?}",
                    self.count()
                );
            }
            let _ = tokio::time::timeout(left, notified).await;
        }
    }

    /// Stops listening; connections are refused from now on.
    pub fn stop(&self) {
        drop(self.server.lock().unwrap().take());
    }
}

async fn record(
    State(state): State<Arc<ReceiverState>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, HeaderMap, Vec<u8>) {
    state
        .arrivals
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    state.arrived.notify_waiters();
    let _ = state.hold.subscribe().wait_for(|held| !*held).await;
    let reply = state.reply.lock().unwrap().clone();
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let raw = body.to_vec();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    let status = body["resource"]
        .as_str()
        .and_then(|r| reply.status_by_resource.get(r).copied())
        .unwrap_or(reply.status);
    state.received.lock().unwrap().push(Received {
        path: uri.path().to_string(),
        headers,
        body,
        raw,
        at: Instant::now(),
    });
    state.arrived.notify_waiters();
    let mut out = HeaderMap::new();
    for (k, v) in reply.headers {
        out.insert(
            axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    (StatusCode::from_u16(status).unwrap(), out, reply.body)
}
