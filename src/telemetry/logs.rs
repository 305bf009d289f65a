//! JSON log lines with the trace id of the span they were written in, so
//! that a log collector links a line to its trace.

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{Format, Json, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The JSON format of `tracing-subscriber`, with `"trace_id"` first when
/// the event is inside a traced span (and nothing added otherwise).
pub struct JsonWithTraceId(pub Format<Json>);

impl<S, N> FormatEvent<S, N> for JsonWithTraceId
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let trace_id = ctx.lookup_current().and_then(|span| {
            span.scope().find_map(|s| {
                s.extensions()
                    .get::<tracing_opentelemetry::OtelData>()
                    .and_then(|d| d.trace_id())
            })
        });
        let Some(trace_id) = trace_id else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => write!(writer, "{{\"trace_id\":\"{trace_id}\",{rest}"),
            None => writer.write_str(&line),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt;

    use super::*;
    use crate::telemetry::export::QueueSettings;
    use crate::telemetry::Telemetry;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_in_a_traced_span_carry_its_trace_id_and_others_are_unchanged() {
        // A collector nobody listens on: nothing here is exported.
        let queue = QueueSettings {
            max_queue_size: 16,
            max_batch_size: 16,
            schedule_delay: std::time::Duration::from_secs(60),
        };
        let telemetry = Telemetry::otlp_http(
            "http://127.0.0.1:9/v1/traces",
            std::time::Duration::from_millis(100),
            queue,
        )
        .unwrap();
        let lines = Lines::default();
        let writer = lines.clone();
        let json = tracing_subscriber::fmt::layer()
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(JsonWithTraceId(
                tracing_subscriber::fmt::format().json().flatten_event(true),
            ))
            .with_writer(move || writer.clone());
        let subscriber = tracing_subscriber::registry()
            .with(telemetry.layer())
            .with(json);
        let trace_id = tracing::subscriber::with_default(subscriber, || {
            tracing::info!("outside");
            let span = tracing::info_span!("inside");
            let trace_id = crate::telemetry::of(&span).unwrap().trace_id_hex();
            span.in_scope(|| tracing::info!(n = 1, "in the span"));
            trace_id
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0].get("trace_id"), None);
        assert_eq!(lines[0]["message"], "outside");
        assert_eq!(lines[1]["trace_id"], trace_id.as_str());
        assert_eq!(lines[1]["message"], "in the span");
        assert_eq!(lines[1]["n"], 1);
    }
}
