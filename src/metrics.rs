//! Prometheus metrics: their names, in one place, and the exporter.
//!
//! The exporter is the recorder of `metrics-exporter-prometheus` with
//! `/metrics` served by an axum route through [`crate::edge`], so that the
//! metrics listener has the same timeouts and caps as the API (the
//! exporter's own listener has none and spins at the open-file limit).
//!
//! Labels are bounded: a consumer service's name at most, never an object,
//! resource or delivery. `docs/metrics.md` documents each metric.
//!
//! The pump records what it does as it does it; the backlog gauges are read
//! from the database by [`backlog`], one pump at a time.
//!
//! Over 400 lines: every metric's name and its `# HELP` line (`describe()`)
//! live here together, so that adding a metric is one edit of this file
//! (the map in `src/lib.rs`); the HELP lines are most of it.

pub mod backlog;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::http::header;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::edge::{self, EdgeLimits};

pub const DELIVERIES: &str = "watchpump_deliveries_total";
pub const DELIVERY_LATENCY: &str = "watchpump_delivery_latency_seconds";
pub const ATTEMPT_DURATION: &str = "watchpump_attempt_duration_seconds";
pub const BACKLOG: &str = "watchpump_backlog";
pub const OLDEST_DUE_AGE: &str = "watchpump_oldest_due_age_seconds";
pub const BACKLOG_LEADER: &str = "watchpump_backlog_leader";
/// How far behind the primary the standby the listings and the backlog
/// gauges read is (`WATCHPUMP_READ_DATABASE_URL`).
pub const READ_REPLICA_LAG: &str = "watchpump_read_replica_lag_seconds";
/// Watches whose deliveries a pause holds, per service (issue 20).
pub const PAUSED_WATCHES: &str = "watchpump_paused_watches";
/// The rate a service may get, all pumps together (issue 20).
pub const RATE_LIMIT: &str = "watchpump_rate_limit";
pub const WAKEUPS: &str = "watchpump_wakeups_total";
pub const LISTENER_RECONNECTS: &str = "watchpump_listener_reconnects_total";
pub const CLAIMED_BATCH_SIZE: &str = "watchpump_claimed_batch_size";
pub const IN_FLIGHT: &str = "watchpump_in_flight";
/// Deliveries this pump claimed ahead and holds, waiting for a request to
/// free up, per consumer service (issue 33).
pub const CLAIMED_AHEAD: &str = "watchpump_claimed_ahead";
/// Claimed deliveries this pump gave back unsent (`watchpump.release()`),
/// by reason: stop, down, window, gone, fence.
pub const CLAIMS_RELEASED: &str = "watchpump_claims_released_total";
/// Payload bytes held by this pump's deliveries in flight.
pub const IN_FLIGHT_BYTES: &str = "watchpump_in_flight_bytes";
/// Claims not made because a global in-flight cap was reached, by cap
/// (`requests` or `bytes`).
pub const CLAIMS_HELD: &str = "watchpump_claims_held_total";
/// Claimed deliveries not sent because the lease no longer covered the
/// request and the hold after it (src/pump/fence.rs), by service.
pub const SENDS_ABANDONED: &str = "watchpump_sends_abandoned_total";
/// Resyncs (src/watches/resync.rs), by `outcome`: started, refused (one
/// was running), truncated (the watch covers more than
/// WATCHPUMP_RESYNC_MAX_OBJECTS); and the replays they queued.
pub const RESYNCS: &str = "watchpump_resyncs_total";
pub const RESYNC_REPLAYS: &str = "watchpump_resync_replays_total";
/// A consumer's self-service writes refused at a bound
/// (`api::limits`), by service and `limit`: rate, ping, redeliver,
/// resync_running, replay_budget, repause.
pub const SELF_SERVICE_REFUSED: &str = "watchpump_self_service_refused_total";
/// Watches refused at the fan-out bounds (`watches::fanout`), by service
/// and `limit`: watches (per object), share, budget.
pub const FANOUT_REFUSED: &str = "watchpump_fanout_refused_total";
/// Consumers' pauses ended at `watchpump.settings.max_pause`, by service.
pub const PAUSES_EXPIRED: &str = "watchpump_pauses_expired_total";
/// Host name lookups of consumers' base URLs, by `result`: ok, error,
/// timeout, refused (too many pending, `destinations::MAX_PENDING_LOOKUPS`).
pub const DNS_LOOKUPS: &str = "watchpump_dns_lookups_total";
pub const BUILD_INFO: &str = "watchpump_build_info";
/// Counted by the operator's warning worker (`operator::notify`).
pub const NOTIFY_WARNINGS: &str = "watchpump_notify_warnings_total";
/// Spans ended but never exported (`telemetry::export`): the queue was
/// full, or the collector failed or timed out.
pub const TRACE_SPANS_DROPPED: &str = "watchpump_trace_spans_dropped_total";
pub const TRACE_SPANS_EXPORTED: &str = "watchpump_trace_spans_exported_total";
/// Trace contexts emit() ignored as malformed (read from the database,
/// `watchpump.trace_context_malformed`, by the backlog leader).
pub const TRACE_CONTEXT_MALFORMED: &str = "watchpump_trace_context_malformed_total";
/// Rows retention removed (`operator::prune`), by `what`: deliveries,
/// failed (deliveries past the failed retention) and changes; a retired
/// day's are the statistics' estimate.
pub const PRUNED: &str = "watchpump_pruned_total";
/// When this pump last finished a round of retention (Unix seconds); 0 on
/// the pumps that never held the operator lock.
pub const PRUNE_LAST_SUCCESS: &str = "watchpump_prune_last_success_timestamp_seconds";
/// Seconds since the end of the oldest day of history retention has not
/// retired yet (kept partitions aside): stays under the retention plus the
/// delivery window plus a day while retention keeps up.
pub const HISTORY_OLDEST_DAY_AGE: &str = "watchpump_history_oldest_day_age_seconds";

/// What [`PRUNED`] counts, in the order of `operator::prune::Pruned`'s
/// fields.
pub const PRUNED_KINDS: &[&str] = &["deliveries", "failed", "changes"];

/// Outcomes counted in [`DELIVERIES`].
pub const OUTCOMES: &[&str] = &[
    "delivered",
    "retry_scheduled",
    "failed",
    "dropped",
    "superseded",
];

/// What [`FANOUT_REFUSED`] counts (`watches::fanout::refusal_limit`).
pub const FANOUT_LIMITS: &[&str] = &["watches", "share", "budget"];

/// Outcomes counted in [`NOTIFY_WARNINGS`].
pub const NOTIFY_OUTCOMES: &[&str] = &["sent", "folded", "logged"];

/// States of [`BACKLOG`], in the order of `watchpump.backlog_counts()`.
pub const BACKLOG_STATES: &[&str] = &["pending", "in_flight", "due", "failed"];

/// Latency buckets: fine at the low end (1 ms from 5 ms), coarse up to an hour.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];
const ATTEMPT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0];

/// How often the recorder drains histograms and drops idle series; the
/// exporter's own listener did it this often too.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Installs the global recorder (once per process) and returns the handle
/// that renders the scrape.
pub fn install_recorder() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(DELIVERY_LATENCY.into()), LATENCY_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(ATTEMPT_DURATION.into()), ATTEMPT_BUCKETS)
        })
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(CLAIMED_BATCH_SIZE.into()), BATCH_BUCKETS)
        })
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    describe();
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    for source in ["notify", "sweep", "reconnect"] {
        metrics::counter!(WAKEUPS, "source" => source).absolute(0);
    }
    metrics::counter!(LISTENER_RECONNECTS).absolute(0);
    for cap in ["requests", "bytes"] {
        metrics::counter!(CLAIMS_HELD, "cap" => cap).absolute(0);
    }
    for reason in ["stop", "down", "window", "gone", "fence"] {
        metrics::counter!(CLAIMS_RELEASED, "reason" => reason).absolute(0);
    }
    metrics::gauge!(IN_FLIGHT_BYTES).set(0.0);
    for outcome in ["started", "refused", "truncated"] {
        metrics::counter!(RESYNCS, "outcome" => outcome).absolute(0);
    }
    metrics::counter!(RESYNC_REPLAYS).absolute(0);
    // Present, at 0, whether traces are on or not: an alert on them needs
    // the series before the first drop.
    for counter in [
        TRACE_SPANS_DROPPED,
        TRACE_SPANS_EXPORTED,
        TRACE_CONTEXT_MALFORMED,
    ] {
        metrics::counter!(counter).increment(0);
    }
    metrics::gauge!(BACKLOG_LEADER).increment(0.0);
    // NaN until the backlog leader reads a standby: "not measured here".
    metrics::gauge!(READ_REPLICA_LAG).set(f64::NAN);
    for what in PRUNED_KINDS {
        metrics::counter!(PRUNED, "what" => *what).absolute(0);
    }
    metrics::gauge!(PRUNE_LAST_SUCCESS).increment(0.0);
    metrics::gauge!(HISTORY_OLDEST_DAY_AGE).increment(0.0);
    Ok(handle)
}

/// The `# HELP` line of every metric: one sentence each, the short form of
/// its row in docs/metrics.md (`tests/metrics.rs` checks that every
/// `watchpump_` family scraped has one).
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        DELIVERIES,
        "What an attempt this pump reported did to its delivery, by consumer service and outcome (delivered, retry_scheduled, failed, dropped, superseded)."
    );
    describe_histogram!(
        DELIVERY_LATENCY,
        "From the change being recorded by emit() to the consumer's 2xx answer, retries included; once per delivered delivery."
    );
    describe_histogram!(
        ATTEMPT_DURATION,
        "Duration of one HTTP attempt, by consumer service and result (2xx, 410, 3xx, 4xx, 5xx, timeout, connect_error)."
    );
    describe_gauge!(
        BACKLOG,
        "Deliveries in the database per consumer service and state (pending, in_flight, due, failed in the last 24 h); read by one pump at a time."
    );
    describe_gauge!(
        OLDEST_DUE_AGE,
        "Seconds since the oldest due delivery of the service became due; 0 when nothing is due."
    );
    describe_gauge!(
        BACKLOG_LEADER,
        "1 on the pump that reads the backlog gauges from the database, 0 on the others."
    );
    describe_gauge!(
        READ_REPLICA_LAG,
        "Seconds the standby that WATCHPUMP_READ_DATABASE_URL names is behind the primary, read by the backlog leader with the gauges; NaN elsewhere."
    );
    describe_gauge!(
        PAUSED_WATCHES,
        "Live watches of the service whose deliveries a pause holds (all of them while the service is paused); read with the backlog gauges."
    );
    describe_gauge!(
        RATE_LIMIT,
        "Deliveries a second the service may get, all pumps together (the lower of the operator's and the consumer's own); 0 when it has no limit."
    );
    describe_counter!(
        WAKEUPS,
        "Wake-up signals of the pump, by source: notify (a committed emit), sweep (the timer), reconnect (the LISTEN connection came back)."
    );
    describe_counter!(
        LISTENER_RECONNECTS,
        "Times the pump re-established its LISTEN connection; the sweep covers NOTIFYs lost meanwhile."
    );
    describe_histogram!(
        CLAIMED_BATCH_SIZE,
        "Deliveries per non-empty claim, all consumer services together."
    );
    describe_gauge!(
        IN_FLIGHT,
        "HTTP requests this pump has in flight now, per consumer service; sum across pumps."
    );
    describe_gauge!(
        CLAIMED_AHEAD,
        "Deliveries this pump claimed one window ahead and holds, leased, waiting for a request to the service to free up."
    );
    describe_counter!(
        CLAIMS_RELEASED,
        "Claimed deliveries this pump did not send, by reason: given back, pending again for any pump (stop; down, the service went down; window, a failure halved it; fence, the lease no longer covered the request), or dropped with their watch (gone, it answered 410)."
    );
    describe_gauge!(
        IN_FLIGHT_BYTES,
        "Payload bytes this pump's deliveries in flight hold, each change's payload once; capped by WATCHPUMP_MAX_IN_FLIGHT_BYTES plus one payload."
    );
    describe_counter!(
        RESYNCS,
        "Resyncs asked for, by outcome: started, refused (one of the watch was running), truncated (the watch covers more than WATCHPUMP_RESYNC_MAX_OBJECTS objects)."
    );
    describe_counter!(
        RESYNC_REPLAYS,
        "Replayed deliveries that resyncs queued, at most one per object a resync looked at."
    );
    describe_counter!(
        SELF_SERVICE_REFUSED,
        "Self-service writes of a consumer refused with a 429, by service and limit: rate (its bucket), ping, redeliver, resync_running, replay_budget, repause."
    );
    describe_counter!(
        FANOUT_REFUSED,
        "Watches refused with a 422 at the fan-out bounds, by service and limit: watches (per object), share (half the budget), budget."
    );
    describe_counter!(
        PAUSES_EXPIRED,
        "Consumers' pauses of watches that reached watchpump.settings.max_pause and were ended, what they held sent, by service."
    );
    describe_counter!(
        SENDS_ABANDONED,
        "Claimed deliveries not sent because the lease no longer covered the request timeout and the hold after it (the claim or the database was slow); each goes again when its lease runs out."
    );
    describe_counter!(
        CLAIMS_HELD,
        "Claims this pump did not make because a global in-flight cap was reached, by cap (requests, bytes)."
    );
    describe_counter!(
        DNS_LOOKUPS,
        "Host name lookups of consumers' base URLs, by result (ok, error, timeout, refused when too many are pending)."
    );
    describe_gauge!(
        BUILD_INFO,
        "Always 1, one series per running pump, labelled with its version."
    );
    describe_counter!(
        NOTIFY_WARNINGS,
        "Warnings about failed deliveries, by consumer service and outcome: sent to the notify service, folded into another warning, or logged."
    );
    describe_counter!(
        TRACE_SPANS_DROPPED,
        "Trace spans this pump ended but did not export: its queue was full (OTEL_BSP_MAX_QUEUE_SIZE), or the collector failed or timed out."
    );
    describe_counter!(
        TRACE_SPANS_EXPORTED,
        "Trace spans this pump exported to the OTLP collector."
    );
    describe_counter!(
        PRUNED,
        "Rows retention removed, by what: deliveries, failed deliveries, changes (a retired day's are estimates)."
    );
    describe_gauge!(
        PRUNE_LAST_SUCCESS,
        "When this pump last finished a round of retention, in Unix seconds; 0 if it never held the operator lock."
    );
    describe_gauge!(
        HISTORY_OLDEST_DAY_AGE,
        "Seconds since the end of the oldest day of history not retired yet: under retention plus delivery window plus a day while retention keeps up."
    );
    describe_counter!(
        TRACE_CONTEXT_MALFORMED,
        "watchpump.traceparent or watchpump.tracestate values emit() ignored as malformed, all producers together; read from the database by one pump."
    );
}

/// `GET /metrics`: the scrape in Prometheus's text format.
pub fn router(handle: PrometheusHandle) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let body = handle.render();
            async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body) }
        }),
    )
}

/// Serves `/metrics` on `listener` through the edge, and keeps the
/// recorder's upkeep running, until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    handle: PrometheusHandle,
    limits: EdgeLimits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let upkeep = {
        let handle = handle.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(UPKEEP_EVERY);
            loop {
                every.tick().await;
                handle.run_upkeep();
            }
        })
    };
    let served = edge::serve(listener, router(handle), limits, "metrics", shutdown).await;
    upkeep.abort();
    served
}

/// Installs the recorder and serves `/metrics` on `addr` for the life of
/// the process, with the edge's default limits; for tests and embedding
/// (`watchpump serve` uses [`install_recorder`] and [`serve`]). Must be
/// called from within a tokio runtime.
pub fn install(addr: SocketAddr) -> Result<(), String> {
    let listener = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .and_then(tokio::net::TcpListener::from_std)
        .map_err(|e| format!("cannot serve metrics on {addr}: {e}"))?;
    let handle = install_recorder()?;
    tokio::spawn(serve(
        listener,
        handle,
        EdgeLimits::default(),
        std::future::pending(),
    ));
    Ok(())
}

/// Creates a service's counters and in-flight gauge without changing them
/// (at zero when new), so that the first failure of a service shows as an
/// increase (alerts use `increase()`) and every service has a line on the
/// dashboard. Safe to call again for a service already in use.
pub fn register_service(service: &str) {
    for outcome in OUTCOMES {
        metrics::counter!(DELIVERIES, "service" => service.to_string(), "outcome" => *outcome)
            .increment(0);
    }
    for outcome in NOTIFY_OUTCOMES {
        metrics::counter!(NOTIFY_WARNINGS, "service" => service.to_string(), "outcome" => *outcome)
            .increment(0);
    }
    metrics::gauge!(IN_FLIGHT, "service" => service.to_string()).increment(0.0);
    metrics::gauge!(CLAIMED_AHEAD, "service" => service.to_string()).increment(0.0);
    metrics::counter!(SENDS_ABANDONED, "service" => service.to_string()).absolute(0);
    metrics::gauge!(PAUSED_WATCHES, "service" => service.to_string()).increment(0.0);
    metrics::gauge!(RATE_LIMIT, "service" => service.to_string()).increment(0.0);
    for limit in crate::api::limits::LIMITS {
        metrics::counter!(SELF_SERVICE_REFUSED,
            "service" => service.to_string(), "limit" => *limit)
        .increment(0);
    }
    for limit in FANOUT_LIMITS {
        metrics::counter!(FANOUT_REFUSED,
            "service" => service.to_string(), "limit" => *limit)
        .increment(0);
    }
    metrics::counter!(PAUSES_EXPIRED, "service" => service.to_string()).increment(0);
}
