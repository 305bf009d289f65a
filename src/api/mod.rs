//! The HTTP API consumers call, on `WATCHPUMP_LISTEN`: their watches
//! ([`watches`]), their own deliveries ([`deliveries`]) and the producer's
//! kinds of change ([`kinds`]), authenticated by their service token ([`auth`], with
//! failures throttled per client address), their writes bounded per
//! service ([`limits`]), and never handed a path or query that is not text
//! ([`crate::http::text`]). Errors are [`HttpError`]s, as JSON.

pub mod auth;
pub mod deliveries;
pub mod kinds;
pub mod limits;
pub mod openapi;
pub mod rate;
pub mod watches;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

use crate::caller::Audience;
use crate::http::{text, App, HttpError};

pub use crate::http::BODY_LIMIT;

/// The API as a router, for `serve`, embedding and tests; it takes the one
/// application state ([`App`]), whose throttle counts failed service-token
/// authentications.
pub fn app(state: App) -> Router {
    Router::new()
        .route("/api/v1/watches", get(watches::list).post(watches::create))
        .route(
            "/api/v1/watches/{id}",
            get(watches::show).delete(watches::remove),
        )
        .route("/api/v1/watches/{id}/ping", post(watches::ping))
        .route("/api/v1/watches/{id}/pause", post(watches::pause))
        .route("/api/v1/watches/{id}/resume", post(watches::resume))
        .route("/api/v1/watches/{id}/resync", post(watches::resync))
        .route("/api/v1/deliveries", get(deliveries::list))
        .route("/api/v1/deliveries/{id}", get(deliveries::show))
        .route(
            "/api/v1/deliveries/{id}/redeliver",
            post(deliveries::redeliver),
        )
        .route(
            "/api/v1/rate",
            get(rate::show).put(rate::set).delete(rate::clear),
        )
        .route("/api/v1/kinds", get(kinds::list))
        .route("/api/v1/openapi.json", get(openapi::spec))
        .route("/healthz", get(healthz))
        .fallback(|| async { HttpError::NotFound("no such endpoint".into()) })
        .method_not_allowed_fallback(|| async { HttpError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn(text::refuse_unreadable))
        .layer(Audience::Consumer.layer())
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
