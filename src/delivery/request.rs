//! The request of one attempt: where it goes, its headers (the producer's
//! token, watchpump's numbers, the Standard Webhooks signatures), and the
//! same request as an operator reads it in the panel.

use crate::signing::{self, SigningSecret};

/// `<base URL>/api/v1/<producer>/events`.
pub fn events_url(base_url: &str, producer: &str) -> String {
    format!(
        "{}/api/v1/{producer}/events",
        base_url.trim_end_matches('/')
    )
}

/// A consumer service as the pump sends to it: the registry's record and
/// its events URL, parsed once per version of the service rather than once
/// per delivery.
#[cfg(feature = "producer")]
#[derive(Debug)]
pub struct Target {
    pub destination: crate::services::Destination,
    pub url: reqwest::Url,
    /// The attempt span's attributes that depend on the service alone
    /// (`url.full`, `server.*`, `watchpump.service`), made once, on the
    /// first sampled attempt: each attempt then clones them (a reference
    /// count each) instead of redacting and copying the URL again.
    pub span_attributes: std::sync::OnceLock<Vec<opentelemetry::KeyValue>>,
}

#[cfg(feature = "producer")]
impl Target {
    pub fn new(
        destination: crate::services::Destination,
        producer: &str,
    ) -> Result<Target, String> {
        let url = events_url(&destination.base_url, producer);
        let url = reqwest::Url::parse(&url).map_err(|e| format!("{url:?}: {e}"))?;
        Ok(Target {
            destination,
            url,
            span_attributes: std::sync::OnceLock::new(),
        })
    }
}

/// The headers of one attempt, in the order they are sent: the producer's
/// token (ADR 0021), the content type, watchpump's own delivery and attempt
/// numbers, and the three Standard Webhooks headers signing the body (the
/// concatenation of `body`'s parts) with each of `secrets` (two while a
/// secret rotates).
pub fn headers(
    authorization: &str,
    delivery_id: i64,
    attempt: i32,
    timestamp: i64,
    body: &[&[u8]],
    secrets: &[&SigningSecret],
) -> [(&'static str, String); 7] {
    let id = delivery_id.to_string();
    let signature = signing::sign_parts(secrets, &id, timestamp, body);
    [
        ("authorization", authorization.to_string()),
        ("content-type", "application/json".to_string()),
        ("watchpump-delivery", id.clone()),
        ("watchpump-attempt", attempt.to_string()),
        (signing::HEADER_ID, id),
        (signing::HEADER_TIMESTAMP, timestamp.to_string()),
        (signing::HEADER_SIGNATURE, signature),
    ]
}

/// The request as an operator reads it (HTTP/1.1 text), with the token and
/// the per-attempt signature left out.
pub fn render(url: &str, delivery_id: i64, attempt: i32, body: &[u8], mask: &str) -> String {
    format!(
        "POST {url}\n\
         Authorization: Bearer {mask}\n\
         Content-Type: application/json\n\
         Watchpump-Delivery: {delivery_id}\n\
         Watchpump-Attempt: {attempt}\n\
         webhook-id: {delivery_id}\n\
         webhook-timestamp: (the second of each attempt)\n\
         webhook-signature: v1,(HMAC-SHA256 of id.timestamp.body with the service's signing secret)\n\
         \n{}",
        String::from_utf8_lossy(body)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_url_names_the_producer() {
        assert_eq!(
            events_url("http://h:1/base/", "git"),
            "http://h:1/base/api/v1/git/events"
        );
    }

    #[test]
    fn the_signature_covers_the_exact_body_and_verifies() {
        let secret = SigningSecret::generate();
        let body = br#"{"delivery_id":7}"#;
        let headers = headers(
            "Bearer t",
            7,
            1,
            1_700_000_000,
            &[&body[..5], &body[5..]],
            &[&secret],
        );
        let get = |name: &str| headers.iter().find(|(n, _)| *n == name).unwrap().1.clone();
        assert_eq!(get("webhook-id"), "7");
        assert!(signing::verify(
            &[&secret],
            &get("webhook-id"),
            &get("webhook-timestamp"),
            &get("webhook-signature"),
            body,
            1_700_000_000,
            signing::DEFAULT_TOLERANCE_SECS
        )
        .is_ok());
    }
}
