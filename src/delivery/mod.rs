//! A delivery as its consumer receives it, in one place for the pump that
//! sends it and the panel that shows it (ADR 0021, signed per Standard
//! Webhooks), so that what the panel displays is what was sent.
//!
//! - [`Message`]: the delivery's content as the database hands it out, to
//!   the pump (inside [`Claimed`], what `watchpump.claim()` returns) and to
//!   the panel (`watchpump.message()`).
//! - [`Body`]: the JSON a consumer receives, built from a [`Message`];
//!   sent in parts ([`BodyParts`]) so that a change's deliveries share one
//!   copy of its [`Payload`].
//! - [`request`]: where it goes, its headers with their signatures, and the
//!   request as an operator reads it.
//! - [`outcome`]: what an attempt came to ([`outcome::AttemptResult`]).
//! - [`State`]: where a delivery is, the six words the SQL allows.
//!
//! # Adding a field to the body
//!
//! 1. SQL: an attribute of the type `watchpump.claimed_message` (a
//!    migration: `alter type ... add attribute`), its value in
//!    `watchpump.claim()`'s last select, and the column of
//!    `watchpump.message()` (the panel), both in
//!    `sql/functions/0500_delivery.sql`.
//! 2. Here: the field on [`Message`] and on [`Body`] (whose field order is
//!    the order of the JSON); for the pump, the column in the select of
//!    `db::delivery::claim` and the field of `ClaimedMessage` next to it,
//!    which `pump::store::claim` copies into the message.
//! 3. Consumers: the kit's `Delivery` (`src/kit/delivery.rs`) ignores
//!    fields it does not know; add it there for them to read it.

pub mod payload;
pub mod request;
pub mod state;

#[cfg(feature = "producer")]
pub mod outcome;

pub use payload::Payload;
pub use state::State;

use chrono::{DateTime, Utc};
use serde::Serialize;

/// A delivery's content: everything its body carries but the producer's
/// name. Read by column name, from `watchpump.claim()` (the pump) and
/// `watchpump.message()` (the panel).
#[derive(Debug, Clone)]
pub struct Message {
    pub delivery_id: i64,
    pub change_id: i64,
    pub watch_id: i64,
    /// Which attempt this is (1 for the first).
    pub attempt: i32,
    pub resource: String,
    pub object: String,
    pub kind: String,
    pub sequence: i64,
    pub occurred_at: DateTime<Utc>,
    /// The change's payload as PostgreSQL prints jsonb: the body embeds
    /// exactly this text, shared by the change's deliveries.
    pub payload: Payload,
    /// A replay of the change, queued by a resync (docs/protocol.md,
    /// "Resync"): the body says `"replay": true`.
    pub replay: bool,
}

impl Message {
    /// The exact bytes sent, and signed, as `producer`'s delivery.
    pub fn body(&self, producer: &str) -> Vec<u8> {
        self.body_parts(producer).concat()
    }

    /// The body as sent: the JSON up to the payload, the payload itself
    /// (shared, not copied), and the closing brace.
    pub fn body_parts(&self, producer: &str) -> BodyParts {
        BodyParts {
            head: Body::new(self, producer).head(),
            payload: self.payload.clone(),
        }
    }
}

/// A delivery's body in the three parts it is signed and sent in; their
/// concatenation is the body.
#[derive(Debug, Clone)]
pub struct BodyParts {
    /// Every field of [`Body`] before the payload, and `"payload":`.
    pub head: Vec<u8>,
    pub payload: Payload,
}

impl BodyParts {
    /// What closes the body after the payload.
    pub const TAIL: &'static [u8] = b"}";

    /// The parts, in order.
    pub fn slices(&self) -> [&[u8]; 3] {
        [&self.head, self.payload.as_bytes(), Self::TAIL]
    }

    /// The whole body in one buffer (for the panel and tests; the pump
    /// sends the parts).
    pub fn concat(&self) -> Vec<u8> {
        self.slices().concat()
    }
}

/// A delivery this pump holds a lease on: its [`Message`] and what the pump
/// needs besides to send it.
#[cfg(feature = "producer")]
#[derive(Debug, Clone)]
pub struct Claimed {
    pub message: Message,
    pub service_id: i64,
    /// The service's version: its URL and keys are cached by it.
    pub service_version: i32,
    /// The pump whose lease on this delivery ran out, if one did: it died or
    /// hung mid-send, and this is the delivery sent again.
    pub expired_lease_of: Option<String>,
    /// The W3C trace context of the producer's span that emitted the
    /// change, if it had one: each attempt's span is its child.
    pub trace: Option<crate::telemetry::context::TraceParent>,
}

/// The body every consumer receives, but its payload: [`Body::head`]
/// serialises these fields in this order, and the payload follows as the
/// last field (`"payload":` and the change's JSON text, [`BodyParts`]).
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
    /// Only on a replay, and only as `true`: a live delivery's body is
    /// unchanged.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub replay: bool,
}

impl<'a> Body<'a> {
    pub fn new(m: &'a Message, producer: &'a str) -> Body<'a> {
        Body {
            delivery_id: m.delivery_id,
            change_id: m.change_id,
            watch_id: m.watch_id,
            producer,
            resource: &m.resource,
            object: &m.object,
            kind: &m.kind,
            sequence: m.sequence,
            occurred_at: &m.occurred_at,
            attempt: m.attempt,
            replay: m.replay,
        }
    }

    /// The body's bytes up to its payload: the fields above as a JSON
    /// object, left open, and `,"payload":`.
    pub fn head(&self) -> Vec<u8> {
        let mut head = serde_json::to_vec(self).expect("a delivery body always serialises");
        head.pop(); // the closing brace
        head.extend_from_slice(b",\"payload\":");
        head
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_keeps_its_field_order_and_embeds_the_payload_as_stored() {
        let m = Message {
            delivery_id: 7,
            change_id: 3,
            watch_id: 2,
            attempt: 1,
            resource: "web".into(),
            object: "acme/web".into(),
            kind: "push".into(),
            sequence: 4,
            occurred_at: DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
            payload: Payload::new("{\"b\": 1, \"a\": 2}".into()),
            replay: false,
        };
        assert_eq!(
            String::from_utf8(m.body("git")).unwrap(),
            r#"{"delivery_id":7,"change_id":3,"watch_id":2,"producer":"git","resource":"web","object":"acme/web","kind":"push","sequence":4,"occurred_at":"2023-11-14T22:13:20Z","attempt":1,"payload":{"b": 1, "a": 2}}"#
        );
        // A resync's replay says so at the top level, before the payload.
        let replay = Message { replay: true, ..m };
        assert_eq!(
            String::from_utf8(replay.body("git")).unwrap(),
            r#"{"delivery_id":7,"change_id":3,"watch_id":2,"producer":"git","resource":"web","object":"acme/web","kind":"push","sequence":4,"occurred_at":"2023-11-14T22:13:20Z","attempt":1,"replay":true,"payload":{"b": 1, "a": 2}}"#
        );
    }
}
