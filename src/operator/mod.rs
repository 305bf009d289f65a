//! The operator's side (ADR 0021: deliveries "visible and retryable in the
//! producer's panel"): the panel, the admin API, the warning to notify, and
//! pruning. The durable parts are SQL (`sql/migrations/0002_operator.sql`,
//! `sql/functions/0600_operator.sql`, pruning `0200_history.sql`), so psql
//! sees and does the same.
//!
//! - [`store`]: the reads and actions both front ends share.
//! - [`auth`]: admin token, panel sessions, Origin check.
//! - [`admin`]: `/api/v1/admin/...`, JSON, `Authorization: Bearer <admin token>`;
//!   [`admin_services`] is its part for the service lifecycle.
//! - [`panel`]: `/panel`, server-rendered HTML, no JavaScript.
//! - [`notify`]: folds failed deliveries into warnings and sends them.
//! - [`prune`]: deletes finished rows past retention, in small batches.
//! - [`worker`]: the periodic task running notify and prune, one pump at a time.
//! - [`config`]: the knobs, part of `watchpump serve`.

pub mod admin;
pub mod admin_services;
pub mod auth;
pub mod config;
pub mod notify;
pub mod panel;
pub mod prune;
pub mod store;
pub mod worker;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use sqlx::PgPool;

pub use config::OperatorConfig;
pub use worker::Worker;

use crate::config::PumpConfig;
use crate::destinations::Destinations;
use crate::throttle::Throttle;

/// What the panel and the admin API share.
#[derive(Clone)]
pub struct OperatorState {
    pub pool: PgPool,
    /// Where the lists are read: `pool`, or a standby
    /// (`WATCHPUMP_READ_DATABASE_URL`, [`crate::replica`]).
    pub reads: crate::replica::Reads,
    pub settings: Arc<Settings>,
}

/// The resolved settings of the operator's HTTP side. Its `Debug` leaves
/// the tokens out.
pub struct Settings {
    /// None: the panel and the admin API are off.
    pub admin_token: Option<String>,
    pub producer: String,
    /// Masked wherever the panel shows a request or an answer.
    pub producer_token: String,
    /// Public URL of the panel, without a trailing '/'.
    pub panel_url: String,
    /// `scheme://host[:port]` of `panel_url`, as browsers send `Origin`.
    pub panel_origin: String,
    pub secure_cookie: bool,
    pub session_ttl: Duration,
    /// Where services registered through the admin API may point.
    pub destinations: Destinations,
    /// Failed admin-token tries (panel log-ins and the admin API) per
    /// client address; `watchpump serve` shares its throttle with the API.
    pub throttle: Arc<Throttle>,
    /// `WATCHPUMP_TRACE_URL`: where a delivery's trace id links to.
    pub trace_url: Option<String>,
    /// `WATCHPUMP_RESYNC_MAX_OBJECTS`: a resync started from the panel is
    /// bounded as one the consumer starts.
    pub resync_max_objects: u32,
}

impl Settings {
    pub fn new(op: &OperatorConfig, pump: &PumpConfig, listen: SocketAddr) -> Settings {
        let panel_url = op.panel_url(listen);
        Settings {
            admin_token: op.admin_token.clone(),
            producer: pump.producer.clone(),
            producer_token: pump.producer_token.clone(),
            panel_origin: auth::origin_of(&panel_url),
            secure_cookie: panel_url.starts_with("https://"),
            panel_url,
            session_ttl: op.session_ttl(),
            throttle: Arc::new(Throttle::default()),
            destinations: pump.destinations(),
            trace_url: op.trace_url.clone(),
            resync_max_objects: pump.resync_max_objects,
        }
    }

    /// `text` with every secret the panel and the admin API must not show
    /// replaced: the producer's token, the admin token, and whatever looks
    /// like a credential ([`crate::redact::mask`], which the pump also
    /// applies before it stores an answer), wherever they appear (a
    /// consumer may echo a header back in its answer).
    pub fn mask(&self, text: &str) -> String {
        crate::redact::mask(text, &self.secrets())
    }

    /// [`Settings::mask`] for a text the panel cut to a length: a secret's
    /// beginning that ends it is masked too ([`crate::redact::mask_cut`]).
    pub fn mask_cut(&self, text: &str) -> String {
        crate::redact::mask_cut(text, &self.secrets())
    }

    fn secrets(&self) -> Vec<&str> {
        [Some(&self.producer_token), self.admin_token.as_ref()]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect()
    }

    /// `value` with [`Settings::mask`] applied to every string in it.
    pub fn mask_json(&self, value: serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match value {
            Value::String(s) => Value::String(self.mask(&s)),
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

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("admin_token", &self.admin_token.as_ref().map(|_| MASK))
            .field("producer", &self.producer)
            .field("panel_url", &self.panel_url)
            .field("panel_origin", &self.panel_origin)
            .field("secure_cookie", &self.secure_cookie)
            .field("session_ttl", &self.session_ttl)
            .finish_non_exhaustive()
    }
}

pub use crate::redact::MASK;

/// The panel and the admin API, to merge into the API's router.
pub fn router(state: OperatorState) -> Router {
    Router::new()
        .merge(admin::routes())
        .merge(admin_services::routes())
        .merge(panel::routes())
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        let mut op = OperatorConfig::new();
        op.admin_token = Some("admin-token-for-tests".into());
        let pump = PumpConfig::new("git", "producer-secret");
        Settings::new(&op, &pump, "127.0.0.1:8080".parse().unwrap())
    }

    #[test]
    fn a_secrets_beginning_at_the_end_is_masked_only_in_a_cut_text() {
        let s = settings();
        assert_eq!(s.mask_cut("cut at: producer-se"), format!("cut at: {MASK}"));
        assert_eq!(s.mask_cut("cut at: admin-tok"), format!("cut at: {MASK}"));
        assert_eq!(s.mask("a name: web-producer"), "a name: web-producer");
    }

    #[test]
    fn secrets_are_masked_wherever_they_appear() {
        let s = settings();
        let token = format!("wps_12_{}", "ab".repeat(32));
        let text =
            format!("Bearer producer-secret, admin-token-for-tests, {token}, wps_x, wps_3_short");
        let masked = s.mask(&text);
        assert_eq!(
            masked,
            format!("Bearer {MASK}, {MASK}, wps_12_{MASK}, wps_x, wps_3_short")
        );
    }

    #[test]
    fn the_panel_origin_follows_its_url() {
        let s = settings();
        assert_eq!(s.panel_url, "http://127.0.0.1:8080/panel");
        assert_eq!(s.panel_origin, "http://127.0.0.1:8080");
        assert!(!s.secure_cookie);
    }
}
