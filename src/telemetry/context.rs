//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the
//! `traceparent` and `tracestate` values a change carries from the
//! producer's span to every attempt, and an attempt to its consumer.
//!
//! Parsed here, by hand, rather than through the SDK's propagator: the
//! consumer kit needs it too, and the kit builds only the light
//! `opentelemetry` API crate (no SDK, no exporter). The SQL side
//! (`watchpump.trace_context()` in `sql/functions/0150_emit.sql`) checks the
//! same grammar before a change keeps it.

use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

/// The longest `tracestate` kept (the W3C limit: 32 members of at most 256
/// bytes may be cut to 512 bytes by a vendor); a longer one is dropped, the
/// `traceparent` kept. It bounds what a change and each request carry.
pub const MAX_TRACESTATE_BYTES: usize = 512;

/// A parsed `traceparent`, with the `tracestate` that came with it (if it
/// was well-formed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
    pub tracestate: Option<String>,
}

impl TraceParent {
    /// Parses a `traceparent` header value: `00-<32 hex>-<16 hex>-<2 hex>`,
    /// lower case, neither id all zeros. A later version is read by its
    /// version-00 prefix, as the W3C asks; version `ff` is invalid. A
    /// malformed `tracestate` is left out; a malformed `traceparent` is
    /// `None`.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<TraceParent> {
        let v = traceparent.trim_matches([' ', '\t']);
        if v.len() < 55 || !v.is_char_boundary(55) {
            return None;
        }
        let (head, rest) = v.split_at(55);
        let version = &head[..2];
        if version == "ff" || (version == "00" && !rest.is_empty()) {
            return None;
        }
        if !rest.is_empty() && !rest.starts_with('-') {
            return None;
        }
        let b = head.as_bytes();
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let lower_hex = |s: &str| s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
        let (trace, span, flags) = (&head[3..35], &head[36..52], &head[53..55]);
        if !(lower_hex(version) && lower_hex(trace) && lower_hex(span) && lower_hex(flags)) {
            return None;
        }
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        let mut flag = [0u8; 1];
        hex::decode_to_slice(trace, &mut trace_id).ok()?;
        hex::decode_to_slice(span, &mut span_id).ok()?;
        hex::decode_to_slice(flags, &mut flag).ok()?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            span_id,
            flags: flag[0],
            tracestate: tracestate
                .filter(|s| valid_tracestate(s))
                .map(str::to_string),
        })
    }

    /// The `traceparent` value, version 00.
    pub fn header(&self) -> String {
        // Written by hand: one per attempt, where `format!` cost a
        // percent of the pump's time with traces on.
        fn push_hex(out: &mut String, bytes: &[u8]) {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            for b in bytes {
                out.push(HEX[usize::from(b >> 4)] as char);
                out.push(HEX[usize::from(b & 0xf)] as char);
            }
        }
        let mut out = String::with_capacity(55);
        out.push_str("00-");
        push_hex(&mut out, &self.trace_id);
        out.push('-');
        push_hex(&mut out, &self.span_id);
        out.push('-');
        push_hex(&mut out, &[self.flags]);
        out
    }

    /// The trace id as 32 hex digits, as trace viewers search by it.
    pub fn trace_id_hex(&self) -> String {
        hex::encode(self.trace_id)
    }

    /// The context as OpenTelemetry's remote parent: a span started under
    /// it is the child of the span that sent it.
    pub fn span_context(&self) -> SpanContext {
        let state = self
            .tracestate
            .as_deref()
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        SpanContext::new(
            TraceId::from_bytes(self.trace_id),
            SpanId::from_bytes(self.span_id),
            TraceFlags::new(self.flags),
            true,
            state,
        )
    }

    /// The context of an OpenTelemetry span, if it has one (a span made
    /// with no tracer installed has none).
    pub fn from_span_context(sc: &SpanContext) -> Option<TraceParent> {
        if !sc.is_valid() {
            return None;
        }
        let state = sc.trace_state().header();
        Some(TraceParent {
            trace_id: sc.trace_id().to_bytes(),
            span_id: sc.span_id().to_bytes(),
            flags: sc.trace_flags().to_u8(),
            tracestate: (!state.is_empty() && valid_tracestate(&state)).then_some(state),
        })
    }
}

/// A `tracestate` worth carrying: at most [`MAX_TRACESTATE_BYTES`], printable
/// ASCII, each comma-separated member `key=value` (the W3C grammar, loosely:
/// the key and value character sets are left to the vendors that read them).
pub fn valid_tracestate(s: &str) -> bool {
    s.len() <= MAX_TRACESTATE_BYTES
        && s.bytes().all(|c| (0x20..0x7f).contains(&c))
        && s
            .split(',')
            .map(|m| m.trim_matches([' ', '\t']))
            .filter(|m| !m.is_empty())
            .all(|m| matches!(m.split_once('='), Some((k, v)) if !k.is_empty() && !v.is_empty() && !k.contains(' ')))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_round_trips() {
        let t = TraceParent::parse(GOOD, Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")).unwrap();
        assert_eq!(t.header(), GOOD);
        assert_eq!(t.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.flags, 1);
        assert_eq!(
            t.tracestate.as_deref(),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
        );
        let back = TraceParent::from_span_context(&t.span_context()).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn malformed_traceparents_are_refused() {
        for bad in [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473é-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad, None), None, "{bad:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_prefix() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next";
        assert_eq!(TraceParent::parse(later, None).unwrap().header(), GOOD);
    }

    #[test]
    fn a_malformed_tracestate_is_left_out() {
        let long = "a=".to_string() + &"b".repeat(MAX_TRACESTATE_BYTES);
        for bad in ["novalue", "k=v,\u{1}=x", long.as_str(), "=v"] {
            let t = TraceParent::parse(GOOD, Some(bad)).unwrap();
            assert_eq!(t.tracestate, None, "{bad:?}");
        }
    }
}
