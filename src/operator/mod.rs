//! The operator's side (ADR 0021: deliveries "visible and retryable in the
//! producer's panel"): the panel, the admin API, the warning to notify, and
//! pruning. The durable parts are SQL (`sql/migrations/0002_operator.sql`,
//! `sql/functions/0600_operator.sql`, pruning `0200_history.sql`), so psql
//! sees and does the same.
//!
//! - [`store`]: the reads and actions both front ends share.
//! - [`auth`]: admin token, panel sessions, Origin check.
//! - [`admin`]: `/api/v1/admin/...`, JSON, `Authorization: Bearer <admin
//!   token>`: its router, mounting each resource's admin routes
//!   ([`crate::resources`]), and the backlog and warnings.
//! - [`panel`]: `/panel`, server-rendered HTML, no JavaScript: its router,
//!   mounting each resource's panel routes, and the pages that span them.
//! - [`notify`]: folds failed deliveries into warnings and sends them.
//! - [`prune`]: deletes finished rows past retention, in small batches.
//! - [`worker`]: the periodic task running notify and prune, one pump at a time.
//! - [`config`]: the knobs, part of `watchpump serve`.

pub mod admin;
pub mod auth;
pub mod config;
pub mod notify;
pub mod panel;
pub mod prune;
pub mod store;
pub mod worker;

use axum::Router;

pub use config::OperatorConfig;
pub use worker::Worker;

use crate::http::App;

pub use crate::redact::MASK;

/// The panel and the admin API, to merge into the API's router (both take
/// the one [`App`]).
pub fn router(state: App) -> Router {
    Router::new()
        .merge(admin::routes())
        .merge(panel::routes())
        .with_state(state)
}
