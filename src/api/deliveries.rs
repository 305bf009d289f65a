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

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::api::limits::{self, Write};
use crate::api::{auth::Caller, AppState};
use crate::db::consumer as db;
pub use crate::db::consumer::Attempt;
use crate::delivery::State as DeliveryState;
use crate::error::{Error, Result};
use crate::http::HttpError;
use crate::operator::store;
use crate::replica::with_lag;

/// Entries on a page when `limit` is not given.
const DEFAULT_PAGE: i64 = 100;
/// Most entries on one page: one page is one index range scan of at most
/// this many rows (and as many `last_action` look-ups); asking for more is
/// a 400 (tests/consumer_deliveries.rs).
pub const MAX_PAGE: i64 = 1000;

/// One delivery as its consumer lists it.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    pub id: i64,
    pub watch_id: i64,
    pub object: String,
    pub kind: String,
    pub change_id: i64,
    pub sequence: i64,
    pub state: DeliveryState,
    /// Attempts made so far (a claim counts the attempt it starts).
    pub attempts: i32,
    pub created_at: DateTime<Utc>,
    pub next_attempt_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The status of the last answer; null before any, or when the last
    /// attempt got none.
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub superseded_by: Option<i64>,
}

/// [`Entry`]'s columns of the page query's `delivery_log` row, aliased `l`
/// (as [`db::delivery_entry`] reads one entry).

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    watch_id: Option<i64>,
    /// An exact object, or a prefix ending in '/'.
    object: Option<String>,
    state: Option<DeliveryState>,
    /// Created at or after (RFC 3339).
    since: Option<DateTime<Utc>>,
    /// The `next_after` of the previous page: entries older than it.
    after: Option<i64>,
    limit: Option<i64>,
}

/// `{"deliveries": [...], "next_after": <id or null>}`, newest first; pass
/// `next_after` as `after` for the next (older) page.
pub async fn list(
    State(state): State<AppState>,
    Caller(service): Caller,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Value>, HttpError> {
    let Query(q) = query?;
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(HttpError::BadRequest(format!(
            "limit must be 1 to {MAX_PAGE}"
        )));
    }
    if let Some(object) = &q.object {
        crate::watches::check_object(object).map_err(HttpError::from)?;
    }
    // One more than asked for: a cursor only when something follows.
    let lag = state.reads.lag().await?;
    let mut page = entries(state.reads.pool(), service.id, &q, limit + 1).await?;
    let more = page.len() as i64 > limit;
    page.truncate(limit as usize);
    let next_after = more.then(|| page.last().map(|d| d.id)).flatten();
    Ok(Json(state.mask_json(with_lag(
        json!({ "deliveries": page, "next_after": next_after }),
        lag,
    ))))
}

/// The entry, the body as sent (at its last attempt, or as it will be sent
/// at its first) and its attempts, folded runs shown as such.
pub async fn show(
    State(state): State<AppState>,
    Caller(service): Caller,
    id: Result<Path<i64>, PathRejection>,
) -> Result<Json<Value>, HttpError> {
    let id = delivery_id(id)?;
    let entry = entry(&state.pool, service.id, id)
        .await?
        .ok_or_else(|| no_such_delivery(id))?;
    let body = sent_body(&state.pool, id, &state.producer).await?;
    let attempts = db::attempts(&state.pool, id).await?;
    let mut shown = serde_json::to_value(&entry).map_err(|e| Error::Invalid(e.to_string()))?;
    shown["body"] = body;
    shown["attempts"] = json!(attempts);
    Ok(Json(state.mask_json(shown)))
}

/// Queues the delivery again under the same id: 202, 409 where the order
/// rule forbids it, 429 within a minute of its last redelivery
/// (`watchpump.redeliver()`) or past the service's bucket ([`limits`]).
pub async fn redeliver(
    State(state): State<AppState>,
    Caller(service): Caller,
    id: Result<Path<i64>, PathRejection>,
) -> Result<(StatusCode, Json<Value>), HttpError> {
    let id = delivery_id(id)?;
    limits::take(&state.pool, &service, Write::Redeliver).await?;
    let actor = format!("consumer {}", service.name);
    let previous = db::redeliver(&state.pool, service.id, id, &actor)
        .await
        .map_err(|e| limits::too_many_or_raised(e, &service.name, "redeliver"))?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"delivery_id": id, "previous_state": previous, "state": "pending"})),
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
        before: q.after,
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
    db::delivery_entry(pool, service_id, id)
        .await?
        .map(Entry::try_from)
        .transpose()
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

impl TryFrom<db::DeliveryEntry> for Entry {
    type Error = Error;

    fn try_from(row: db::DeliveryEntry) -> Result<Entry> {
        Ok(Entry {
            id: row.id,
            watch_id: row.watch_id,
            object: row.object,
            kind: row.kind,
            change_id: row.change_id,
            sequence: row.sequence,
            state: DeliveryState::try_from(row.state)
                .map_err(|e| Error::Database(sqlx::Error::Decode(e.into())))?,
            attempts: row.attempts,
            created_at: row.created_at,
            next_attempt_at: row.next_attempt_at,
            finished_at: row.finished_at,
            last_status: row.last_status,
            last_error: row.last_error,
            superseded_by: row.superseded_by,
        })
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

fn delivery_id(id: Result<Path<i64>, PathRejection>) -> Result<i64, HttpError> {
    id.map(|Path(id)| id)
        .map_err(|_| HttpError::NotFound("no such delivery: ids are integers".into()))
}

fn no_such_delivery(id: i64) -> HttpError {
    HttpError::NotFound(format!("no delivery {id} for this service"))
}
