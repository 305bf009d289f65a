//! Shared test parts: a fresh database per test on the real PostgreSQL that
//! `make test` starts, a real HTTP consumer on loopback that records what it
//! receives, and a pump running in-process.
#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use sqlx::PgPool;
use tokio::sync::{oneshot, Notify};
use watchpump::config::PumpConfig;
use watchpump::pump::Pump;
use watchpump::services::Service;
use watchpump::watches::{Filters, NewWatch, Watch};

pub const PRODUCER: &str = "git";
pub const PRODUCER_TOKEN: &str = "producer-secret-token";

/// A database of its own, migrated, on the test cluster.
pub struct TestDb {
    pub pool: PgPool,
    pub url: String,
    pub name: String,
}

impl TestDb {
    pub async fn new() -> TestDb {
        let admin = std::env::var("WATCHPUMP_TEST_DATABASE_URL")
            .or_else(|_| std::env::var("DATABASE_URL"))
            .expect("WATCHPUMP_TEST_DATABASE_URL: run the tests with `make test`");
        let name = format!("wp_t_{:016x}", rand::random::<u64>());
        let admin_pool = watchpump::server::connect(&admin, 1)
            .await
            .expect("connect to the test cluster");
        sqlx::query(&format!("create database {name}"))
            .execute(&admin_pool)
            .await
            .unwrap();
        admin_pool.close().await;
        let url = format!("{}/{name}", admin.rsplit_once('/').unwrap().0);
        let pool = watchpump::server::connect(&url, 20).await.unwrap();
        watchpump::schema::migrate(&pool).await.unwrap();
        TestDb { pool, url, name }
    }

    pub async fn add_service(&self, name: &str, base_url: &str) -> (Service, String) {
        let registered = watchpump::services::add(&self.pool, name, base_url)
            .await
            .unwrap();
        (registered.service, registered.token)
    }

    pub async fn add_watch(
        &self,
        service_id: i64,
        resource: &str,
        object: &str,
        filters: Filters,
    ) -> Watch {
        let new = NewWatch {
            resource: resource.into(),
            object: object.into(),
            filters,
        };
        watchpump::watches::create(&self.pool, service_id, &new)
            .await
            .unwrap()
            .0
    }

    /// Emits one change in a transaction of its own, committed.
    pub async fn emit(&self, object: &str, kind: &str, payload: serde_json::Value) -> i64 {
        let mut tx = self.pool.begin().await.unwrap();
        let id = watchpump::emit(&mut tx, object, kind, &payload)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        id
    }

    /// Counts deliveries by state, e.g. `count_state("delivered")`.
    pub async fn count_state(&self, state: &str) -> i64 {
        sqlx::query_scalar("select count(*) from watchpump.deliveries where state = $1")
            .bind(state)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    pub async fn delivery_state(&self, id: i64) -> String {
        sqlx::query_scalar("select state from watchpump.deliveries where id = $1")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }
}

/// The pump configuration tests use: quick sweeps and short retries, so
/// that waiting for an outcome stays short; no timing is asserted.
pub fn pump_config() -> PumpConfig {
    let mut cfg = PumpConfig::new(PRODUCER, PRODUCER_TOKEN);
    cfg.sweep_interval_ms = 200;
    cfg.retry_initial_ms = 100;
    cfg.retry_max_ms = 400;
    cfg.connect_timeout_ms = 1000;
    cfg.request_timeout_ms = 2000;
    cfg.lease_ms = 5000;
    cfg.probe_interval_ms = 200;
    cfg
}

/// A pump running in this process until stopped.
pub struct RunningPump {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<watchpump::Result<()>>,
    pub name: String,
}

impl RunningPump {
    pub fn start(pool: &PgPool, cfg: PumpConfig) -> RunningPump {
        let pump = Pump::new(pool.clone(), cfg).expect("valid pump config");
        let name = pump.name().to_string();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(pump.run(async move {
            let _ = stopped.await;
        }));
        RunningPump {
            stop: Some(stop),
            task,
            name,
        }
    }

    /// Stops gracefully and returns the pump's result.
    pub async fn stop(mut self) -> watchpump::Result<()> {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.expect("pump task panicked")
    }
}

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
    shutdown: Arc<Mutex<Option<oneshot::Sender<()>>>>,
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
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await
                .unwrap();
        });
        Receiver {
            addr,
            state,
            shutdown: Arc::new(Mutex::new(Some(tx))),
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
        if let Some(tx) = self.shutdown.lock().unwrap().take() {
            let _ = tx.send(());
        }
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

/// Polls `check` until it returns true (panics after `limit`).
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        if Instant::now() > deadline {
            panic!("not within {limit:?}: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Filters for every change.
pub fn all() -> Filters {
    Filters::default()
}

pub fn kinds(kinds: &[&str]) -> Filters {
    Filters {
        kinds: Some(kinds.iter().map(|k| k.to_string()).collect()),
        match_path: None,
    }
}

pub fn matching(path: &str) -> Filters {
    Filters {
        kinds: None,
        match_path: Some(path.to_string()),
    }
}

// ---- The operator's side (issue 3): panel, admin API, failed deliveries ----

pub const ADMIN_TOKEN: &str = "admin-token-for-the-tests";

/// Operator settings for tests: the admin token set, everything else default.
pub fn operator_config() -> watchpump::operator::OperatorConfig {
    let mut cfg = watchpump::operator::OperatorConfig::new();
    cfg.admin_token = Some(ADMIN_TOKEN.into());
    cfg
}

/// The API with the panel and the admin API, served on loopback as
/// `watchpump serve` serves them.
pub struct AppServer {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

impl AppServer {
    pub async fn start(pool: &PgPool, operator: &watchpump::operator::OperatorConfig) -> AppServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let settings = watchpump::operator::Settings::new(operator, &pump_config(), addr);
        let app = watchpump::api::app(watchpump::api::AppState { pool: pool.clone() }).merge(
            watchpump::operator::router(watchpump::operator::OperatorState {
                pool: pool.clone(),
                settings: Arc::new(settings),
            }),
        );
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        AppServer {
            addr,
            stop: Some(stop),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for AppServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Emits one change whose deliveries are retried for `window` only (e.g.
/// '1 second'), so that a failing consumer makes them fail quickly.
pub async fn emit_with_window(
    db: &TestDb,
    object: &str,
    kind: &str,
    payload: serde_json::Value,
    window: &str,
) -> i64 {
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("select set_config('watchpump.delivery_window', $1, true)")
        .bind(window)
        .execute(&mut *tx)
        .await
        .unwrap();
    let id = watchpump::emit(&mut tx, object, kind, &payload)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    id
}

/// The one delivery of a change.
pub async fn delivery_of(db: &TestDb, change_id: i64) -> i64 {
    sqlx::query_scalar("select id from watchpump.deliveries where change_id = $1")
        .bind(change_id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// A consumer that answers 500, a watch on `object`, and one change whose
/// delivery the running pump tries until it fails for real (its window is a
/// second). Returns the consumer and the failed delivery's id.
pub async fn failed_delivery(
    db: &TestDb,
    service: &str,
    object: &str,
    payload: serde_json::Value,
) -> (Receiver, i64) {
    let consumer = Receiver::start().await;
    consumer.reply_with(500);
    let (svc, _) = db.add_service(service, &consumer.base_url()).await;
    db.add_watch(svc.id, "app-1", object, all()).await;
    let change = emit_with_window(db, object, "push", payload, "1 second").await;
    let id = delivery_of(db, change).await;
    eventually(Duration::from_secs(30), "the delivery fails", || async {
        db.delivery_state(id).await == "failed"
    })
    .await;
    (consumer, id)
}

/// Puts deliveries where a pump would have left them in `state`, for a test
/// that stages a situation: 'pending', or 'in_flight' (leased by pump "p"
/// for an hour), in the queue; 'delivered', 'superseded', 'dropped' or
/// 'failed' in the history, finished `finished_days_ago` days ago (default
/// now) with at least one attempt.
pub async fn set_state(db: &TestDb, ids: &[i64], state: &str, finished_days_ago: Option<i32>) {
    let ids = ids.to_vec();
    if state == "pending" || state == "in_flight" {
        sqlx::query(
            "select watchpump.requeue(array(select id from watchpump.settled where id = any($1)))",
        )
        .bind(&ids)
        .execute(&db.pool)
        .await
        .unwrap();
        sqlx::query(
            "update watchpump.queue
             set lease_until = case when $2 = 'in_flight' then now() + interval '1 hour' end,
                 leased_by = case when $2 = 'in_flight' then 'p' end,
                 attempts = attempts + case when $2 = 'in_flight' then 1 else 0 end
             where id = any($1)",
        )
        .bind(&ids)
        .bind(state)
        .execute(&db.pool)
        .await
        .unwrap();
        return;
    }
    sqlx::query(
        "select * from watchpump.settle(
             array(select id from watchpump.queue where id = any($1) order by id),
             array(select $2::text from watchpump.queue where id = any($1) order by id),
             array(select null::bigint from watchpump.queue where id = any($1) order by id),
             array(select null::int from watchpump.queue where id = any($1) order by id),
             array(select null::text from watchpump.queue where id = any($1) order by id))",
    )
    .bind(&ids)
    .bind(state)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "update watchpump.settled
         set state = $2, attempts = greatest(attempts, 1),
             finished_at = now() - make_interval(days => coalesce($3, 0))
         where id = any($1)",
    )
    .bind(&ids)
    .bind(state)
    .bind(finished_days_ago)
    .execute(&db.pool)
    .await
    .unwrap();
}

/// The ids of deliveries matching a condition on the `watchpump.deliveries`
/// view, e.g. `ids_where(db, "object = 'acme/x'")`.
pub async fn ids_where(db: &TestDb, condition: &str) -> Vec<i64> {
    sqlx::query_scalar(&format!(
        "select id from watchpump.deliveries where {condition} order by id"
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// A child process killed when this is dropped, so that a failing test
/// leaves no pump running behind it.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
