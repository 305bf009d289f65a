//! What a consumer's handler receives and what it answers.

use std::future::Future;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::kit::PgTransaction;

/// Any error a handler returns. Boxed so that `?` works on sqlx, serde and
/// the consumer's own errors alike; the kit only logs it and answers 500.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One delivery, as the producer sent it (the body of ADR 0021's
/// `POST /api/v1/<producer>/events`, see [`crate::delivery::Body`]).
///
/// Unknown fields are ignored, so a producer can add fields without breaking
/// consumers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    /// The same on every attempt of this delivery: the idempotency key.
    pub delivery_id: i64,
    pub change_id: i64,
    /// The watch this delivery is for; one of the consumer's own.
    pub watch_id: i64,
    pub producer: String,
    /// The consumer's resource the watch acts for (an app, a site).
    pub resource: String,
    /// The object that changed, e.g. `acme/web/refs/heads/main`.
    pub object: String,
    /// The change's kind, e.g. `push`.
    pub kind: String,
    /// Increases per object in the producer's commit order.
    pub sequence: i64,
    pub occurred_at: DateTime<Utc>,
    /// Which attempt this is (1 for the first).
    pub attempt: i32,
    /// The change's payload, as the producer emitted it.
    pub payload: serde_json::Value,
    /// Sent by a resync (the producer's docs/protocol.md, "Resync"): the
    /// newest change of the object again, with its original change id and
    /// sequence. The inbox treats it as any delivery: its work runs only
    /// when its sequence is above the one stored for the (watch, object).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replay: bool,
}

impl Delivery {
    /// The payload read into the consumer's own type.
    pub fn payload_as<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        T::deserialize(&self.payload)
    }

    /// What follows `prefix` in the object, e.g. the merge request's number
    /// in `acme/web/merge_requests/42` after `acme/web/merge_requests/`.
    pub fn object_after<'a>(&'a self, prefix: &str) -> Option<&'a str> {
        self.object.strip_prefix(prefix)
    }
}

/// How the consumer's work on a delivery ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The work is done (or stored for later): commit and answer 2xx.
    Done,
    /// The consumer's resource this watch acts for no longer exists: nothing
    /// is committed, the answer is 410, the producer removes the watch and
    /// drops its undelivered news, and the kit forgets the watch.
    Gone,
}

/// The consumer's work on one new delivery.
///
/// It runs only for a delivery that verified, names one of the consumer's
/// watches, was not accepted before, and is newer than what was accepted
/// for its (watch, object). `tx` is the transaction the kit recorded the
/// delivery in: write through it (`.execute(&mut **tx)`) and the work and
/// the record commit together, or not at all. Do not commit it yourself.
///
/// Implement it with `async fn handle(...)`. The kit calls it concurrently
/// for different objects; two deliveries of one (watch, object) never run at
/// once (the producer sends them one at a time, and the inbox holds a lock
/// on the object's position until the transaction ends).
pub trait Handler: Send + Sync + 'static {
    fn handle(
        &self,
        tx: &mut PgTransaction<'_>,
        delivery: &Delivery,
    ) -> impl Future<Output = Result<Outcome, BoxError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_with_fields_we_do_not_know_still_reads() {
        let body = br#"{"delivery_id":7,"change_id":3,"watch_id":2,"producer":"git",
            "resource":"web-prod","object":"acme/web/merge_requests/42","kind":"opened",
            "sequence":1,"occurred_at":"2026-12-02T10:15:03.118Z","attempt":1,
            "payload":{"head":"9f2c"},"added_later":true}"#;
        let d: Delivery = serde_json::from_slice(body).unwrap();
        assert_eq!(d.object_after("acme/web/merge_requests/"), Some("42"));
        #[derive(Deserialize)]
        struct Mr {
            head: String,
        }
        assert_eq!(d.payload_as::<Mr>().unwrap().head, "9f2c");
    }
}
