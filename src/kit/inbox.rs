//! The events endpoint, `POST /api/v1/{producer}/events`: check who sent
//! it, record it in the consumer's database, run the consumer's
//! [`Handler`] in the same transaction, answer.
//!
//! The order of the steps is the point. The token is checked from the
//! headers before the body is read; the signature before the body is parsed;
//! both before the database is touched. The watch, the de-duplication and
//! the sequence are decided by `watchpump_inbox.receive()` inside the
//! transaction that then holds the handler's work, so "recorded" and "done"
//! commit together or not at all.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use sqlx::PgPool;

use crate::kit::answer::{Accepted, Refusal};
use crate::kit::delivery::{Delivery, Handler, Outcome};
use crate::kit::store::{self, Received};
use crate::kit::verify::Producer;
use crate::kit::PgTransaction;
use crate::telemetry::context::TraceParent;
use crate::telemetry::{self, TARGET};
use tracing::Instrument;

/// Largest body read by default: 1 MiB. A delivery is a change's payload
/// plus a few hundred bytes; raise it with [`Inbox::body_limit`] if the
/// producer emits larger payloads (a refused delivery is retried, then
/// fails at the producer, where it shows in the panel).
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// The consumer's events endpoint: its database, its handler, and the
/// producers it follows.
pub struct Inbox<H> {
    pool: PgPool,
    handler: H,
    producers: HashMap<String, Producer>,
    body_limit: usize,
}

impl<H: Handler> Inbox<H> {
    /// An endpoint that records deliveries in `pool` (migrated with
    /// [`crate::kit::migrate`]) and gives the new ones to `handler`.
    pub fn new(pool: PgPool, handler: H) -> Self {
        Inbox {
            pool,
            handler,
            producers: HashMap::new(),
            body_limit: DEFAULT_BODY_LIMIT,
        }
    }

    /// Accepts deliveries from `producer` at `/api/v1/<its name>/events`.
    /// Requests naming a producer that was not added are answered 404.
    pub fn producer(mut self, producer: Producer) -> Self {
        self.producers.insert(producer.name.clone(), producer);
        self
    }

    /// The largest request body read (413 beyond it).
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// The endpoint as a router, to serve alone or to `merge` into the
    /// consumer's own axum app.
    pub fn router(self) -> Router {
        Router::new()
            .route("/api/v1/{producer}/events", post(events::<H>))
            .with_state(Arc::new(self))
    }
}

async fn events<H: Handler>(
    State(inbox): State<Arc<Inbox<H>>>,
    Path(producer): Path<String>,
    request: Request,
) -> Response {
    let span = request_span(&request);
    let answer = inbox
        .take(&producer, request)
        .instrument(span.clone())
        .await;
    let response = span.in_scope(|| answer_of(answer, &producer));
    span.record("http.response.status_code", response.status().as_u16());
    if response.status().is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    response
}

/// The request's SERVER span, a child of the attempt span the producer's
/// pump named in `traceparent` (W3C Trace Context), so that the consumer's
/// work joins the trace that began at the producer's change. It is a span
/// of the consumer's own `tracing` subscriber: exported if the consumer
/// installs `tracing-opentelemetry`, nothing otherwise. The header is not
/// signed; a forged one can only misfile the consumer's own spans.
fn request_span(request: &Request) -> tracing::Span {
    let span = tracing::info_span!(target: TARGET, "POST /api/v1/{producer}/events",
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        "http.request.method" = "POST",
        "http.route" = "/api/v1/{producer}/events",
        "http.response.status_code" = tracing::field::Empty,
    );
    if !span.is_disabled() {
        let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok());
        if let Some(parent) =
            header("traceparent").and_then(|t| TraceParent::parse(t, header("tracestate")))
        {
            telemetry::set_parent(&span, &parent);
        }
    }
    span
}

fn answer_of(answer: Result<Accepted, Refusal>, producer: &str) -> Response {
    match answer {
        Ok(accepted) => accepted.into_response(),
        Err(refusal) => {
            // Internal errors and Gone were logged where they happened.
            // The producer segment is whatever the client put in the path
            // (percent-decoded, so CR, LF and ESC included): logged escaped
            // (`?`), so that it cannot forge a log line or a terminal
            // sequence. The refusal's message quotes client text with `?` too.
            if !matches!(refusal, Refusal::Internal | Refusal::Gone(_)) {
                tracing::warn!(producer = ?loggable(producer), %refusal, "delivery refused");
            }
            refusal.into_response()
        }
    }
}

impl<H: Handler> Inbox<H> {
    async fn take(&self, producer: &str, request: Request) -> Result<Accepted, Refusal> {
        let producer = self.producers.get(producer).ok_or_else(|| {
            Refusal::NoSuchProducer(format!(
                "this consumer follows no producer {:?}",
                loggable(producer)
            ))
        })?;
        let (parts, body) = request.into_parts();
        producer.check_token(&parts.headers)?;
        let body = read_body(body, self.body_limit).await?;
        let now = chrono::Utc::now().timestamp();
        let id = producer.check_signature(&parts.headers, &body, now)?;
        let delivery = parse(&body, id, producer)?;
        self.record(delivery).await
    }

    /// Records the delivery and, when it is new, runs the handler in the
    /// same transaction. Dropping `tx` on an early return rolls it back.
    async fn record(&self, d: Delivery) -> Result<Accepted, Refusal> {
        let mut tx = self.pool.begin().await.map_err(|e| internal(&d, &e))?;
        let received = store::receive(&mut tx, &d)
            .await
            .map_err(|e| internal(&d, &e))?;
        match received {
            Received::UnknownWatch => Err(Refusal::Forbidden(format!(
                "watch {} is not one this consumer registered at {}",
                d.watch_id, d.producer
            ))),
            Received::RemovedWatch => Err(Refusal::Gone(format!(
                "watch {} was removed by this consumer",
                d.watch_id
            ))),
            Received::Duplicate => Ok(Accepted::Duplicate),
            Received::Stale => {
                tx.commit().await.map_err(|e| internal(&d, &e))?;
                Ok(Accepted::Skipped)
            }
            Received::New => self.work(tx, &d).await,
        }
    }

    async fn work(
        &self,
        mut tx: PgTransaction<'static>,
        d: &Delivery,
    ) -> Result<Accepted, Refusal> {
        // The consumer's handler in a span of its own (the spans it makes
        // hang under it), inside the request's span.
        let span = tracing::info_span!(target: TARGET, "watchpump.handle",
            "watchpump.producer" = %d.producer,
            "watchpump.delivery_id" = d.delivery_id,
            "watchpump.watch_id" = d.watch_id,
            "watchpump.object" = %d.object,
            "watchpump.kind" = %d.kind,
            "watchpump.sequence" = d.sequence,
            otel.status_code = tracing::field::Empty,
        );
        let outcome = self
            .handler
            .handle(&mut tx, d)
            .instrument(span.clone())
            .await;
        if outcome.is_err() {
            span.record("otel.status_code", "ERROR");
        }
        match outcome {
            Ok(Outcome::Done) => {
                tx.commit().await.map_err(|e| internal(d, &e))?;
                Ok(Accepted::Done)
            }
            Ok(Outcome::Gone) => {
                tx.rollback().await.map_err(|e| internal(d, &e))?;
                let reason = format!(
                    "gone: the handler answered 410 to delivery {}",
                    d.delivery_id
                );
                crate::db::inbox::forget_watch(&self.pool, &d.producer, d.watch_id, &reason)
                    .await
                    .map_err(|e| internal(d, &e))?;
                tracing::info!(producer = %d.producer, watch_id = d.watch_id, resource = %d.resource, "resource gone: watch forgotten, answering 410");
                Err(Refusal::Gone(format!(
                    "{} is gone; watch {} is no longer wanted",
                    d.resource, d.watch_id
                )))
            }
            Err(e) => Err(internal(d, e.as_ref())),
        }
    }
}

/// The body, at most `limit` bytes of it.
async fn read_body(body: Body, limit: usize) -> Result<Vec<u8>, Refusal> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes().to_vec()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(Refusal::TooLarge(limit)),
        Err(e) => Err(Refusal::BadRequest(format!(
            "the request body could not be read: {e}"
        ))),
    }
}

/// The signed body as a delivery of `producer` with the signed id.
fn parse(body: &[u8], id: i64, producer: &Producer) -> Result<Delivery, Refusal> {
    let d: Delivery = serde_json::from_slice(body)
        .map_err(|e| Refusal::BadRequest(format!("the body is not a delivery: {e}")))?;
    if d.delivery_id != id {
        return Err(Refusal::BadRequest(format!(
            "the body's delivery_id {} is not the signed webhook-id {id}",
            d.delivery_id
        )));
    }
    if d.producer != producer.name {
        return Err(Refusal::BadRequest(format!(
            "the body's producer {:?} is not {:?}, whose endpoint this is",
            d.producer, producer.name
        )));
    }
    Ok(d)
}

/// Longest piece of a client's path that a log line quotes.
const LOGGED_PATH_CHARS: usize = 128;

/// At most [`LOGGED_PATH_CHARS`] characters of `text`, to be logged with
/// `?` (Debug escapes control characters): a long path cannot fill the
/// consumer's logs either.
fn loggable(text: &str) -> &str {
    match text.char_indices().nth(LOGGED_PATH_CHARS) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

/// Logs what went wrong (the producer only learns that it should retry).
fn internal(d: &Delivery, e: &(dyn std::error::Error + 'static)) -> Refusal {
    tracing::error!(producer = %d.producer, delivery_id = d.delivery_id, error = %e, "delivery not taken; the producer will retry");
    Refusal::Internal
}
