//! The message a consumer receives for one attempt of a delivery: where it
//! goes, its headers and its body (ADR 0021, signed per Standard Webhooks).
//! The pump sends it and the panel shows it, both from here, so what the
//! panel displays is what was sent.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::signing::{self, SigningSecret};

/// The body every consumer receives.
#[derive(Debug, Serialize)]
pub struct Body<'a> {
    pub delivery_id: i64,
    pub change_id: i64,
    pub watch_id: i64,
    pub producer: &'a str,
    pub resource: &'a str,
    pub object: &'a str,
    pub kind: &'a str,
    pub sequence: i64,
    pub occurred_at: &'a DateTime<Utc>,
    pub attempt: i32,
    /// The change's payload, embedded as PostgreSQL printed it.
    pub payload: &'a RawValue,
}

impl Body<'_> {
    /// The exact bytes sent, and signed.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a delivery body always serialises")
    }
}

/// A change's payload as stored (jsonb text), embedded unparsed; anything
/// that is not JSON (which jsonb cannot hold) becomes `null`.
pub fn payload(text: &str) -> Box<RawValue> {
    RawValue::from_string(text.to_owned())
        .unwrap_or_else(|_| RawValue::from_string("null".to_owned()).expect("null is JSON"))
}

/// `<base URL>/api/v1/<producer>/events`.
pub fn events_url(base_url: &str, producer: &str) -> String {
    format!(
        "{}/api/v1/{producer}/events",
        base_url.trim_end_matches('/')
    )
}

/// The headers of one attempt, in the order they are sent: the producer's
/// token (ADR 0021), the content type, watchpump's own delivery and attempt
/// numbers, and the three Standard Webhooks headers signing `body` with each
/// of `secrets` (two while a secret rotates).
pub fn headers(
    authorization: &str,
    delivery_id: i64,
    attempt: i32,
    timestamp: i64,
    body: &[u8],
    secrets: &[&SigningSecret],
) -> [(&'static str, String); 7] {
    let id = delivery_id.to_string();
    let signature = signing::sign(secrets, &id, timestamp, body);
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
        let headers = headers("Bearer t", 7, 1, 1_700_000_000, body, &[&secret]);
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

    #[test]
    fn a_payload_that_is_not_json_is_sent_as_null() {
        assert_eq!(payload("{\"a\": 1}").get(), "{\"a\": 1}");
        assert_eq!(payload("not json").get(), "null");
    }
}
