//! One delivery attempt in typed stages: `prepare` the request (body and
//! signed headers, [`crate::delivery`]), `Sender::call` the consumer, and
//! read its answer into an [`AttemptResult`] with a retry time
//! ([`crate::retry`]).
//!
//! Over 400 lines: one attempt from request to answer, its span included;
//! the span's helpers read the same delivery and target as the request.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use hyper::body::{Frame, SizeHint};
use opentelemetry::KeyValue;

use crate::config::PumpConfig;
use crate::delivery::outcome::{AttemptResult, Failure, Finished};
use crate::delivery::request::{self, Target};
use crate::delivery::{BodyParts, Claimed};
use crate::retry::{self, RetryPolicy};
use crate::telemetry::attempt::ClientSpan;
use crate::telemetry::context::TraceParent;

/// How the error of an attempt that never reached the consumer (it could not
/// connect) begins: `watchpump.complete()` holds the (watch, object) after
/// every other attempt with no answer, and reads this to tell.
pub const NOT_SENT: &str = "not sent: ";

/// How many bytes of a consumer's answer are kept with the attempt.
const RESPONSE_HEAD_BYTES: usize = 512;

/// How long an idle keep-alive connection to a consumer is kept. The
/// connections in use are bounded by `WATCHPUMP_MAX_IN_FLIGHT` (the claim
/// takes no more); each host keeps at most what its window allows idle
/// (`WATCHPUMP_SERVICE_CONCURRENCY`), for this long, so the idle ones are
/// those of the hosts sent to in the last 15 s. (8 per host were measured:
/// a busy consumer then reconnected for most deliveries, and bulk-1 fell
/// from 9,079/s to 5,074/s with twice the pump's CPU per delivery.)
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(15);

/// Sends deliveries through one keep-alive connection pool. It uses no
/// proxy, whatever `HTTP(S)_PROXY` says: a proxy would connect past the
/// destination checks ([`crate::destinations`]).
#[derive(Debug, Clone)]
pub struct Sender {
    client: reqwest::Client,
    producer: String,
    authorization: String,
    retry: RetryPolicy,
}

/// What the consumer answered: its status, the Retry-After it asked for,
/// and the head of its body (masked).
struct Answer {
    status: reqwest::StatusCode,
    retry_after: Option<Duration>,
    head: String,
}

impl Sender {
    pub fn new(cfg: &PumpConfig) -> Result<Self, reqwest::Error> {
        let resolver = cfg
            .destinations()
            .resolver(cfg.connect_timeout(), cfg.lookup());
        let builder = reqwest::Client::builder()
            .dns_resolver(resolver.clone())
            .no_proxy()
            .connector_layer(resolver.connect_guard())
            .connect_timeout(cfg.connect_timeout())
            .local_address(cfg.source_address)
            .timeout(cfg.request_timeout())
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(cfg.service_concurrency as usize)
            .pool_idle_timeout(IDLE_TIMEOUT)
            .tcp_nodelay(true)
            .user_agent(concat!("watchpump/", env!("CARGO_PKG_VERSION")));
        // Fencing (src/pump/fence.rs): the bytes of a request given up on
        // may wait in the kernel and reach the consumer once a partition
        // heals; the kernel drops them this soon instead.
        #[cfg(target_os = "linux")]
        let builder = builder.tcp_user_timeout(super::fence::unacknowledged_limit(cfg));
        let client = builder.build()?;
        Ok(Sender {
            client,
            producer: cfg.producer.clone(),
            authorization: format!("Bearer {}", cfg.producer_token),
            retry: cfg.retry_policy(),
        })
    }

    /// Makes one attempt to `target`. Never fails: every failure is a
    /// result.
    pub async fn send(&self, claimed: Claimed, target: Arc<Target>) -> Finished {
        let span = attempt_span(&claimed, &target);
        let started = Utc::now();
        let clock = std::time::Instant::now();
        let request = self.prepare(&claimed, &target, started);
        let request = with_trace_context(request, &span, claimed.trace.as_ref());
        let answer = self.call(request).await;
        let duration = clock.elapsed();
        end_attempt_span(span, &answer);
        let attempt = claimed.message.attempt;
        let (result, error, response_head) = match answer {
            Ok(answer) => {
                let code = answer.status.as_u16();
                let result = match code {
                    200..=299 => AttemptResult::Delivered { status: code },
                    410 => AttemptResult::Gone,
                    _ => AttemptResult::Retry {
                        at: self.retry.retry_at(attempt, answer.retry_after),
                        failure: Failure::Status(code),
                    },
                };
                let error = matches!(result, AttemptResult::Retry { .. })
                    .then(|| format!("HTTP {}", answer.status));
                (result, error, Some(answer.head))
            }
            Err(e) => {
                let failure = if e.is_timeout() {
                    Failure::Timeout
                } else {
                    Failure::Connect
                };
                let at = self.retry.retry_at(attempt, None);
                // complete() holds the (watch, object) after an attempt
                // with no answer, unless the request never left
                // (src/pump/fence.rs): it tells by this prefix.
                let error = if e.is_connect() {
                    format!("{NOT_SENT}{}", describe(&e))
                } else {
                    describe(&e)
                };
                (AttemptResult::Retry { at, failure }, Some(error), None)
            }
        };
        Finished {
            claimed,
            target,
            result,
            error,
            response_head,
            started,
            duration,
        }
    }

    /// The request as it goes out: the body and its signed headers. The
    /// body is sent in its parts, the payload's shared with the change's
    /// other deliveries ([`crate::delivery::payload`]).
    fn prepare(&self, c: &Claimed, target: &Target, now: DateTime<Utc>) -> reqwest::RequestBuilder {
        let m = &c.message;
        let body = m.body_parts(&self.producer);
        let headers = request::headers(
            &self.authorization,
            m.delivery_id,
            m.attempt,
            now.timestamp(),
            &body.slices(),
            &target.destination.signing_at(now),
        );
        let mut request = self.client.post(target.url.clone());
        for (name, value) in headers {
            request = request.header(name, value);
        }
        request.body(reqwest::Body::wrap(PartsBody::new(body)))
    }

    /// Sends `request` and reads the consumer's answer.
    async fn call(&self, request: reqwest::RequestBuilder) -> Result<Answer, reqwest::Error> {
        let mut response = request.send().await?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(retry::parse_retry_after);
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
        let cut = head.len() >= RESPONSE_HEAD_BYTES;
        Ok(Answer {
            status,
            retry_after,
            head: storable_text(&head, &[token], cut),
        })
    }
}

/// The attempt's CLIENT span, after the OpenTelemetry HTTP client
/// conventions (docs/operator.md, "Traces"): a child of the producer's span that
/// emitted the change, or a trace of its own when the change has no
/// context. Nothing when traces are off; no attribute is made when the
/// sampler drops it (an unsampled producer context, say) (see
/// [`ClientSpan`] for why it is not a `tracing` span).
fn attempt_span(c: &Claimed, target: &Target) -> ClientSpan {
    let m = &c.message;
    let mut span = ClientSpan::start("POST", c.trace.as_ref(), |attrs| {
        attrs.extend(target_attributes(target).iter().cloned());
        attrs.extend([
            KeyValue::new("http.request.resend_count", i64::from(m.attempt - 1)),
            KeyValue::new("watchpump.delivery_id", m.delivery_id),
            KeyValue::new("watchpump.watch_id", m.watch_id),
            KeyValue::new("watchpump.object", m.object.clone()),
            KeyValue::new("watchpump.sequence", m.sequence),
        ]);
    });
    if let Some(lost) = &c.expired_lease_of {
        span.add_event(
            "sent again: the lease of the pump that held this delivery ran out",
            vec![KeyValue::new("pump", lost.to_string())],
        );
    }
    span
}

/// The attempt attributes of `target`'s service, made on its first
/// sampled attempt and shared by the rest ([`Target::span_attributes`]).
fn target_attributes(target: &Target) -> &[KeyValue] {
    target.span_attributes.get_or_init(|| {
        let url = &target.url;
        let shared = |s: String| opentelemetry::Value::from(std::sync::Arc::<str>::from(s));
        vec![
            KeyValue::new("http.request.method", "POST"),
            KeyValue::new("url.full", shared(redacted_url(url))),
            KeyValue::new(
                "server.address",
                shared(url.host_str().unwrap_or_default().to_string()),
            ),
            KeyValue::new(
                "server.port",
                i64::from(url.port_or_known_default().unwrap_or_default()),
            ),
            KeyValue::new("watchpump.service", shared(target.destination.name.clone())),
        ]
    })
}

/// `traceparent` (and `tracestate`) on the request, W3C Trace Context: the
/// attempt's own span as the parent, so that the consumer's spans hang
/// under the attempt that reached them; with traces off, the producer's
/// context as the change keeps it. Not signed (docs/protocol.md).
fn with_trace_context(
    request: reqwest::RequestBuilder,
    span: &ClientSpan,
    change: Option<&TraceParent>,
) -> reqwest::RequestBuilder {
    let own = span.context();
    let Some(context) = own.as_ref().or(change) else {
        return request;
    };
    let request = request.header("traceparent", context.header());
    match &context.tracestate {
        Some(state) => request.header("tracestate", state.as_str()),
        None => request,
    }
}

/// What the consumer answered, on the span, which ends here: its status,
/// and status error on a non-2xx answer or a transport failure; a 410 says
/// the delivery is dropped with its watch.
fn end_attempt_span(mut span: ClientSpan, answer: &Result<Answer, reqwest::Error>) {
    if !span.is_recording() {
        return;
    }
    match answer {
        Ok(a) => {
            let code = a.status.as_u16();
            span.set_attribute(KeyValue::new("http.response.status_code", i64::from(code)));
            if !a.status.is_success() {
                span.set_attribute(KeyValue::new("error.type", code.to_string()));
                span.set_error();
            }
            if code == 410 {
                span.add_event(
                    "delivery dropped: the consumer answered 410 Gone, its watch is removed",
                    Vec::new(),
                );
            }
        }
        Err(e) => {
            let kind = if e.is_timeout() {
                "timeout"
            } else {
                "connect_error"
            };
            span.set_attribute(KeyValue::new("error.type", kind));
            span.set_error();
        }
    }
    span.end();
}

/// `url.full` as the conventions want it: no credentials, no query values.
fn redacted_url(url: &reqwest::Url) -> String {
    if url.username().is_empty() && url.password().is_none() && url.query().is_none() {
        return url.as_str().to_string();
    }
    let mut url = url.clone();
    if !url.username().is_empty() || url.password().is_some() {
        let _ = url.set_username("REDACTED");
        let _ = url.set_password(Some("REDACTED"));
    }
    if url.query().is_some() {
        let names: Vec<String> = url.query_pairs().map(|(k, _)| k.into_owned()).collect();
        url.query_pairs_mut()
            .clear()
            .extend_pairs(names.iter().map(|k| (k.as_str(), "REDACTED")));
    }
    url.to_string()
}

/// A body sent as its parts (head, shared payload, tail), each a frame,
/// with its exact length known (so it goes with a `Content-Length`).
struct PartsBody {
    frames: std::collections::VecDeque<Bytes>,
}

impl PartsBody {
    fn new(body: BodyParts) -> PartsBody {
        let frames = [
            Bytes::from(body.head),
            body.payload.bytes(),
            Bytes::from_static(BodyParts::TAIL),
        ];
        PartsBody {
            frames: frames.into_iter().filter(|f| !f.is_empty()).collect(),
        }
    }
}

impl hyper::body::Body for PartsBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(
            self.get_mut()
                .frames
                .pop_front()
                .map(|f| Ok(Frame::data(f))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.frames.iter().map(|f| f.len() as u64).sum())
    }
}

/// Bytes as text PostgreSQL can store: invalid UTF-8 and NUL (which `text`
/// refuses, failing the whole batch of outcomes) become U+FFFD; and without
/// secrets: `secrets` and anything that looks like a credential are masked
/// ([`crate::redact`]), as a consumer may echo its request back. `cut`: the
/// bytes are the first of a longer answer, which may end inside a token.
fn storable_text(bytes: &[u8], secrets: &[&str], cut: bool) -> String {
    let text = String::from_utf8_lossy(bytes).replace('\0', "\u{FFFD}");
    if cut {
        crate::redact::mask_cut(&text, secrets)
    } else {
        crate::redact::mask(&text, secrets)
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
    storable_text(text.as_bytes(), &[], false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_full_has_no_credentials_and_no_query_values() {
        let url =
            reqwest::Url::parse("http://alice:s3cret@127.0.0.1:9/api/v1/git/events?token=abc&x=1")
                .unwrap();
        assert_eq!(
            redacted_url(&url),
            "http://REDACTED:REDACTED@127.0.0.1:9/api/v1/git/events?token=REDACTED&x=REDACTED"
        );
        let plain = reqwest::Url::parse("http://127.0.0.1:9/api/v1/git/events").unwrap();
        assert_eq!(redacted_url(&plain), "http://127.0.0.1:9/api/v1/git/events");
    }

    #[test]
    fn answers_are_stored_without_nul_bytes() {
        assert_eq!(storable_text(b"a\0b\xff", &[], false), "a\u{FFFD}b\u{FFFD}");
    }
}
