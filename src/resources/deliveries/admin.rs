//! `/api/v1/admin/deliveries`: every service's deliveries for the
//! operator, with the admin token: pages, one delivery with its attempts
//! and history, a retry, and a service's failures retried since a time.
//! Every answer is masked ([`crate::http::app::Settings::masked`]).

use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::caller::{Admin, AdminOnService, ADMIN_API_ACTOR as ACTOR};
use crate::http::error::{Error, NoSuchDelivery, NoSuchService, NoValidToken};
use crate::http::extract::{Body, DeliveryPath, PathId, Query};
use crate::http::{page, App, HttpError};
use crate::operator::store::{self, DeliveryFilter};

/// A page of deliveries, newest first.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct AdminDeliveryPage {
    deliveries: Vec<store::Delivery>,
    #[serde(flatten)]
    cursors: page::AdminCursors,
    #[serde(flatten)]
    read: crate::replica::Lag,
}

/// Deliveries, newest first
///
/// `{"deliveries": [...], "next_after": <id or null>}`; pass `next_after`
/// as `after` for the next (older) page (`crate::http::page`).
#[utoipa::path(get,
    operation_id = "admin_deliveries", path = "/api/v1/admin/deliveries", tag = "admin", security(("admin_token" = [])),
    params(DeliveryFilter),
    responses(
        (status = 200, description = "a page", body = AdminDeliveryPage),
        (status = 400, description = "bad filter", body = Error),
        (status = 422, description = "bad filter", body = Error),
        NoValidToken,
    ))]
pub(crate) async fn deliveries(
    _: Admin,
    State(state): State<App>,
    Query(filter): Query<DeliveryFilter>,
) -> Result<Json<Value>, HttpError> {
    // The watch is the consumer API's filter: the query cannot name one.
    let filter = filter.normalized();
    // A bad filter is refused without asking the standby; the lag is read
    // before the page: what changed after it is not on the page.
    filter.validate()?;
    let lag = state.reads.lag().await?;
    let (deliveries, next_after) = store::deliveries_page(state.reads.pool(), &filter).await?;
    state.settings.masked(&AdminDeliveryPage {
        cursors: page::AdminCursors::of(&deliveries, filter.size(), next_after, |d| d.delivery_id),
        deliveries,
        read: lag,
    })
}

/// A delivery, its attempts and its history
#[utoipa::path(get,
    operation_id = "admin_delivery", path = "/api/v1/admin/deliveries/{id}", tag = "admin", security(("admin_token" = [])),
    params(DeliveryPath),
    responses(
        (status = 200, description = "the delivery", body = store::Shown),
        NoSuchDelivery,
        NoValidToken,
    ))]
pub(crate) async fn delivery(
    _: Admin,
    State(state): State<App>,
    PathId { id, .. }: DeliveryPath,
) -> Result<Json<Value>, HttpError> {
    let shown = store::shown(&state.pool, id)
        .await?
        .ok_or_else(|| no_such_delivery(id))?;
    state.settings.masked(&shown)
}

/// A delivery's attempts, in order.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Attempts {
    attempts: Vec<store::Attempt>,
}

/// A delivery's attempts
#[utoipa::path(get,
    operation_id = "admin_attempts", path = "/api/v1/admin/deliveries/{id}/attempts", tag = "admin", security(("admin_token" = [])),
    params(DeliveryPath),
    responses(
        (status = 200, description = "attempts", body = Attempts),
        NoSuchDelivery,
        NoValidToken,
    ))]
pub(crate) async fn attempts(
    _: Admin,
    State(state): State<App>,
    PathId { id, .. }: DeliveryPath,
) -> Result<Json<Value>, HttpError> {
    if store::delivery(&state.pool, id).await?.is_none() {
        return Err(no_such_delivery(id));
    }
    let attempts = store::attempts(&state.pool, id).await?;
    state.settings.masked(&Attempts { attempts })
}

/// A delivery requeued.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Requeued {
    delivery_id: i64,
    previous_state: String,
    /// Always "pending".
    state: String,
}

/// Requeue a failed or dropped delivery
///
/// Requeues a failed or dropped delivery: 200 with its previous state, 404
/// for an unknown id, 409 for a delivery in another state.
#[utoipa::path(post,
    operation_id = "admin_retry", path = "/api/v1/admin/deliveries/{id}/retry", tag = "admin", security(("admin_token" = [])),
    params(DeliveryPath),
    responses(
        (status = 200, description = "requeued", body = Requeued),
        NoSuchDelivery,
        (status = 409, description = "not in a state to retry", body = Error),
        NoValidToken,
    ))]
pub(crate) async fn retry(
    _: Admin,
    State(state): State<App>,
    PathId { id, .. }: DeliveryPath,
) -> Result<Json<Value>, HttpError> {
    let previous = store::retry(&state.pool, id, ACTOR).await?;
    state.settings.masked(&Requeued {
        delivery_id: id,
        previous_state: previous,
        state: "pending".into(),
    })
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetryFailed {
    /// Failed at or after this time (RFC 3339).
    since: DateTime<Utc>,
}

/// What `retry_failed` requeued.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct RequeuedFailures {
    service: String,
    since: DateTime<Utc>,
    /// How many deliveries were requeued.
    requeued: i64,
}

/// Requeue a service's failures since a time
///
/// Requeues every delivery to the service that failed since `since`.
#[utoipa::path(post,
    operation_id = "admin_retry_failed", path = "/api/v1/admin/services/{name}/retry-failed", tag = "admin", security(("admin_token" = [])),
    params(AdminOnService),
    request_body = RetryFailed,
    responses(
        (status = 200, description = "requeued", body = RequeuedFailures),
        NoSuchService,
        (status = 422, description = "bad body", body = Error),
        NoValidToken,
    ))]
pub(crate) async fn retry_failed(
    AdminOnService { app: state, name }: AdminOnService,
    Body(body): Body<RetryFailed>,
) -> Result<Json<Value>, HttpError> {
    let requeued = store::retry_failed(&state.pool, &name, body.since, ACTOR).await?;
    state.settings.masked(&RequeuedFailures {
        service: name,
        since: body.since,
        requeued,
    })
}

fn no_such_delivery(id: i64) -> HttpError {
    HttpError::NotFound(format!("there is no delivery {id}"))
}
