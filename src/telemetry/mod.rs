//! OpenTelemetry traces: one trace from the producer's span, through
//! `emit()` and every attempt, into the consumer's handler (docs/operator.md,
//! "Traces").
//!
//! - [`context`]: the W3C `traceparent`/`tracestate` values, parsed and
//!   written (the kit uses it too, to continue the trace).
//! - The rest is the producer's: [`Telemetry::from_env`] builds the
//!   exporter from the standard `OTEL_*` variables, and only when an
//!   endpoint is set; [`export`] is its bounded queue; [`logs`] puts the
//!   trace id in JSON log lines; [`status`] is what `serve` says about them
//!   at start (on or off, where to, the sampler and its ratio, the
//!   resource's `service.name`).
//!
//! Spans are made with `tracing` at the target [`TARGET`]. With no
//! endpoint set, the log filter turns that target off, so a span costs a
//! disabled callsite check and nothing more. The one span per delivery,
//! the attempt's, is made with the SDK's tracer directly ([`attempt`]):
//! with traces off it costs a look-up, with traces on the sampler decides
//! before anything is described.

pub mod context;

with_feature! { "producer":
    pub mod attempt;
    pub mod export;
    pub mod http;
    pub mod logs;
    pub mod status;
}

#[cfg(feature = "producer")]
pub use producer::*;

/// The `tracing` target of every span watchpump makes for traces.
pub const TARGET: &str = "watchpump::trace";

use opentelemetry::trace::TraceContextExt;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use context::TraceParent;

/// The trace context of the current `tracing` span, if traces are on
/// and it has one.
pub fn current() -> Option<TraceParent> {
    of(&tracing::Span::current())
}

/// The trace context of `span`, if traces are on and it has one.
pub fn of(span: &tracing::Span) -> Option<TraceParent> {
    if span.is_disabled() {
        return None;
    }
    TraceParent::from_span_context(span.context().span().span_context())
}

/// Makes `span` a child of `parent` (a context that came from another
/// process); nothing when traces are off.
pub fn set_parent(span: &tracing::Span, parent: &TraceParent) {
    if span.is_disabled() {
        return;
    }
    let cx = opentelemetry::Context::new().with_remote_span_context(parent.span_context());
    let _ = span.set_parent(cx);
}

#[cfg(feature = "producer")]
mod producer {
    use super::export::{QueueProcessor, QueueSettings};
    use super::status::{self, On};
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

    /// The standard variables this reads (the exporter reads the endpoint,
    /// timeout and header ones itself); `serve --help` and docs/operator.md list
    /// them.
    pub const ENV_VARS: &[&str] = &[
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_SERVICE_NAME",
        "OTEL_RESOURCE_ATTRIBUTES",
        "OTEL_TRACES_SAMPLER",
        "OTEL_TRACES_SAMPLER_ARG",
        "OTEL_SDK_DISABLED",
    ];

    /// A layer that does nothing but carry the tracer, where the attempt
    /// spans find it ([`tracer`]), and what it exports to, where `serve`'s
    /// start-up line finds it ([`status::traces`]): the dispatcher that has
    /// it is the one whose spans are exported, in `serve` (global) as in a
    /// test (one thread's).
    pub struct TracerLayer {
        tracer: SdkTracer,
        pub(super) on: On,
    }

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for TracerLayer {}

    /// The tracer of the current dispatcher's traces layer: `None`, and
    /// nothing else done, when traces are off.
    pub fn tracer() -> Option<SdkTracer> {
        tracing::dispatcher::get_default(|d| {
            d.downcast_ref::<TracerLayer>().map(|t| t.tracer.clone())
        })
    }

    /// The tracer and its exporter, when traces are on. Dropping it
    /// without [`Telemetry::shutdown`] loses the spans still queued.
    pub struct Telemetry {
        provider: SdkTracerProvider,
        tracer: SdkTracer,
        on: On,
    }

    impl Telemetry {
        /// Traces are on when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
        /// `OTEL_EXPORTER_OTLP_ENDPOINT` is set (and `OTEL_SDK_DISABLED`
        /// is not `true`): `Ok(None)` otherwise. An endpoint that is not a
        /// URL is an error.
        pub fn from_env() -> Result<Option<Telemetry>, String> {
            let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
            let disabled = std::env::var("OTEL_SDK_DISABLED")
                .is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
            if disabled
                || !(set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                    || set("OTEL_EXPORTER_OTLP_ENDPOINT"))
            {
                return Ok(None);
            }
            use opentelemetry_otlp::WithExportConfig;
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .build()
                .map_err(|e| format!("OpenTelemetry exporter: {e}"))?;
            let endpoint = status::endpoint_from_env();
            Telemetry::with_exporter(exporter, QueueSettings::from_env(), &endpoint).map(Some)
        }

        /// Traces to the OTLP/HTTP collector at `traces_url` (the full URL,
        /// `.../v1/traces`), each export given at most `timeout`: what
        /// [`Telemetry::from_env`] builds, for tests and benchmarks to point
        /// at a collector of their own.
        pub fn otlp_http(
            traces_url: &str,
            timeout: std::time::Duration,
            queue: QueueSettings,
        ) -> Result<Telemetry, String> {
            use opentelemetry_otlp::WithExportConfig;
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(traces_url)
                .with_timeout(timeout)
                .build()
                .map_err(|e| format!("OpenTelemetry exporter: {e}"))?;
            let endpoint = crate::redact::mask_url_credentials(traces_url);
            Telemetry::with_exporter(exporter, queue, &endpoint)
        }

        /// Traces to `exporter` (which sends them to `endpoint`, as the
        /// start-up line says), with the sampler and resource of the
        /// standard variables (`OTEL_SERVICE_NAME` defaults to
        /// `watchpump`). The provider hands the resource to the queue,
        /// which hands it to the exporter ([`QueueProcessor`]).
        pub fn with_exporter<E>(
            exporter: E,
            queue: QueueSettings,
            endpoint: &str,
        ) -> Result<Telemetry, String>
        where
            E: opentelemetry_sdk::trace::SpanExporter + 'static,
        {
            let processor = QueueProcessor::start(exporter, queue)
                .map_err(|e| format!("OpenTelemetry export thread: {e}"))?;
            let resource = status::resource_from_env();
            let (sampler, ratio) = status::sampler_from_env();
            let on = On {
                endpoint: endpoint.to_string(),
                sampler,
                ratio,
                service_name: status::service_name(&resource),
            };
            let provider = SdkTracerProvider::builder()
                .with_span_processor(processor)
                .with_resource(resource)
                .build();
            let tracer = provider.tracer("watchpump");
            Ok(Telemetry {
                provider,
                tracer,
                on,
            })
        }

        /// Where spans go and which are kept ([`status::traces`] reads it
        /// from the installed layer).
        pub fn on(&self) -> &On {
            &self.on
        }

        /// The `tracing` layer that turns spans into OpenTelemetry spans,
        /// and that lends its tracer to the attempt spans
        /// ([`tracer`](super::tracer)).
        pub fn layer<S>(
            &self,
        ) -> tracing_subscriber::layer::Layered<
            TracerLayer,
            tracing_opentelemetry::OpenTelemetryLayer<S, SdkTracer>,
            S,
        >
        where
            S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
        {
            use tracing_subscriber::Layer;
            tracing_opentelemetry::layer()
                .with_tracer(self.tracer.clone())
                .with_tracked_inactivity(false)
                .with_threads(false)
                .with_location(false)
                .and_then(TracerLayer {
                    tracer: self.tracer.clone(),
                    on: self.on.clone(),
                })
        }

        /// Exports every span ended so far (tests call it before reading
        /// what their collector received).
        pub fn flush(&self) {
            if let Err(e) = self.provider.force_flush() {
                tracing::warn!(error = %e, "spans not flushed");
            }
        }

        /// Flushes and stops the exporter.
        pub fn shutdown(self) {
            if let Err(e) = self.provider.shutdown() {
                tracing::warn!(error = %e, "spans not flushed at shutdown");
            }
        }
    }
}
