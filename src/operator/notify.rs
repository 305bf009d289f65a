//! The warning to notify (ADR 0021: a consumer down for more than a day
//! "finds failed deliveries in the producer's panel and a warning in
//! notify").
//!
//! A trigger notes every delivery that ends `failed` in
//! `watchpump.failure_inbox`, in the transaction that fails it. [`fold`]
//! drains the inbox into `watchpump.warnings`: at most one warning per
//! service per fold window, later failures counted into the next one.
//! [`Notifier::send_due`] hands due warnings to notify, retrying with the
//! delivery's back-off ([`crate::retry`]) until their deadline; without a
//! notify URL it logs them.

use std::time::Duration;

use chrono::Utc;
use serde::Serialize;
use sqlx::PgPool;

use crate::config::PumpConfig;
use crate::db::operator as db;
use crate::error::Result;
use crate::retry::RetryPolicy;

/// `watchpump_notify_warnings_total{service, outcome}`; outcome is `sent`,
/// `folded` (a failure counted into a warning instead of raising one) or
/// `logged` (no notify URL). Named with the other metrics.
use crate::metrics::NOTIFY_WARNINGS;

/// Warnings handed to notify in one step at most.
const SEND_BATCH: i64 = 100;

pub use crate::db::operator::{Due, Folded};

/// Drains the failure inbox into warnings. A warning is retried for as long
/// as a delivery is (`watchpump.delivery_window()`).
pub async fn fold(pool: &PgPool, every: Duration) -> Result<Vec<Folded>> {
    let folded = db::fold_failures(pool, every.as_secs_f64()).await?;
    for f in folded.iter().filter(|f| f.folded) {
        metrics::counter!(NOTIFY_WARNINGS, "service" => f.service.clone(), "outcome" => "folded")
            .increment(f.added as u64);
    }
    Ok(folded)
}

/// Sends warnings to notify, or logs them when there is no notify URL.
/// (No `Debug`: it holds the producer's token.)
#[derive(Clone)]
pub struct Notifier {
    client: reqwest::Client,
    url: Option<String>,
    producer: String,
    authorization: String,
    panel_url: String,
    retry: RetryPolicy,
}

/// What became of one warning in [`Notifier::send_due`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handed {
    pub warning_id: i64,
    pub state: WarningState,
}

/// Where a warning stands after an attempt, as
/// `watchpump.warning_attempted()` returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarningState {
    /// Notify took it.
    Sent,
    /// There is no notify URL: it was logged.
    Logged,
    /// Notify did not take it; it is retried.
    Pending,
    /// Notify did not take it before its deadline.
    Failed,
    /// It was no longer pending (another pump handed it on).
    Gone,
}

impl WarningState {
    fn from_sql(state: Option<&str>) -> WarningState {
        match state {
            Some("sent") => WarningState::Sent,
            Some("logged") => WarningState::Logged,
            Some("pending") => WarningState::Pending,
            Some("failed") => WarningState::Failed,
            _ => WarningState::Gone,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            WarningState::Sent => "sent",
            WarningState::Logged => "logged",
            WarningState::Pending => "pending",
            WarningState::Failed => "failed",
            WarningState::Gone => "gone",
        }
    }
}

/// What one attempt to hand a warning on came to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Handing {
    Sent { status: u16 },
    Logged,
    Retry { status: Option<u16>, error: String },
}

impl Handing {
    /// The outcome `watchpump.warning_attempted()` records, and the
    /// metric's label: `sent`, `logged` or `retry`.
    fn as_label(&self) -> &'static str {
        match self {
            Handing::Sent { .. } => "sent",
            Handing::Logged => "logged",
            Handing::Retry { .. } => "retry",
        }
    }

    fn status(&self) -> Option<i32> {
        match self {
            Handing::Sent { status } => Some(i32::from(*status)),
            Handing::Retry { status, .. } => status.map(i32::from),
            Handing::Logged => None,
        }
    }

    fn error(&self) -> Option<&str> {
        match self {
            Handing::Retry { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl Notifier {
    pub fn new(notify_url: Option<String>, pump: &PumpConfig, panel_url: &str) -> Result<Self> {
        let client = reqwest::Client::builder()
            .connect_timeout(pump.connect_timeout())
            .local_address(pump.source_address)
            .timeout(pump.request_timeout())
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("watchpump/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| crate::Error::Config(format!("notify HTTP client: {e}")))?;
        Ok(Notifier {
            client,
            url: notify_url,
            producer: pump.producer.clone(),
            authorization: format!("Bearer {}", pump.producer_token),
            panel_url: panel_url.trim_end_matches('/').to_string(),
            retry: pump.retry_policy(),
        })
    }

    /// Hands every due warning to notify (or the log) and records the outcome.
    pub async fn send_due(&self, pool: &PgPool) -> Result<Vec<Handed>> {
        let due = db::due_warnings(pool, SEND_BATCH).await?;
        let mut handed = Vec::with_capacity(due.len());
        for warning in due {
            let handing = self.hand(&warning).await;
            let next = Utc::now() + self.retry_delay(warning.attempts + 1);
            let state = db::warning_attempted(
                pool,
                warning.warning_id,
                handing.as_label(),
                handing.status(),
                handing.error(),
                next,
            )
            .await?;
            let state = WarningState::from_sql(state.as_deref());
            match &handing {
                Handing::Retry { error, .. } if state == WarningState::Failed => {
                    tracing::error!(warning_id = warning.warning_id, service = %warning.service,
                        error = %error, "notify did not take the warning before its deadline");
                }
                Handing::Retry { .. } => {}
                _ => {
                    metrics::counter!(NOTIFY_WARNINGS, "service" => warning.service.clone(), "outcome" => handing.as_label())
                        .increment(1);
                }
            }
            handed.push(Handed {
                warning_id: warning.warning_id,
                state,
            });
        }
        Ok(handed)
    }

    /// One attempt to hand `w` on.
    async fn hand(&self, w: &Due) -> Handing {
        let message = self.message(w);
        let Some(url) = &self.url else {
            tracing::warn!(warning_id = w.warning_id, service = %w.service, failed = w.failed,
                folded = w.folded, link = %message.link, "{}", message.text);
            return Handing::Logged;
        };
        let answer = self
            .client
            .post(url)
            .header(reqwest::header::AUTHORIZATION, &self.authorization)
            .header(
                "Idempotency-Key",
                format!("watchpump-{}-warning-{}", self.producer, w.warning_id),
            )
            .json(&message)
            .send()
            .await;
        match answer {
            Ok(r) if r.status().is_success() => Handing::Sent {
                status: r.status().as_u16(),
            },
            Ok(r) => Handing::Retry {
                status: Some(r.status().as_u16()),
                error: format!("HTTP {}", r.status()),
            },
            Err(e) => Handing::Retry {
                status: None,
                error: e.to_string(),
            },
        }
    }

    fn message<'a>(&self, w: &'a Due) -> Message<'a> {
        let link = format!("{}/services/{}", self.panel_url, w.service);
        let title = format!(
            "{}: {} deliveries to {} failed",
            self.producer, w.failed, w.service
        );
        let mut text = format!(
            "{} deliveries from {} to {} failed: their retries ran out; the oldest was created {}.",
            w.failed,
            self.producer,
            w.service,
            w.oldest_created_at.format("%Y-%m-%d %H:%M UTC")
        );
        if w.folded > 0 {
            text.push_str(&format!(
                " {} of them failed after this warning was raised and were folded into it.",
                w.folded
            ));
        }
        text.push_str(&format!(" Inspect and retry them in the panel: {link}"));
        Message {
            kind: "watchpump.deliveries_failed",
            producer: self.producer.clone(),
            key: format!(
                "watchpump/{}/deliveries_failed/{}",
                self.producer, w.service
            ),
            title,
            text,
            link,
            warning: w,
        }
    }

    /// The retry policy's back-off ([`RetryPolicy::backoff`]).
    fn retry_delay(&self, attempt: i32) -> chrono::Duration {
        chrono::Duration::from_std(self.retry.backoff(attempt))
            .unwrap_or(chrono::Duration::hours(1))
    }
}

/// The body POSTed to notify. `key` is the same for every warning about one
/// service, so notify can fold them for people too.
#[derive(Debug, Serialize)]
struct Message<'a> {
    kind: &'static str,
    producer: String,
    key: String,
    title: String,
    text: String,
    link: String,
    #[serde(flatten)]
    warning: &'a Due,
}
