//! Watches, for every audience: a consumer service creates, lists, pings,
//! pauses, resumes, resyncs and removes its own ([`consumer`],
//! `/api/v1/watches`); the operator lists every service's ([`admin`],
//! `/api/v1/admin/watches`) and pauses, resumes and resyncs them, or a
//! whole service, from the panel ([`panel`]). Each audience's router
//! mounts these routes behind its own door and limits.

pub mod admin;
pub mod consumer;
pub mod panel;

use axum::routing::{get, post};
use axum::Router;

use crate::http::App;

/// The consumer API's routes.
pub fn consumer_routes() -> Router<App> {
    Router::new()
        .route(
            "/api/v1/watches",
            get(consumer::list).post(consumer::create),
        )
        .route(
            "/api/v1/watches/{id}",
            get(consumer::show).delete(consumer::remove),
        )
        .route("/api/v1/watches/{id}/ping", post(consumer::ping))
        .route("/api/v1/watches/{id}/pause", post(consumer::pause))
        .route("/api/v1/watches/{id}/resume", post(consumer::resume))
        .route("/api/v1/watches/{id}/resync", post(consumer::resync))
}

/// The admin API's routes.
pub fn admin_routes() -> Router<App> {
    Router::new().route("/api/v1/admin/watches", get(admin::watches))
}

/// The panel's routes.
pub fn panel_routes() -> Router<App> {
    Router::new()
        .route("/panel/watches/{id}/pause", post(panel::pause_watch))
        .route("/panel/watches/{id}/resume", post(panel::resume_watch))
        .route("/panel/watches/{id}/resync", post(panel::resync_watch))
        .route("/panel/services/{name}/pause", post(panel::pause_service))
        .route("/panel/services/{name}/resume", post(panel::resume_service))
}
