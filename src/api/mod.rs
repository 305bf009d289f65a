//! The HTTP API consumers call, on `WATCHPUMP_LISTEN`: their watches, their
//! own deliveries, their rate and the producer's kinds of change (each
//! resource's consumer routes, [`crate::resources`]), authenticated by
//! their service token ([`crate::caller::Consumer`], with
//! failures throttled per client address), their writes bounded per
//! service ([`limits`]), and never handed a path or query that is not text
//! ([`crate::http::text`]). Errors are [`HttpError`]s, as JSON.

pub mod limits;
pub mod openapi;

use axum::extract::DefaultBodyLimit;
use axum::routing::get;
use axum::Router;

use crate::http::{text, App, HttpError};
use crate::resources;

pub use crate::http::BODY_LIMIT;

/// The API as a router, for `serve`, embedding and tests; it takes the one
/// application state ([`App`]), whose throttle counts failed service-token
/// authentications.
pub fn app(state: App) -> Router {
    Router::new()
        .merge(resources::watches::consumer_routes())
        .merge(resources::deliveries::consumer_routes())
        .merge(resources::rate::consumer_routes())
        .merge(resources::kinds::consumer_routes())
        .route("/api/v1/openapi.json", get(openapi::spec))
        .route("/healthz", get(healthz))
        .fallback(|| async { HttpError::NotFound("no such endpoint".into()) })
        .method_not_allowed_fallback(|| async { HttpError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn(text::refuse_unreadable))
        .with_state(state)
}

/// Liveness and database reachability
#[utoipa::path(get,
    operation_id = "healthz", path = "/healthz", tag = "consumer",
    security(()),
    responses(
        (status = 200, description = "ok", body = String, content_type = "text/plain"),
    ))]
async fn healthz(
    axum::extract::State(state): axum::extract::State<App>,
) -> Result<&'static str, HttpError> {
    crate::db::consumer::ping_database(&state.pool).await?;
    Ok("ok")
}
