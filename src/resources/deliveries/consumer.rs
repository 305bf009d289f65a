//! `/api/v1/deliveries`: a consumer service reads its own deliveries (what
//! was sent, what it answered) and asks for one again, without a ticket to
//! the producer's operators (issue 20). Another service's delivery is 404,
//! as if it did not exist.
//!
//! Read through the operator's views (`watchpump.delivery_log`,
//! `watchpump.attempts`, `watchpump.message()`), whose names and columns
//! stay stable however the history tables underneath are stored; each page
//! is a keyset on the delivery id with the service's id as a literal, so
//! that the planner uses the per-service index of the history
//! (`settled (service_id, id)`) and never counts or offsets.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::api::limits::{self, Write};
use crate::caller::Consumer;
use crate::db::consumer as db;
pub use crate::db::consumer::Attempt;
use crate::delivery::State as DeliveryState;
use crate::error::{Error, Result};
use crate::http::error::{Error as ErrorBody, NoValidToken, NotTheCallers};
use crate::http::extract::{DeliveryPath, PathId, Query};
use crate::http::App;
use crate::http::{page, HttpError};
use crate::operator::store;

/// One of the caller's deliveries: a row of `delivery_log` as
/// [`db::delivery_entry`] reads it.
pub use crate::db::consumer::DeliveryEntry as Entry;

/// [`Entry`]'s columns of the page query's `delivery_log` row, aliased `l`
/// (as [`db::delivery_entry`] reads one entry).

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// One watch's deliveries.
    watch_id: Option<i64>,
    /// An exact object, or a prefix ending in '/'.
    object: Option<String>,
    state: Option<DeliveryState>,
    /// Created at or after (RFC 3339).
    since: Option<DateTime<Utc>>,
    /// The `next_after` of the previous page: entries older than it.
    after: Option<i64>,
    /// 1 to 1000, default 100.
    limit: Option<i64>,
}

/// A page of the caller's deliveries, newest first.
#[derive(Serialize, utoipa::ToSchema)]
pub struct DeliveryPage {
    deliveries: Vec<Entry>,
    /// Pass as `after` for the next (older) page; null on the last.
    next_after: Option<i64>,
    #[serde(flatten)]
    read: crate::replica::Lag,
}

/// One delivery as `show` answers it: the [`Entry`], its body as sent and
/// its attempts, which take the place of the entry's count of them (so not
/// a flattened `Entry`: its `attempts` is a number).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // built as JSON by `show`; described here
pub struct DeliveryShown {
    id: i64,
    watch_id: i64,
    object: String,
    kind: String,
    change_id: i64,
    sequence: i64,
    state: DeliveryState,
    created_at: DateTime<Utc>,
    next_attempt_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    /// The status of the last answer; null before any, or when the last
    /// attempt got none.
    last_status: Option<i32>,
    last_error: Option<String>,
    superseded_by: Option<i64>,
    /// The body exactly as the pump sends it (at its last attempt, or as it
    /// will be sent at its first); null if its change was pruned.
    body: Option<Body>,
    attempts: Vec<Attempt>,
}

/// A delivery's body as the consumer receives it.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // what the pump sends (`crate::delivery::Message::body`); described here
pub struct Body {
    delivery_id: i64,
    change_id: i64,
    watch_id: i64,
    producer: String,
    resource: String,
    object: String,
    kind: String,
    sequence: i64,
    occurred_at: DateTime<Utc>,
    attempt: i32,
    /// The change's payload, as the producer emitted it.
    #[schema(value_type = Object)]
    payload: Value,
}

/// A redelivery queued.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Redelivered {
    delivery_id: i64,
    #[schema(value_type = DeliveryState)]
    previous_state: String,
    /// Always "pending".
    state: DeliveryState,
}

/// The caller's deliveries, newest first
///
/// `{"deliveries": [...], "next_after": <id or null>}`, newest first; pass
/// `next_after` as `after` for the next (older) page.
#[utoipa::path(get,
    operation_id = "deliveries_list", path = "/api/v1/deliveries", tag = "consumer",
    security(("service_token" = [])),
    params(ListQuery),
    responses(
        (status = 200, description = "a page", body = DeliveryPage),
        (status = 400, description = "bad filter or limit", body = ErrorBody),
        NoValidToken,
    ))]
pub async fn list(
    State(state): State<App>,
    Consumer(service): Consumer,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, HttpError> {
    let size = page::consumer_size(q.limit)?;
    if let Some(object) = &q.object {
        crate::watches::check_object(object).map_err(HttpError::from)?;
    }
    // Before the page: what changed after the lag was read is not on it.
    let lag = state.reads.lag().await?;
    let pool = state.reads.pool();
    let (deliveries, next_after) = page::read(
        size,
        async |ahead| entries(pool, service.id, &q, ahead).await,
        |d| d.id,
    )
    .await?;
    state.settings.masked(&DeliveryPage {
        deliveries,
        next_after,
        read: lag,
    })
}

/// One delivery: its body as sent and its attempts
///
/// The entry, the body as sent (at its last attempt, or as it will be sent
/// at its first) and its attempts, folded runs shown as such.
#[utoipa::path(get,
    operation_id = "deliveries_show", path = "/api/v1/deliveries/{id}", tag = "consumer",
    security(("service_token" = [])),
    params(DeliveryPath),
    responses(
        (status = 200, description = "the delivery", body = DeliveryShown),
        NotTheCallers,
        NoValidToken,
    ))]
pub async fn show(
    State(state): State<App>,
    Consumer(service): Consumer,
    PathId { id, .. }: DeliveryPath,
) -> Result<Json<Value>, HttpError> {
    let entry = entry(&state.pool, service.id, id)
        .await?
        .ok_or_else(|| no_such_delivery(id))?;
    let body = sent_body(&state.pool, id, &state.settings.producer).await?;
    let attempts = db::attempts(&state.pool, id).await?;
    let mut shown = serde_json::to_value(&entry).map_err(|e| Error::Invalid(e.to_string()))?;
    shown["body"] = body;
    shown["attempts"] = json!(attempts);
    Ok(Json(state.settings.mask_json(shown)))
}

/// Queue it again under the same id
///
/// Queues the delivery again under the same id: 202, 409 where the order
/// rule forbids it, 429 within a minute of its last redelivery
/// (`watchpump.redeliver()`) or past the service's bucket ([`limits`]).
#[utoipa::path(post,
    operation_id = "deliveries_redeliver", path = "/api/v1/deliveries/{id}/redeliver", tag = "consumer",
    security(("service_token" = [])),
    params(DeliveryPath),
    responses(
        (status = 202, description = "queued", body = Redelivered),
        NotTheCallers,
        (status = 409, description = "newer news of the object was sent or is on its way; or superseded; or still queued", body = ErrorBody),
        NoValidToken,
        (status = 429, description = "the delivery was redelivered less than a minute ago, or this service's self-service writes are over its bucket (60 at once, then 1 a second: watch creation, ping, redeliver, resync, pause and resume together); Retry-After (seconds) says when to ask again", body = ErrorBody, headers(("Retry-After" = u64, description = "seconds to wait before asking again"))),
    ))]
pub async fn redeliver(
    State(state): State<App>,
    Consumer(service): Consumer,
    PathId { id, .. }: DeliveryPath,
) -> Result<(StatusCode, Json<Redelivered>), HttpError> {
    limits::take(&state.pool, &service, Write::Redeliver).await?;
    let actor = format!("consumer {}", service.name);
    let previous = db::redeliver(&state.pool, service.id, id, &actor)
        .await
        .map_err(|e| limits::too_many_or_raised(e, &service.name, "redeliver"))?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Redelivered {
            delivery_id: id,
            previous_state: previous,
            state: DeliveryState::Pending,
        }),
    ))
}

/// One page of the service's deliveries, newest first: the operator's
/// keyset page ([`store::page`]), restricted to the service, so
/// that a consumer's list is a bounded index scan at any history (an
/// `order by ... limit` over `delivery_log` was planned either way, 6 ms
/// or 2 s at 1 M rows).
async fn entries(pool: &PgPool, service_id: i64, q: &ListQuery, limit: i64) -> Result<Vec<Entry>> {
    let filter = store::DeliveryFilter {
        state: q.state.map(|s| s.as_str().to_string()),
        object: q.object.clone(),
        since: q.since,
        after: q.after,
        limit: Some(limit),
        watch_id: q.watch_id,
        ..Default::default()
    };
    Ok(store::page(pool, &filter, Some(service_id))
        .await?
        .into_iter()
        .map(Entry::from)
        .collect())
}

async fn entry(pool: &PgPool, service_id: i64, id: i64) -> Result<Option<Entry>> {
    Ok(db::delivery_entry(pool, service_id, id).await?)
}

/// The consumer's view of a row of the operator's page: its own service's
/// deliveries, without the service, the watch's resource and object, the
/// deadline or the last action.
impl From<store::Delivery> for Entry {
    fn from(d: store::Delivery) -> Entry {
        Entry {
            id: d.delivery_id,
            watch_id: d.watch_id,
            object: d.object,
            kind: d.kind,
            change_id: d.change_id,
            sequence: d.sequence,
            state: d.state,
            attempts: d.attempts,
            created_at: d.created_at,
            next_attempt_at: d.next_attempt_at,
            finished_at: d.finished_at,
            last_status: d.last_status,
            last_error: d.last_error,
            superseded_by: d.superseded_by,
        }
    }
}

/// The body exactly as the pump sends it (`watchpump.message()` and
/// [`Message::body`]), as JSON; null if its change was pruned.
async fn sent_body(pool: &PgPool, id: i64, producer: &str) -> Result<Value> {
    match crate::db::delivery::message(pool, id).await? {
        Some(sent) => serde_json::from_slice(&sent.message.body(producer))
            .map_err(|e| Error::Invalid(format!("a delivery body is not JSON: {e}"))),
        None => Ok(Value::Null),
    }
}

fn no_such_delivery(id: i64) -> HttpError {
    HttpError::NotFound(format!("no delivery {id} for this service"))
}
