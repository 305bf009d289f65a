//! Deliveries, for every audience: a consumer service reads its own and
//! asks for one again ([`consumer`], `/api/v1/deliveries`); the operator
//! pages through every service's, reads one with its attempts and history
//! and retries ([`admin`], `/api/v1/admin/deliveries`, and [`panel`],
//! `/panel/deliveries`). All read the same rows (`watchpump.delivery_log`
//! through [`crate::operator::store`] and [`crate::db`]); each audience's
//! router ([`crate::api::app`], [`crate::operator::router`]) mounts these
//! routes behind its own door and limits.

pub mod admin;
pub mod consumer;
pub mod panel;

use axum::routing::{get, post};
use axum::Router;

use crate::http::App;

/// The consumer API's routes.
pub fn consumer_routes() -> Router<App> {
    Router::new()
        .route("/api/v1/deliveries", get(consumer::list))
        .route("/api/v1/deliveries/{id}", get(consumer::show))
        .route(
            "/api/v1/deliveries/{id}/redeliver",
            post(consumer::redeliver),
        )
}

/// The admin API's routes.
pub fn admin_routes() -> Router<App> {
    Router::new()
        .route("/api/v1/admin/deliveries", get(admin::deliveries))
        .route("/api/v1/admin/deliveries/{id}", get(admin::delivery))
        .route(
            "/api/v1/admin/deliveries/{id}/attempts",
            get(admin::attempts),
        )
        .route("/api/v1/admin/deliveries/{id}/retry", post(admin::retry))
        .route(
            "/api/v1/admin/services/{name}/retry-failed",
            post(admin::retry_failed),
        )
}

/// The panel's routes.
pub fn panel_routes() -> Router<App> {
    Router::new()
        .route("/panel/deliveries", get(panel::list))
        .route("/panel/deliveries/{id}", get(panel::show))
        .route("/panel/deliveries/{id}/retry", post(panel::retry))
        .route(
            "/panel/services/{name}/retry-failed",
            post(panel::retry_failed),
        )
}
