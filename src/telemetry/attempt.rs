//! The span of one delivery attempt, made with the OpenTelemetry SDK's
//! tracer directly rather than through `tracing`: an attempt is the one
//! span per delivery, on the pump's hot path, and the `tracing` route
//! costs there what nothing else does (a registry slot, every field
//! visited into a builder and formatted as text, an enter and an exit at
//! every poll of the request, and the sampling decision only when it
//! ends, after all of that was paid for).
//!
//! Here, with traces off (no traces layer installed), an attempt costs
//! one look-up of the dispatcher and nothing else. With traces on, the
//! sampler decides first; a span it drops (an unsampled producer
//! context, or a root outside the ratio) gets no attribute, no event and
//! no export: only its context, which the request carries on
//! (`traceparent` with the sampled flag off).

use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};

use super::context::TraceParent;

/// How many attributes an attempt span is given room for at once (the
/// HTTP client conventions' and `watchpump.*`: 13 today).
pub const ATTRIBUTES: usize = 16;

/// A CLIENT span, or nothing when traces are off.
pub struct ClientSpan(Option<opentelemetry_sdk::trace::Span>);

impl ClientSpan {
    /// Starts the span `name`, a child of `parent` (a root without one),
    /// if the current dispatcher has a traces layer
    /// ([`super::Telemetry::layer`]). `attributes` is called only if the
    /// sampler keeps the span.
    pub fn start(
        name: &'static str,
        parent: Option<&TraceParent>,
        attributes: impl FnOnce(&mut Vec<KeyValue>),
    ) -> ClientSpan {
        let Some(tracer) = super::tracer() else {
            return ClientSpan(None);
        };
        let cx = match parent {
            Some(p) => Context::new().with_remote_span_context(p.span_context()),
            None => Context::new(),
        };
        let mut builder = tracer.span_builder(name).with_kind(SpanKind::Client);
        // Room for every attribute at once when the span is likely kept
        // (a sampled parent, or a root the ratio decides): the SDK pushes
        // them one by one into the builder's vector, which grew three
        // times from empty.
        if parent.is_none_or(|p| p.flags & 1 == 1) {
            builder = builder.with_attributes(Vec::with_capacity(ATTRIBUTES));
        }
        let mut span = tracer.build_with_context(builder, &cx);
        if opentelemetry::trace::Span::is_recording(&span) {
            let mut attrs = Vec::with_capacity(ATTRIBUTES);
            attributes(&mut attrs);
            opentelemetry::trace::Span::set_attributes(&mut span, attrs);
        }
        ClientSpan(Some(span))
    }

    /// Whether the span is kept (and so worth describing).
    pub fn is_recording(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(opentelemetry::trace::Span::is_recording)
    }

    /// Its own context, for the request's `traceparent`: `None` when
    /// traces are off. A span the sampler dropped still has one (the
    /// producer's trace, a span id of its own, not sampled).
    pub fn context(&self) -> Option<TraceParent> {
        let span = self.0.as_ref()?;
        TraceParent::from_span_context(opentelemetry::trace::Span::span_context(span))
    }

    /// Sets `attribute`, if the span is kept.
    pub fn set_attribute(&mut self, attribute: KeyValue) {
        if let Some(span) = self.0.as_mut() {
            opentelemetry::trace::Span::set_attribute(span, attribute);
        }
    }

    /// Marks the span failed.
    pub fn set_error(&mut self) {
        if let Some(span) = self.0.as_mut() {
            opentelemetry::trace::Span::set_status(span, Status::error(""));
        }
    }

    /// An event `name` with `attributes` (and the `level` and `target` a
    /// `tracing` event in a traced span carries), if the span is kept.
    pub fn add_event(&mut self, name: &'static str, attributes: Vec<KeyValue>) {
        let Some(span) = self
            .0
            .as_mut()
            .filter(|s| opentelemetry::trace::Span::is_recording(*s))
        else {
            return;
        };
        let mut attrs = Vec::with_capacity(attributes.len() + 2);
        attrs.push(KeyValue::new("level", "INFO"));
        attrs.push(KeyValue::new("target", super::TARGET));
        attrs.extend(attributes);
        opentelemetry::trace::Span::add_event(span, name, attrs);
    }

    /// Ends the span now (dropping it does the same).
    pub fn end(self) {}
}
