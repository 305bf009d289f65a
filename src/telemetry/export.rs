//! Spans to the collector, off the deliveries' path: a bounded queue, and
//! one thread of its own that sends them in batches over OTLP/HTTP.
//!
//! The SDK's batch processor would do most of this, but it counts the spans
//! it drops only in a private counter; here every drop is
//! [`SPANS_DROPPED`](crate::metrics::TRACE_SPANS_DROPPED), which is what an
//! operator watches to know traces are incomplete.
//!
//! Bounds (docs/operator.md, "Traces"): the queue holds `OTEL_BSP_MAX_QUEUE_SIZE`
//! spans (2,048 unless set); a span ended while it is full is dropped and
//! counted, never waited for. One export at a time, of at most
//! `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` spans (512), each given at most
//! [`EXPORT_TIMEOUT`]: a collector that is down or hangs costs the pump a
//! full queue and a counter, nothing else (tests/traces.rs,
//! `a_collector_down_or_hanging_does_not_slow_deliveries`).

use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use tokio::sync::{mpsc, Notify};

use crate::metrics as m;

/// The longest one export may take, whatever the collector does
/// (`OTEL_EXPORTER_OTLP_TIMEOUT` bounds the HTTP request itself).
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The queue's sizes and timing, from the standard `OTEL_BSP_*` variables.
#[derive(Debug, Clone, Copy)]
pub struct QueueSettings {
    pub max_queue_size: usize,
    pub max_batch_size: usize,
    pub schedule_delay: Duration,
}

impl QueueSettings {
    pub fn from_env() -> QueueSettings {
        let read = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|v| *v > 0)
                .unwrap_or(default)
        };
        QueueSettings {
            max_queue_size: read("OTEL_BSP_MAX_QUEUE_SIZE", 2048).min(1 << 20) as usize,
            max_batch_size: read("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512).min(1 << 16) as usize,
            schedule_delay: Duration::from_millis(read("OTEL_BSP_SCHEDULE_DELAY", 5000)),
        }
    }
}

enum Control {
    /// Export everything queued, then answer.
    Flush(std_mpsc::Sender<()>),
    /// What the spans are reported under (`service.name` and the rest),
    /// from the provider: the exporter puts it on every request. Without
    /// it the collector got every span with an empty resource, whatever
    /// `OTEL_SERVICE_NAME` said.
    Resource(Resource),
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Control::Flush(_) => f.write_str("Flush"),
            Control::Resource(r) => write!(f, "Resource({r:?})"),
        }
    }
}

/// How many queued spans get room at start: the default queue whole
/// (about 700 KB); a larger `OTEL_BSP_MAX_QUEUE_SIZE` grows past it only
/// if a collector falls that far behind.
const PREALLOCATED_SPANS: usize = 2048;

/// The spans ended and not yet exported. A ring buffer under a lock
/// rather than a channel: a span ended costs a push, and wakes the export
/// thread only when a batch is full (a channel woke it for every span, a
/// futex call and a context switch per delivery on the pump's cores).
#[derive(Debug)]
struct Queue {
    spans: Mutex<std::collections::VecDeque<SpanData>>,
    /// A batch is full.
    full: Notify,
    settings: QueueSettings,
}

impl Queue {
    /// At most a batch of the oldest spans queued. The queue keeps its
    /// room (allocated once, for the whole queue): a span ended never
    /// grows it, which moved up to the whole queue on a pump's thread.
    fn take_batch(&self) -> Vec<SpanData> {
        let mut spans = self.spans.lock().unwrap();
        let n = spans.len().min(self.settings.max_batch_size);
        spans.drain(..n).collect()
    }
}

/// A [`SpanProcessor`] that queues sampled spans for `export_loop()`.
#[derive(Debug)]
pub struct QueueProcessor {
    queue: Arc<Queue>,
    control: mpsc::UnboundedSender<Control>,
}

impl QueueProcessor {
    /// Starts the export thread for `exporter`.
    pub fn start<E>(exporter: E, settings: QueueSettings) -> std::io::Result<QueueProcessor>
    where
        E: SpanExporter + 'static,
    {
        let queue = Arc::new(Queue {
            spans: Mutex::new(std::collections::VecDeque::with_capacity(
                settings.max_queue_size.min(PREALLOCATED_SPANS),
            )),
            full: Notify::new(),
            settings,
        });
        let (control, control_rx) = mpsc::unbounded_channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let exported = queue.clone();
        std::thread::Builder::new()
            .name("watchpump-otlp".into())
            .spawn(move || {
                runtime.block_on(export_loop(exporter, exported, control_rx));
            })?;
        Ok(QueueProcessor { queue, control })
    }

    fn flush_within(&self, timeout: Duration) -> OTelSdkResult {
        let (tx, rx) = std_mpsc::channel();
        self.control
            .send(Control::Flush(tx))
            .map_err(|_| OTelSdkError::AlreadyShutdown)?;
        rx.recv_timeout(timeout)
            .map_err(|_| OTelSdkError::Timeout(timeout))
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        let settings = &self.queue.settings;
        let mut spans = self.queue.spans.lock().unwrap();
        if spans.len() >= settings.max_queue_size {
            drop(spans);
            metrics::counter!(m::TRACE_SPANS_DROPPED).increment(1);
            return;
        }
        spans.push_back(span);
        let full = spans.len() == settings.max_batch_size;
        drop(spans);
        if full {
            self.queue.full.notify_one();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.flush_within(EXPORT_TIMEOUT + Duration::from_secs(1))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.flush_within(timeout)
    }

    /// The provider calls this once, when it is built, before any span
    /// exists; the export thread hands it to the exporter before it
    /// exports anything (its loop reads control messages first).
    fn set_resource(&mut self, resource: &Resource) {
        let _ = self.control.send(Control::Resource(resource.clone()));
    }
}

/// Exports what is queued, a batch at a time, when a batch is full, every
/// [`QueueSettings::schedule_delay`], and when flushed; ends (after a last
/// export) when the processor is dropped.
async fn export_loop<E: SpanExporter>(
    mut exporter: E,
    queue: Arc<Queue>,
    mut control: mpsc::UnboundedReceiver<Control>,
) {
    let mut tick = tokio::time::interval(queue.settings.schedule_delay);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Control first: the resource, sent before the first span, reaches
        // the exporter before the first export.
        let done = tokio::select! {
            biased;
            control = control.recv() => match control {
                Some(Control::Flush(done)) => Some(Some(done)),
                Some(Control::Resource(resource)) => {
                    exporter.set_resource(&resource);
                    continue;
                }
                None => Some(None),
            },
            () = queue.full.notified() => None,
            _ = tick.tick() => None,
        };
        loop {
            let batch = queue.take_batch();
            if batch.is_empty() {
                break;
            }
            export(&exporter, batch).await;
        }
        match done {
            None => {}
            Some(Some(flushed)) => {
                let _ = flushed.send(());
            }
            Some(None) => return,
        }
    }
}

async fn export<E: SpanExporter>(exporter: &E, spans: Vec<SpanData>) {
    let count = spans.len() as u64;
    let result = tokio::time::timeout(EXPORT_TIMEOUT, exporter.export(spans)).await;
    match result {
        Ok(Ok(())) => metrics::counter!(m::TRACE_SPANS_EXPORTED).increment(count),
        Ok(Err(e)) => {
            metrics::counter!(m::TRACE_SPANS_DROPPED).increment(count);
            tracing::debug!(error = %e, spans = count, "span export failed");
        }
        Err(_) => {
            metrics::counter!(m::TRACE_SPANS_DROPPED).increment(count);
            tracing::debug!(spans = count, "span export timed out");
        }
    }
}
