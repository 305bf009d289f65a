//! `/api/v1/admin`: the operator's JSON API, with the admin token as
//! `Authorization: Bearer`. Same errors and validation as the watches
//! API ([`HttpError`]); everything here also works from psql. Every answer
//! goes through [`crate::http::app::Settings::mask_json`]: consumers' answers
//! stored before masking existed, or echoing something new, show no token.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::caller::{misplaced, Audience, Caller};
use crate::http::error::{Error, NoSuchDelivery, NoSuchService, NoValidToken};
use crate::http::App;
use crate::http::{page, text, HttpError, BODY_LIMIT};
use crate::operator::store::{self, DeliveryFilter, WatchFilter};

/// How admin API actions appear in a delivery's history.
pub const ACTOR: &str = "admin-api";

pub fn routes() -> Router<App> {
    Router::new()
        .route("/api/v1/admin/backlog", get(backlog))
        .route("/api/v1/admin/deliveries", get(deliveries))
        .route("/api/v1/admin/deliveries/{id}", get(delivery))
        .route("/api/v1/admin/deliveries/{id}/attempts", get(attempts))
        .route("/api/v1/admin/deliveries/{id}/retry", post(retry))
        .route(
            "/api/v1/admin/services/{name}/retry-failed",
            post(retry_failed),
        )
        .route("/api/v1/admin/watches", get(watches))
        .route("/api/v1/admin/warnings", get(warnings))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn(text::refuse_unreadable))
        .layer(Audience::Admin.layer())
}

/// The caller holds the admin token: the admin API's narrowing of
/// [`Caller`].
pub struct Admin;

impl FromRequestParts<App> for Admin {
    type Rejection = axum::response::Response;

    async fn from_request_parts(parts: &mut Parts, state: &App) -> Result<Self, Self::Rejection> {
        match Caller::from_request_parts(parts, state).await? {
            Caller::Admin => Ok(Admin),
            other => Err(misplaced(parts, &other)),
        }
    }
}

/// What the backlog answers.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct BacklogAnswer {
    services: Vec<store::Backlog>,
    /// Present when the page was read on a standby (WATCHPUMP_READ_DATABASE_URL): how many seconds behind the primary it is, 0 when it has replayed all it received; what changed since is not on the page yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    replica_lag_seconds: Option<f64>,
}

/// Per service: what waits, what is on its way, what failed
#[utoipa::path(get,
    operation_id = "admin_backlog", path = "/api/v1/admin/backlog", tag = "admin", security(("admin_token" = [])),
    responses(
        (status = 200, description = "backlog", body = BacklogAnswer),
        NoValidToken,
    ))]
pub(crate) async fn backlog(_: Admin, State(state): State<App>) -> Result<Json<Value>, HttpError> {
    let lag = state.reads.lag().await?;
    let services = store::backlog(state.reads.pool()).await?;
    state.settings.masked(&BacklogAnswer {
        services,
        replica_lag_seconds: lag,
    })
}

/// A page of deliveries, newest first.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct AdminDeliveryPage {
    deliveries: Vec<store::Delivery>,
    /// Pass as `before` for the next (older) page; null on the last.
    next_before: Option<i64>,
    /// Present when the page was read on a standby (WATCHPUMP_READ_DATABASE_URL): how many seconds behind the primary it is, 0 when it has replayed all it received; what changed since is not on the page yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    replica_lag_seconds: Option<f64>,
}

/// Deliveries, newest first
///
/// `{"deliveries": [...], "next_before": <id or null>}`; pass `next_before`
/// as `before` for the next (older) page.
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
    query: Result<Query<DeliveryFilter>, QueryRejection>,
) -> Result<Json<Value>, HttpError> {
    let Query(filter) = query?;
    let filter = filter.normalized();
    let limit = filter.limit.unwrap_or(100);
    let filter = DeliveryFilter {
        limit: Some(limit),
        watch_id: None,
        ..filter
    };
    let lag = state.reads.lag().await?;
    let page = store::deliveries(state.reads.pool(), &filter).await?;
    let next_before = page::cursor_if_full(&page, limit, |d| d.delivery_id);
    state.settings.masked(&AdminDeliveryPage {
        deliveries: page,
        next_before,
        replica_lag_seconds: lag,
    })
}

/// A delivery as the admin API shows it.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct AdminDeliveryShown {
    delivery: store::Delivery,
    attempts: Vec<store::Attempt>,
    history: Vec<store::Event>,
}

/// A delivery, its attempts and its history
#[utoipa::path(get,
    operation_id = "admin_delivery", path = "/api/v1/admin/deliveries/{id}", tag = "admin", security(("admin_token" = [])),
    params(("id" = i64, Path, description = "the delivery's id")),
    responses(
        (status = 200, description = "the delivery", body = AdminDeliveryShown),
        NoSuchDelivery,
        NoValidToken,
    ))]
pub(crate) async fn delivery(
    _: Admin,
    State(state): State<App>,
    id: Result<Path<i64>, PathRejection>,
) -> Result<Json<Value>, HttpError> {
    let id = delivery_id(id)?;
    let delivery = store::delivery(&state.pool, id)
        .await?
        .ok_or_else(|| no_such_delivery(id))?;
    let attempts = store::attempts(&state.pool, id).await?;
    let history = store::history(&state.pool, id).await?;
    state.settings.masked(&AdminDeliveryShown {
        delivery,
        attempts,
        history,
    })
}

/// A delivery's attempts, in order.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Attempts {
    attempts: Vec<store::Attempt>,
}

/// A delivery's attempts
#[utoipa::path(get,
    operation_id = "admin_attempts", path = "/api/v1/admin/deliveries/{id}/attempts", tag = "admin", security(("admin_token" = [])),
    params(("id" = i64, Path, description = "the delivery's id")),
    responses(
        (status = 200, description = "attempts", body = Attempts),
        NoSuchDelivery,
        NoValidToken,
    ))]
pub(crate) async fn attempts(
    _: Admin,
    State(state): State<App>,
    id: Result<Path<i64>, PathRejection>,
) -> Result<Json<Value>, HttpError> {
    let id = delivery_id(id)?;
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
    params(("id" = i64, Path, description = "the delivery's id")),
    responses(
        (status = 200, description = "requeued", body = Requeued),
        NoSuchDelivery,
        (status = 409, description = "not in a state to retry", body = Error),
        NoValidToken,
    ))]
pub(crate) async fn retry(
    _: Admin,
    State(state): State<App>,
    id: Result<Path<i64>, PathRejection>,
) -> Result<Json<Value>, HttpError> {
    let id = delivery_id(id)?;
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
    params(("name" = String, Path, description = "the service's name")),
    request_body = RetryFailed,
    responses(
        (status = 200, description = "requeued", body = RequeuedFailures),
        NoSuchService,
        (status = 422, description = "bad body", body = Error),
        NoValidToken,
    ))]
pub(crate) async fn retry_failed(
    _: Admin,
    State(state): State<App>,
    Path(name): Path<String>,
    body: Result<Json<RetryFailed>, JsonRejection>,
) -> Result<Json<Value>, HttpError> {
    let Json(body) = body?;
    let requeued = store::retry_failed(&state.pool, &name, body.since, ACTOR).await?;
    state.settings.masked(&RequeuedFailures {
        service: name,
        since: body.since,
        requeued,
    })
}

/// A page of watches, newest first.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct AdminWatchPage {
    #[schema(value_type = Vec<Value>)]
    watches: Vec<store::WatchRow>,
    /// Pass as `before` for the next (older) page; null on the last.
    next_before: Option<i64>,
    /// Present when the page was read on a standby (WATCHPUMP_READ_DATABASE_URL): how many seconds behind the primary it is, 0 when it has replayed all it received; what changed since is not on the page yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    replica_lag_seconds: Option<f64>,
}

/// Watches, newest first
///
/// `{"watches": [...], "next_before": <id or null>}`, newest first.
#[utoipa::path(get,
    operation_id = "admin_watches", path = "/api/v1/admin/watches", tag = "admin", security(("admin_token" = [])),
    params(WatchFilter),
    responses(
        (status = 200, description = "a page", body = AdminWatchPage),
        (status = 422, description = "bad limit", body = Error),
        NoValidToken,
    ))]
pub(crate) async fn watches(
    _: Admin,
    State(state): State<App>,
    query: Result<Query<WatchFilter>, QueryRejection>,
) -> Result<Json<Value>, HttpError> {
    let Query(filter) = query?;
    let limit = page::size(filter.limit, 100, store::MAX_PAGE).map_err(HttpError::Invalid)?;
    let lag = state.reads.lag().await?;
    let page = store::watches(state.reads.pool(), &filter).await?;
    let next_before = page::cursor_if_full(&page, limit, |w| w.watch_id);
    state.settings.masked(&AdminWatchPage {
        watches: page,
        next_before,
        replica_lag_seconds: lag,
    })
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct WarningQuery {
    /// One service's warnings.
    service: Option<String>,
}

/// The warnings the admin API answers.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Warnings {
    #[schema(value_type = Vec<Value>)]
    warnings: Vec<store::Warning>,
    /// Present when the page was read on a standby (WATCHPUMP_READ_DATABASE_URL): how many seconds behind the primary it is, 0 when it has replayed all it received; what changed since is not on the page yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    replica_lag_seconds: Option<f64>,
}

/// Warnings to notify
#[utoipa::path(get,
    operation_id = "admin_warnings", path = "/api/v1/admin/warnings", tag = "admin", security(("admin_token" = [])),
    params(WarningQuery),
    responses(
        (status = 200, description = "warnings", body = Warnings),
        NoValidToken,
    ))]
pub(crate) async fn warnings(
    _: Admin,
    State(state): State<App>,
    query: Result<Query<WarningQuery>, QueryRejection>,
) -> Result<Json<Value>, HttpError> {
    let Query(q) = query?;
    let lag = state.reads.lag().await?;
    let warnings = store::warnings(state.reads.pool(), q.service.as_deref(), 100).await?;
    state.settings.masked(&Warnings {
        warnings,
        replica_lag_seconds: lag,
    })
}

fn delivery_id(id: Result<Path<i64>, PathRejection>) -> Result<i64, HttpError> {
    id.map(|Path(id)| id)
        .map_err(|_| HttpError::NotFound("no such delivery: ids are integers".into()))
}

fn no_such_delivery(id: i64) -> HttpError {
    HttpError::NotFound(format!("there is no delivery {id}"))
}
