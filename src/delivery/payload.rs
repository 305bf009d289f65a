//! A change's payload as its deliveries carry it: the JSON text PostgreSQL
//! printed, held once and shared.
//!
//! A change fanned out to 64 watches is 64 deliveries with one payload.
//! `watchpump.claim()` returns the payload once per change in a claim, the
//! pump wraps it in one [`Payload`], and every delivery's body sends the
//! same bytes (`Message::body_parts`): cloning a `Payload` is a reference
//! count, never a copy. Before, a 10 MB payload fanned out to 64 watches
//! took the pump from 25 MB to 1.38 GB.
//!
//! A payload may also be *metered*: it then adds its size to a counter of
//! payload bytes in flight while any clone of it lives, which is how the
//! pump keeps `WATCHPUMP_MAX_IN_FLIGHT_BYTES` (`pump::claiming`).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

/// See the module documentation.
#[derive(Clone)]
pub struct Payload(Arc<Held>);

struct Held {
    text: Bytes,
    meter: Option<Arc<AtomicU64>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(meter) = &self.meter {
            meter.fetch_sub(self.text.len() as u64, Ordering::Relaxed);
        }
    }
}

impl Payload {
    /// The payload `text` as stored (jsonb printed by PostgreSQL). Anything
    /// that is not JSON (which jsonb cannot hold) becomes `null`, so that a
    /// body is always JSON; checked once here, not per delivery.
    pub fn new(text: String) -> Payload {
        Payload::held(text, None)
    }

    /// [`Payload::new`], counted in `meter` while any clone of it lives.
    pub fn metered(text: String, meter: &Arc<AtomicU64>) -> Payload {
        Payload::held(text, Some(meter.clone()))
    }

    fn held(text: String, meter: Option<Arc<AtomicU64>>) -> Payload {
        let text = if serde_json::from_str::<&serde_json::value::RawValue>(&text).is_ok() {
            Bytes::from(text.into_bytes())
        } else {
            Bytes::from_static(b"null")
        };
        if let Some(meter) = &meter {
            meter.fetch_add(text.len() as u64, Ordering::Relaxed);
        }
        Payload(Arc::new(Held { text, meter }))
    }

    /// The JSON text.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0.text
    }

    /// The JSON text as a shared buffer (no copy).
    pub fn bytes(&self) -> Bytes {
        self.0.text.clone()
    }

    pub fn len(&self) -> usize {
        self.0.text.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.text.is_empty()
    }
}

impl From<String> for Payload {
    fn from(text: String) -> Payload {
        Payload::new(text)
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Payload({} bytes)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_that_is_not_json_is_sent_as_null() {
        assert_eq!(Payload::new("{\"a\": 1}".into()).as_bytes(), b"{\"a\": 1}");
        assert_eq!(Payload::new("not json".into()).as_bytes(), b"null");
    }

    #[test]
    fn a_metered_payload_counts_until_its_last_clone_goes() {
        let meter = Arc::new(AtomicU64::new(0));
        let one = Payload::metered("[1,2,3]".into(), &meter);
        let two = one.clone();
        assert_eq!(meter.load(Ordering::Relaxed), 7);
        drop(one);
        assert_eq!(meter.load(Ordering::Relaxed), 7, "a clone still holds it");
        drop(two);
        assert_eq!(meter.load(Ordering::Relaxed), 0);
    }
}
