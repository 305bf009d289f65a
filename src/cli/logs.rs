//! The logs and traces of every `watchpump` subcommand: text or JSON lines
//! on stderr, and spans exported when an OTLP endpoint is set.

use crate::telemetry;

/// Logs to stderr, as text (ANSI colours only on a terminal, and never with
/// NO_COLOR set) or as one JSON object per line (with the trace id when the
/// line was written inside a traced span). RUST_LOG filters them.
///
/// Traces are exported when an OTLP endpoint is set
/// ([`telemetry::Telemetry::from_env`]); otherwise the spans' target is
/// filtered out, so they cost nothing.
pub(super) fn init_logs(format: &str) -> std::result::Result<Option<telemetry::Telemetry>, String> {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let telemetry = telemetry::Telemetry::from_env()?;
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx::postgres::notice=warn"));
    // The spans' target: off without an endpoint, so that they cost
    // nothing; on with one, whatever RUST_LOG's level for the rest (the
    // log level must not decide what is traced).
    let level = if telemetry.is_some() { "info" } else { "off" };
    filter = filter.add_directive(
        format!("{}={level}", telemetry::TARGET)
            .parse()
            .expect("a valid directive"),
    );
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = if format == "json" {
        logs.fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(telemetry::logs::JsonWithTraceId(
                tracing_subscriber::fmt::format().json().flatten_event(true),
            ))
            .boxed()
    } else {
        let colours = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        let logs = logs.with_ansi(colours);
        // With traces on, the text lines stay as they are with traces off:
        // the spans made only for traces are kept from this layer, which
        // would otherwise format every field of each of them (the JSON
        // layer sees them, for their trace id).
        if telemetry.is_some() {
            logs.with_filter(tracing_subscriber::filter::filter_fn(|m| {
                m.target() != telemetry::TARGET
            }))
            .boxed()
        } else {
            logs.boxed()
        }
    };
    let traces = telemetry.as_ref().map(|t| t.layer());
    tracing_subscriber::registry()
        .with(filter)
        .with(traces)
        .with(logs)
        .init();
    Ok(telemetry)
}
