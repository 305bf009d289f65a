//! Whether traces are on, where they go and how many are kept, as `serve`
//! says once at start ([`traces`]): an operator who set a variable wrong
//! (or none) learns it from the first lines, not from a collector that
//! stays empty. Read from the same standard variables the exporter and the
//! SDK read, the way they read them.

use opentelemetry::Key;
use opentelemetry_sdk::Resource;

/// Traces as this process has them.
#[derive(Debug, Clone, PartialEq)]
pub enum Traces {
    On(On),
    /// Why they are off, and what turns them on.
    Off(String),
}

/// Where spans go and which are kept.
#[derive(Debug, Clone, PartialEq)]
pub struct On {
    /// The collector's traces URL (credentials masked).
    pub endpoint: String,
    /// The SDK's sampler, as `OTEL_TRACES_SAMPLER` names it.
    pub sampler: String,
    /// The share of root traces kept, 0 to 1; a `parentbased_` sampler
    /// follows a sampled parent's decision instead.
    pub ratio: f64,
    /// `service.name` of the resource every span is reported under.
    pub service_name: String,
}

/// What the current dispatcher's traces layer says, or why there is none.
pub fn traces() -> Traces {
    match tracing::dispatcher::get_default(|d| {
        d.downcast_ref::<super::TracerLayer>().map(|t| t.on.clone())
    }) {
        Some(on) => Traces::On(on),
        None => Traces::Off(off_reason()),
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// Why no traces layer is installed.
fn off_reason() -> String {
    let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if disabled {
        "OTEL_SDK_DISABLED is true".into()
    } else if var("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
        && var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
    {
        "no OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set; \
         set one to export spans to that collector (docs/operator.md, \"Traces\")"
            .into()
    } else {
        "this process installed no traces layer (the watchpump binary does, when an endpoint is set)"
            .into()
    }
}

/// The traces URL the OTLP/HTTP exporter posts to: the traces variable as
/// it is, else the general one with `/v1/traces`, else its default.
pub fn endpoint_from_env() -> String {
    let url = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").unwrap_or_else(|| {
        let base =
            var("OTEL_EXPORTER_OTLP_ENDPOINT").unwrap_or_else(|| "http://localhost:4318".into());
        format!("{}/v1/traces", base.trim_end_matches('/'))
    });
    crate::redact::mask_url_credentials(&url)
}

/// The sampler the SDK builds from `OTEL_TRACES_SAMPLER` and
/// `OTEL_TRACES_SAMPLER_ARG`, and its ratio (`opentelemetry_sdk`'s
/// `Config::default` reads them so: an unknown name falls back to
/// `parentbased_always_on`, a missing or bad ratio to 1).
pub fn sampler_from_env() -> (String, f64) {
    let ratio = || {
        var("OTEL_TRACES_SAMPLER_ARG")
            .and_then(|r| r.parse::<f64>().ok())
            .map_or(1.0, |r| r.clamp(0.0, 1.0))
    };
    let name = std::env::var("OTEL_TRACES_SAMPLER").ok();
    match name.as_deref() {
        Some(n @ ("always_on" | "parentbased_always_on")) => (n.into(), 1.0),
        Some(n @ ("always_off" | "parentbased_always_off")) => (n.into(), 0.0),
        Some(n @ ("traceidratio" | "parentbased_traceidratio")) => (n.into(), ratio()),
        Some(other) => (
            format!("parentbased_always_on (OTEL_TRACES_SAMPLER {other:?} is not one it knows)"),
            1.0,
        ),
        None => ("parentbased_always_on".into(), 1.0),
    }
}

/// The resource spans are reported under: the SDK's (its detectors read
/// `OTEL_RESOURCE_ATTRIBUTES`), with `service.name` from
/// `OTEL_SERVICE_NAME`, else from the attributes, else `watchpump` (the
/// SDK's own default is `unknown_service`).
pub fn resource_from_env() -> Resource {
    let detected = Resource::builder().build();
    let name = var("OTEL_SERVICE_NAME")
        .or_else(|| {
            detected
                .get(&Key::from_static_str("service.name"))
                .map(|v| v.to_string())
                .filter(|n| !n.starts_with("unknown_service"))
        })
        .unwrap_or_else(|| "watchpump".into());
    Resource::builder().with_service_name(name).build()
}

/// `service.name` of `resource`.
pub fn service_name(resource: &Resource) -> String {
    resource
        .get(&Key::from_static_str("service.name"))
        .map(|v| v.to_string())
        .unwrap_or_default()
}
