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
