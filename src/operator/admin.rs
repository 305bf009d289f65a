//! `/api/v1/admin`: the operator's JSON API, with the admin token as
//! `Authorization: Bearer`: its router (each resource's admin routes,
//! [`crate::resources`], and the backlog and warnings here), its caller
//! ([`Admin`]). Same errors and validation as the watches
//! API ([`HttpError`]); everything here also works from psql. Every answer
//! that shows stored text (deliveries, attempts, watches, warnings, the
//! services) goes through [`crate::http::app::Settings::masked`]: consumers'
//! answers stored before masking existed, or echoing something new, show no
//! token. The answers that show a new credential once are not masked.

use axum::extract::{DefaultBodyLimit, State};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::caller::Admin;
use crate::http::error::NoValidToken;
use crate::http::extract::Query;
use crate::http::App;
use crate::http::{text, HttpError, BODY_LIMIT};
use crate::operator::store;
use crate::resources;

pub fn routes() -> Router<App> {
    Router::new()
        .route("/api/v1/admin/backlog", get(backlog))
        .route("/api/v1/admin/warnings", get(warnings))
        .merge(resources::deliveries::admin_routes())
        .merge(resources::watches::admin_routes())
        .merge(resources::services::admin_routes())
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn(text::refuse_unreadable))
}

/// What the backlog answers.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct BacklogAnswer {
    services: Vec<store::Backlog>,
    #[serde(flatten)]
    read: crate::replica::Lag,
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
        read: lag,
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
    #[serde(flatten)]
    read: crate::replica::Lag,
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
    Query(q): Query<WarningQuery>,
) -> Result<Json<Value>, HttpError> {
    let lag = state.reads.lag().await?;
    let warnings = store::warnings(state.reads.pool(), q.service.as_deref(), 100).await?;
    state.settings.masked(&Warnings {
        warnings,
        read: lag,
    })
}
