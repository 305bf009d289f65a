//! One delivery attempt: build the body, POST it to the consumer, and turn
//! what happened into an [`Outcome`] with a retry time.

use std::time::Duration;

use backoff::backoff::Backoff;
use chrono::{DateTime, Utc};

use crate::config::PumpConfig;
use crate::message;
use crate::pump::store::Claimed;
use crate::services::Destination;
use std::sync::Arc;

/// How many bytes of a consumer's answer are kept with the attempt.
const RESPONSE_HEAD_BYTES: usize = 512;

/// What the attempt means for the delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx: the consumer stored it.
    Delivered,
    /// 410: the consumer's resource is gone; drop the watch.
    Gone,
    /// Anything else: ask again at `next_attempt_at`.
    Retry { next_attempt_at: DateTime<Utc> },
}

/// A finished attempt, on its way to `watchpump.complete()`.
#[derive(Debug)]
pub struct Finished {
    pub claimed: Claimed,
    /// Where it went, as of the claim.
    pub target: Arc<Target>,
    pub outcome: Outcome,
    /// Metric label: 2xx, 410, 3xx, 4xx, 5xx, timeout or connect_error.
    pub result: &'static str,
    pub status: Option<i32>,
    pub error: Option<String>,
    pub response_head: Option<String>,
    pub started: DateTime<Utc>,
    pub duration: Duration,
}

impl Finished {
    /// What this attempt says about the consumer's health: a server error,
    /// a timeout, a refused connection or 429 count against it; any other
    /// answer means it is up (a 4xx is about this delivery, not the service).
    pub fn answer(&self) -> crate::pump::health::Answer {
        use crate::pump::health::Answer;
        match self.result {
            "5xx" | "timeout" | "connect_error" => Answer::Failed,
            _ if self.status == Some(429) => Answer::Failed,
            _ => Answer::Answered,
        }
    }
}

/// A consumer service as this pump sends to it: the registry's record and
/// its events URL, parsed once per version of the service rather than once
/// per delivery.
#[derive(Debug)]
pub struct Target {
    pub destination: Destination,
    pub url: reqwest::Url,
}

impl Target {
    pub fn new(destination: Destination, producer: &str) -> Result<Target, String> {
        let url = message::events_url(&destination.base_url, producer);
        let url = reqwest::Url::parse(&url).map_err(|e| format!("{url:?}: {e}"))?;
        Ok(Target { destination, url })
    }
}

/// Sends deliveries through one keep-alive connection pool.
#[derive(Debug, Clone)]
pub struct Sender {
    client: reqwest::Client,
    producer: String,
    authorization: String,
    retry_initial: Duration,
    retry_max: Duration,
}

impl Sender {
    pub fn new(cfg: &PumpConfig) -> Result<Self, reqwest::Error> {
        let destinations = cfg.destinations();
        let client = reqwest::Client::builder()
            .dns_resolver(destinations.resolver())
            .connector_layer(destinations.connect_guard())
            .connect_timeout(cfg.connect_timeout())
            .timeout(cfg.request_timeout())
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(cfg.service_concurrency as usize)
            .pool_idle_timeout(Duration::from_secs(60))
            .tcp_nodelay(true)
            .user_agent(concat!("watchpump/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Sender {
            client,
            producer: cfg.producer.clone(),
            authorization: format!("Bearer {}", cfg.producer_token),
            retry_initial: cfg.retry_initial(),
            retry_max: cfg.retry_max(),
        })
    }

    /// Makes one attempt to `destination`. Never fails: every failure is an
    /// outcome.
    pub async fn send(&self, claimed: Claimed, target: Arc<Target>) -> Finished {
        let started = Utc::now();
        let clock = std::time::Instant::now();
        let answer = self.post(&claimed, &target, started).await;
        let duration = clock.elapsed();
        let (outcome, result, status, error, response_head) = match answer {
            Ok((status, retry_after, head)) => {
                let code = status.as_u16();
                let (outcome, result) = match code {
                    200..=299 => (Outcome::Delivered, "2xx"),
                    410 => (Outcome::Gone, "410"),
                    _ => (self.retry(claimed.attempt, retry_after), status_class(code)),
                };
                let error = (!status.is_success() && code != 410).then(|| format!("HTTP {status}"));
                (outcome, result, Some(code as i32), error, Some(head))
            }
            Err(e) => {
                let result = if e.is_timeout() {
                    "timeout"
                } else {
                    "connect_error"
                };
                (
                    self.retry(claimed.attempt, None),
                    result,
                    None,
                    Some(describe(&e)),
                    None,
                )
            }
        };
        Finished {
            claimed,
            target,
            outcome,
            result,
            status,
            error,
            response_head,
            started,
            duration,
        }
    }

    async fn post(
        &self,
        c: &Claimed,
        target: &Target,
        now: DateTime<Utc>,
    ) -> Result<(reqwest::StatusCode, Option<Duration>, String), reqwest::Error> {
        // The payload is jsonb text from PostgreSQL: embedded as is, unparsed.
        let payload = message::payload(&c.payload);
        let body = message::Body {
            delivery_id: c.delivery_id,
            change_id: c.change_id,
            watch_id: c.watch_id,
            producer: &self.producer,
            resource: &c.resource,
            object: &c.object,
            kind: &c.kind,
            sequence: c.sequence,
            occurred_at: &c.occurred_at,
            attempt: c.attempt,
            payload: &payload,
        }
        .to_bytes();
        let headers = message::headers(
            &self.authorization,
            c.delivery_id,
            c.attempt,
            now.timestamp(),
            &body,
            &target.destination.signing_at(now),
        );
        let mut request = self.client.post(target.url.clone());
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let mut response = request.body(body).send().await?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        // Keep the head of the answer for the operator; reading the rest of a
        // small body lets the connection go back to the pool.
        let mut head = Vec::new();
        while let Some(chunk) = response.chunk().await? {
            let room = RESPONSE_HEAD_BYTES.saturating_sub(head.len());
            head.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if head.len() >= RESPONSE_HEAD_BYTES {
                break;
            }
        }
        let token = self.authorization.trim_start_matches("Bearer ");
        Ok((status, retry_after, storable_text(&head, &[token])))
    }

    /// When to try again after failed attempt number `attempt`: exponential
    /// back-off with jitter, or the consumer's Retry-After within the same
    /// bounds.
    pub fn retry(&self, attempt: i32, retry_after: Option<Duration>) -> Outcome {
        let delay = match retry_after {
            Some(asked) => asked.clamp(self.retry_initial, self.retry_max),
            None => self.backoff_delay(attempt),
        };
        Outcome::Retry {
            next_attempt_at: Utc::now() + delay,
        }
    }

    fn backoff_delay(&self, attempt: i32) -> Duration {
        let exponent = attempt.saturating_sub(1).clamp(0, 30) as u32;
        let base = self
            .retry_initial
            .saturating_mul(2u32.saturating_pow(exponent))
            .min(self.retry_max);
        let mut policy = backoff::ExponentialBackoff {
            current_interval: base,
            initial_interval: self.retry_initial,
            randomization_factor: 0.25,
            multiplier: 2.0,
            max_interval: self.retry_max,
            max_elapsed_time: None,
            ..backoff::ExponentialBackoff::default()
        };
        policy.next_backoff().unwrap_or(base).min(self.retry_max)
    }
}

/// Bytes as text PostgreSQL can store: invalid UTF-8 and NUL (which `text`
/// refuses, failing the whole batch of outcomes) become U+FFFD; and without
/// secrets: `secrets` and anything that looks like a credential are masked
/// ([`crate::redact`]), as a consumer may echo its request back.
fn storable_text(bytes: &[u8], secrets: &[&str]) -> String {
    crate::redact::mask(
        &String::from_utf8_lossy(bytes).replace('\0', "\u{FFFD}"),
        secrets,
    )
}

fn status_class(code: u16) -> &'static str {
    match code {
        500..=599 => "5xx",
        400..=499 => "4xx",
        _ => "3xx",
    }
}

/// The error with its causes, which is where reqwest keeps the useful part
/// ("connection refused", "operation timed out").
fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    storable_text(text.as_bytes(), &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sender() -> Sender {
        let mut cfg = PumpConfig::new("git", "t");
        cfg.retry_initial_ms = 1000;
        cfg.retry_max_ms = 60_000;
        Sender::new(&cfg).unwrap()
    }

    #[test]
    fn retry_delays_grow_with_jitter_and_stay_bounded() {
        let s = sender();
        let d1 = s.backoff_delay(1);
        let d3 = s.backoff_delay(3);
        let d20 = s.backoff_delay(20);
        assert!(
            d1 >= Duration::from_millis(750) && d1 <= Duration::from_millis(1250),
            "{d1:?}"
        );
        assert!(
            d3 >= Duration::from_millis(3000) && d3 <= Duration::from_millis(5000),
            "{d3:?}"
        );
        assert!(d20 <= Duration::from_secs(60), "{d20:?}");
    }

    #[test]
    fn retry_after_is_honoured_within_bounds() {
        let s = sender();
        let at = |o: Outcome| match o {
            Outcome::Retry { next_attempt_at } => (next_attempt_at - Utc::now()).num_milliseconds(),
            _ => panic!("not a retry"),
        };
        assert!((29_000..=30_000).contains(&at(s.retry(1, Some(Duration::from_secs(30))))));
        assert!(at(s.retry(1, Some(Duration::from_secs(7200)))) <= 60_000);
        assert!(at(s.retry(1, Some(Duration::from_secs(0)))) >= 900);
    }

    #[test]
    fn answers_are_stored_without_nul_bytes() {
        assert_eq!(storable_text(b"a\0b\xff", &[]), "a\u{FFFD}b\u{FFFD}");
    }
}
