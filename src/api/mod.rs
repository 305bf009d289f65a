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

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use sqlx::PgPool;

use crate::http::{text, HttpError};
use crate::throttle::Throttle;

/// Largest request body the API reads.
pub const BODY_LIMIT: usize = 64 * 1024;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    /// Where the listing pages read: `pool`, or a standby
    /// (`WATCHPUMP_READ_DATABASE_URL`, [`crate::replica`]).
    pub reads: crate::replica::Reads,
    /// The producer's name: a delivery's body, shown to its consumer as
    /// sent, carries it.
    pub producer: String,
    /// The producer's token, masked in whatever is shown (a consumer's
    /// answer may echo it).
    producer_token: String,
    /// WATCHPUMP_RESYNC_MAX_OBJECTS: the objects one resync goes through
    /// at most.
    pub resync_max_objects: u32,
}

impl AppState {
    /// The state for the pump configured by `pump` (its producer's name and
    /// token).
    pub fn new(pool: PgPool, pump: &crate::config::PumpConfig) -> AppState {
        AppState {
            reads: crate::replica::Reads::primary(pool.clone()),
            pool,
            producer: pump.producer.clone(),
            producer_token: pump.producer_token.clone(),
            resync_max_objects: pump.resync_max_objects,
        }
    }

    /// The state with its listing pages read through `reads`.
    pub fn with_reads(self, reads: crate::replica::Reads) -> AppState {
        AppState { reads, ..self }
    }

    /// `value` with every string masked ([`crate::redact::mask`]): the
    /// producer's token and anything that looks like a credential.
    pub fn mask_json(&self, value: serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match value {
            Value::String(s) => Value::String(crate::redact::mask(&s, &[&self.producer_token])),
            Value::Array(items) => {
                Value::Array(items.into_iter().map(|v| self.mask_json(v)).collect())
            }
            Value::Object(fields) => Value::Object(
                fields
                    .into_iter()
                    .map(|(k, v)| (k, self.mask_json(v)))
                    .collect(),
            ),
            other => other,
        }
    }
}

/// The API as a router, for `serve`, embedding and tests, with the default
/// throttle of failed service-token authentications (10 a minute per
/// client address).
pub fn app(state: AppState) -> Router {
    app_with(state, Arc::new(Throttle::default()))
}

/// [`app`] with a throttle of one's own (`watchpump serve` shares its
/// configured one with the panel and the admin API); the handlers find it
/// in the request's extensions.
pub fn app_with(state: AppState, throttle: Arc<Throttle>) -> Router {
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
        .layer(axum::Extension(throttle))
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
    axum::extract::State(state): axum::extract::State<AppState>,
) -> Result<&'static str, HttpError> {
    crate::db::consumer::ping_database(&state.pool).await?;
    Ok("ok")
}
