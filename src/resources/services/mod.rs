//! Consumer services, for the operator: register, list, rotate the
//! signing secret or the token, move to a new URL, set the most deliveries
//! a second, remove ([`admin`], `/api/v1/admin/services`, and [`panel`],
//! `/panel/services/...`), as `watchpump services ...` does. Each
//! audience's router mounts these routes behind its own door and limits.

pub mod admin;
pub mod panel;

use axum::routing::{delete, get, post, put};
use axum::Router;

use crate::http::App;

/// The admin API's routes.
pub fn admin_routes() -> Router<App> {
    Router::new()
        .route("/api/v1/admin/services", get(admin::list).post(admin::add))
        .route("/api/v1/admin/services/{name}", delete(admin::remove))
        .route(
            "/api/v1/admin/services/{name}/rotate-secret",
            post(admin::rotate_secret),
        )
        .route(
            "/api/v1/admin/services/{name}/rotate-token",
            post(admin::rotate_token),
        )
        .route("/api/v1/admin/services/{name}/url", put(admin::set_url))
        .route("/api/v1/admin/services/{name}/rate", put(admin::set_rate))
}

/// The panel's routes.
pub fn panel_routes() -> Router<App> {
    Router::new()
        .route("/panel/services/{name}/url", post(panel::set_url))
        .route("/panel/services/{name}/rate", post(panel::set_rate))
        .route(
            "/panel/services/{name}/rotate-secret",
            post(panel::rotate_secret),
        )
        .route(
            "/panel/services/{name}/rotate-token",
            post(panel::rotate_token),
        )
        .route("/panel/services/{name}/remove", post(panel::remove))
}
