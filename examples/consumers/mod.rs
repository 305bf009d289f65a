//! The three consumers of ADR 0021, each a [`Handler`] on the consumer kit
//! (`watchpump::kit`) with the tables it works on and the watch it needs.
//!
//! They live here, outside the library, because they are examples, not
//! API; both the example binaries (`examples/deploy.rs`, ...) and the
//! end-to-end test (`tests/kit/examples.rs`) include this folder with
//! `#[path]`, so the test checks exactly the code the examples run.
//! `run.rs` (the binaries only) is the start-up around them.
#![allow(dead_code)]

pub mod deploy;
pub mod docs_draft;
pub mod preview;

use watchpump::kit::{Handler, WatchRequest};

/// ` (trace <id>)` when traces are exported (an `OTEL_EXPORTER_OTLP_*`
/// endpoint set; `run.rs` installs the layer): the kit runs the handler in
/// a span under the producer's attempt, so this is the trace that began
/// with the producer's change, and the handler's work is in it.
pub fn trace_note() -> String {
    watchpump::telemetry::current()
        .map(|t| format!(" (trace {})", t.trace_id_hex()))
        .unwrap_or_default()
}

/// One example consumer: who it is, what it stores, what it follows.
pub struct Consumer<H: Handler> {
    /// Its service name at the producer.
    pub service: &'static str,
    /// Its own database, created on the producer's cluster for the example.
    pub database: &'static str,
    /// Where it listens unless `WATCHPUMP_EXAMPLE_LISTEN` says otherwise.
    pub listen: &'static str,
    /// Its own tables (idempotent SQL, run on every start).
    pub schema: &'static str,
    pub watch: WatchRequest,
    pub handler: H,
}
