//! The consumer's side of the kit's tests: a consumer database of its own
//! (not the producer's), a kit endpoint served on loopback and registered
//! as a service at the producer, a handler that records its work, requests
//! built and signed exactly as the pump builds them, and a proxy that loses
//! answers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::Router;
use sqlx::PgPool;
use watchpump::kit::{
    self, BoxError, Delivery, Handler, Inbox, Outcome, PgTransaction, Producer, WatchClient,
    WatchRequest,
};
use watchpump::signing::SigningSecret;

use crate::common::{
    fresh_database, loopback, AppServer, Served, TestDb, PRODUCER, PRODUCER_TOKEN,
};

/// The consumer's own database: a fresh one on the test cluster with the
/// kit's inbox, named like the producer's test databases so that the test
/// run's clean-up drops it too.
pub struct ConsumerDb {
    pub pool: PgPool,
}

impl ConsumerDb {
    pub async fn new(schema: &str) -> ConsumerDb {
        let url = fresh_database().await;
        let pool = PgPool::connect(&url).await.unwrap();
        kit::migrate(&pool).await.unwrap();
        sqlx::raw_sql(schema).execute(&pool).await.unwrap();
        ConsumerDb { pool }
    }

    /// `select count(*) ...`
    pub async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.unwrap()
    }

    /// Rows in the consumer's work table, and deliveries in its inbox.
    pub async fn work_and_inbox(&self) -> (i64, i64) {
        (
            self.count("select count(*) from work").await,
            self.count("select count(*) from watchpump_inbox.deliveries")
                .await,
        )
    }

    /// How many rows the inbox and the consumer's work table hold: what a
    /// refused request must leave as it was.
    pub async fn footprint(&self) -> (i64, i64, i64, i64) {
        (
            self.count("select count(*) from watchpump_inbox.deliveries")
                .await,
            self.count("select count(*) from watchpump_inbox.positions")
                .await,
            self.count("select count(*) from watchpump_inbox.watches where removed_at is null")
                .await,
            self.count("select count(*) from work").await,
        )
    }
}

/// The table [`Work`] writes to.
pub const WORK_SCHEMA: &str = "
    create table work (
        delivery_id bigint not null,
        object      text not null,
        kind        text not null,
        sequence    bigint not null,
        at          timestamptz not null default now()
    );";

/// A handler that writes one row per delivery into `work`, and can be told
/// to fail its next calls (after writing: the row must roll back) or to
/// answer Gone.
#[derive(Clone, Default)]
pub struct Work {
    pub calls: Arc<AtomicUsize>,
    pub fail_next: Arc<AtomicUsize>,
    pub gone: Arc<Mutex<bool>>,
}

impl Handler for Work {
    async fn handle(&self, tx: &mut PgTransaction<'_>, d: &Delivery) -> Result<Outcome, BoxError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        sqlx::query(
            "insert into work (delivery_id, object, kind, sequence) values ($1, $2, $3, $4)",
        )
        .bind(d.delivery_id)
        .bind(&d.object)
        .bind(&d.kind)
        .bind(d.sequence)
        .execute(&mut **tx)
        .await?;
        let failing = self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err("the handler fails on purpose".into());
        }
        if *self.gone.lock().unwrap() {
            return Ok(Outcome::Gone);
        }
        Ok(Outcome::Done)
    }
}

/// A consumer service: its database, registered at the producer (whose
/// database is `producer`, whose watches API is `api`), serving the kit's
/// endpoint with `handler` and the signing secret it was given.
pub struct Consumer {
    pub db: ConsumerDb,
    pub token: String,
    pub secret: SigningSecret,
    pub watches: WatchClient,
    pub server: Served,
}

impl Consumer {
    pub async fn start<H: Handler>(
        producer: &TestDb,
        api: &AppServer,
        name: &str,
        schema: &str,
        handler: H,
    ) -> Consumer {
        let db = ConsumerDb::new(schema).await;
        let listener = loopback().await;
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        let registered = watchpump::services::add_within(
            &producer.pool,
            name,
            &base_url,
            &watchpump::destinations::Destinations::loopback(),
        )
        .await
        .unwrap();
        let secret = SigningSecret::parse(&registered.signing_secret).unwrap();
        let app = endpoint(&db.pool, vec![secret.clone()], handler);
        let watches =
            WatchClient::new(db.pool.clone(), PRODUCER, &api.origin(), &registered.token).unwrap();
        Consumer {
            db,
            token: registered.token,
            secret,
            watches,
            server: Served::start(listener, app).await,
        }
    }

    pub async fn watch(&self, watch: WatchRequest) -> i64 {
        self.watches.register(&watch).await.unwrap().id
    }

    pub fn events_url(&self) -> String {
        format!("{}/api/v1/{PRODUCER}/events", self.server.base_url())
    }
}

/// The kit's endpoint for the test producer, knowing `secrets`.
pub fn endpoint<H: Handler>(pool: &PgPool, secrets: Vec<SigningSecret>, handler: H) -> Router {
    Inbox::new(pool.clone(), handler)
        .producer(Producer::new(PRODUCER, PRODUCER_TOKEN, secrets))
        .body_limit(64 * 1024)
        .router()
}

/// A delivery's body as the pump would send it.
pub fn delivery(id: i64, watch_id: i64, object: &str, sequence: i64) -> Delivery {
    Delivery {
        delivery_id: id,
        change_id: id,
        watch_id,
        producer: PRODUCER.into(),
        resource: "app-1".into(),
        object: object.into(),
        kind: "push".into(),
        sequence,
        occurred_at: chrono::Utc::now(),
        attempt: 1,
        payload: serde_json::json!({"after": "0000"}),
        replay: false,
    }
}

/// The pump's headers (`watchpump::delivery::request::headers`) for `body` at
/// `timestamp`, signed with `secret`, with the producer's token.
pub fn signed(
    id: i64,
    timestamp: i64,
    body: &[u8],
    secret: &SigningSecret,
) -> Vec<(String, String)> {
    watchpump::delivery::request::headers(
        &format!("Bearer {PRODUCER_TOKEN}"),
        id,
        1,
        timestamp,
        &[body],
        &[secret],
    )
    .into_iter()
    .map(|(name, value)| (name.to_string(), value))
    .collect()
}

pub fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// POSTs `body` with `headers`; returns the status and the JSON answer.
pub async fn post(
    url: &str,
    headers: &[(String, String)],
    body: Vec<u8>,
) -> (u16, serde_json::Value) {
    let mut request = reqwest::Client::new().post(url).body(body);
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
    )
}

/// A proxy between the pump and a consumer that forwards every request
/// and, while `lose` is above zero, replaces the consumer's answer with a
/// 502: the consumer did the work, but the pump never hears it did, and so
/// sends the delivery again.
pub struct LossyProxy {
    pub server: Served,
    pub lose: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct ProxyState {
    target: String,
    lose: Arc<AtomicUsize>,
    client: reqwest::Client,
}

impl LossyProxy {
    pub async fn start(target: String, lose: usize) -> LossyProxy {
        let lose = Arc::new(AtomicUsize::new(lose));
        let state = ProxyState {
            target,
            lose: lose.clone(),
            client: reqwest::Client::new(),
        };
        let app = Router::new()
            .route("/{*path}", axum::routing::post(forward))
            .with_state(state);
        LossyProxy {
            server: Served::on_loopback(app).await,
            lose,
        }
    }
}

async fn forward(
    State(state): State<ProxyState>,
    uri: Uri,
    mut headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Bytes) {
    headers.remove("host");
    headers.remove("content-length");
    let answer = state
        .client
        .post(format!("{}{}", state.target, uri.path()))
        .headers(headers)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = answer.status();
    let body = answer.bytes().await.unwrap();
    let lost = state
        .lose
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if lost {
        (StatusCode::BAD_GATEWAY, Bytes::from_static(b"answer lost"))
    } else {
        (status, body)
    }
}
