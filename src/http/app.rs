//! The one application state: every router of `serve`'s listener (the
//! consumer API, [`crate::api::app`]; the admin API and the panel,
//! [`crate::operator::router`]) takes the same [`App`], built once from
//! the configuration. Each knob is held once, here: the pool, where the
//! listing pages read, the throttle of failed authentications, and the
//! [`Settings`] (the producer's name and token, the resync bound, the
//! operator's side), so that the front ends cannot disagree about them and
//! there is one masking of what they show ([`Settings::mask`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::config::PumpConfig;
use crate::destinations::Destinations;
use crate::operator::auth;
use crate::operator::config::OperatorConfig;
use crate::redact::MASK;
use crate::replica::Reads;
use crate::throttle::Throttle;

/// What every handler of the listener can reach.
#[derive(Clone)]
pub struct App {
    pub pool: PgPool,
    /// Where the listing pages read: `pool`, or a standby
    /// (`WATCHPUMP_READ_DATABASE_URL`, [`crate::replica`]).
    pub reads: Reads,
    /// Failed authentications per client address (service tokens, the
    /// admin token, panel log-ins).
    pub throttle: Arc<Throttle>,
    pub settings: Arc<Settings>,
}

impl App {
    /// The state for the pump configured by `pump` and the operator's side
    /// configured by `operator` (off without an admin token), listening on
    /// `listen` (the panel's URL unless configured); its listing pages read
    /// on `pool`, its throttle the default one (10 failures a minute per
    /// client address).
    pub fn new(
        pool: PgPool,
        pump: &PumpConfig,
        operator: &OperatorConfig,
        listen: SocketAddr,
    ) -> App {
        App {
            reads: Reads::primary(pool.clone()),
            pool,
            throttle: Arc::new(Throttle::default()),
            settings: Arc::new(Settings::new(operator, pump, listen)),
        }
    }

    /// The state with its listing pages read through `reads`.
    pub fn with_reads(self, reads: Reads) -> App {
        App { reads, ..self }
    }

    /// The state with a throttle of one's own (`watchpump serve`'s is
    /// configured).
    pub fn with_throttle(self, throttle: Arc<Throttle>) -> App {
        App { throttle, ..self }
    }
}

/// The resolved settings of the HTTP side. Its `Debug` leaves the tokens
/// out.
pub struct Settings {
    /// None: the panel and the admin API are off.
    pub admin_token: Option<String>,
    /// The producer's name: a delivery's body, shown as sent, carries it.
    pub producer: String,
    /// Masked in whatever is shown (a consumer's answer may echo it).
    pub producer_token: String,
    /// Public URL of the panel, without a trailing '/'.
    pub panel_url: String,
    /// `scheme://host[:port]` of `panel_url`, as browsers send `Origin`.
    pub panel_origin: String,
    pub secure_cookie: bool,
    pub session_ttl: Duration,
    /// Where services registered through the admin API may point.
    pub destinations: Destinations,
    /// `WATCHPUMP_TRACE_URL`: where a delivery's trace id links to.
    pub trace_url: Option<String>,
    /// `WATCHPUMP_RESYNC_MAX_OBJECTS`: the objects one resync goes through
    /// at most, started by the consumer or from the panel.
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
            destinations: pump.destinations(),
            trace_url: op.trace_url.clone(),
            resync_max_objects: pump.resync_max_objects,
        }
    }

    /// `text` with every secret the HTTP side must not show replaced: the
    /// producer's token, the admin token, and whatever looks like a
    /// credential ([`crate::redact::mask`], which the pump also applies
    /// before it stores an answer), wherever they appear (a consumer may
    /// echo a header back in its answer).
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

    /// An API's answer as the JSON it sends, masked ([`Settings::mask_json`]).
    pub fn masked<T: serde::Serialize>(
        &self,
        answer: &T,
    ) -> Result<axum::Json<serde_json::Value>, crate::http::HttpError> {
        let value = serde_json::to_value(answer)
            .map_err(|e| crate::http::HttpError::Internal(crate::Error::Invalid(e.to_string())))?;
        Ok(axum::Json(self.mask_json(value)))
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
