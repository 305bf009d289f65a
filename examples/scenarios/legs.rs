//! `make bench SCENARIOS=trickle-legs` (issue 18): where a trickle
//! delivery's time goes, from the producer's COMMIT to the consumer.
//!
//! The trickle of `trickle` (200 changes a second, each in its own
//! transaction), for 10 s, with traces on at 100%: each change is emitted
//! under a sampled traceparent of its own, so the pump's attempt span
//! (`POST`) of its delivery carries the change's trace id. A collector in
//! this process keeps every span's name, trace id, start and end (the
//! pump's clock is this host's wall clock, as the producer's and the
//! consumer's are). Each delivery's time then splits into three legs:
//!
//! - wake: the producer's COMMIT returned → the pump's claim turn starts
//!   (`watchpump.pump.turn`, the last one that claimed something to start
//!   before the attempt):
//!   the NOTIFY, the listener connection, and the claim loop waking;
//! - claim: the turn's span, from its start to its end: `claim()`'s round
//!   trip through the pool (sqlx tests a connection as it hands it out,
//!   one more round trip), with its durable commit (the lease's fsync),
//!   and the dispatch of a send task;
//! - dispatch: the turn ends → the attempt starts: the send task is
//!   scheduled and checks its fence;
//! - send: the attempt starts → the consumer's handler sees the body:
//!   the HTTP request on loopback.
//!
//! And, from pg_stat_statements, `claim()`'s execution time per call in
//! PostgreSQL (the part of "claim" that is SQL; the rest is the commit and
//! the round trips). Traces cost the pump a little (BENCHMARKS.md, issue
//! 21), so the total here runs a little above `trickle`'s.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use prost::Message;
use serde_json::json;

use super::{percentile, Bench, Consumer, Outcome};

const RATE: u64 = 200;
const SECONDS: u64 = 10;

/// A span as the collector keeps it.
struct SpanTimes {
    name: String,
    trace_id: u128,
    start_ns: u64,
    end_ns: u64,
    /// A turn's `watchpump.claimed`.
    claimed: i64,
}

type Spans = Arc<Mutex<Vec<SpanTimes>>>;

pub async fn legs(b: Bench) -> Outcome {
    let spans: Spans = Arc::default();
    let endpoint = collector(spans.clone());
    let consumer = Consumer::start(1).await;
    let services = b.services(&consumer).await;
    b.watch(services[0], "acme/").await;
    let pump = b.pump(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "1.0"),
    ]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    b.db_time_reset().await;

    // change id -> (trace id, COMMIT returned)
    let mut committed: HashMap<i64, (u128, SystemTime)> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
    let total = (RATE * SECONDS) as usize;
    for n in 0..total {
        tick.tick().await;
        let trace_id = rand::random::<u128>() | 1;
        let mut tx = b.pool.begin().await.unwrap();
        let id = super::traces::emit_under(
            &mut tx,
            &format!("acme/repo/refs/heads/b{}", n % 500),
            &super::traces::traceparent_of(trace_id, true),
        )
        .await;
        tx.commit().await.unwrap();
        committed.insert(id, (trace_id, SystemTime::now()));
    }
    let all = consumer.wait_for(total, Duration::from_secs(30)).await;
    let (claim_us, claim_calls): (f64, i64) = sqlx::query_as(
        "select coalesce(sum(s.total_exec_time) / nullif(sum(s.calls), 0), 0)::float8 * 1000,
                coalesce(sum(s.calls), 0)::int8
         from pg_stat_statements s
         where s.dbid = (select oid from pg_database where datname = current_database())
           and s.toplevel and s.query ~ 'watchpump\\.claim\\('",
    )
    .fetch_one(&b.pool)
    .await
    .unwrap();
    // The pump exports its spans in batches, the last ones as it stops.
    pump.stop();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while attempts(&spans) < total && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let legs = split(&spans, &committed, &consumer);
    let p50_p99 = |v: &[f64]| (percentile(v, 0.5), percentile(v, 0.99));
    let (total_p50, total_p99) = p50_p99(&legs.total);
    let parts = [
        ("wake", &legs.wake),
        ("claim", &legs.claim),
        ("dispatch", &legs.dispatch),
        ("send", &legs.send),
    ];
    let mut json = json!({
        "rate_per_s": RATE, "seconds": SECONDS, "changes": total, "split": legs.total.len(),
        "total_ms": {"p50": total_p50, "p99": total_p99},
        "claim_exec_us_per_call": claim_us, "claim_calls": claim_calls,
    });
    let mut said = Vec::new();
    for (name, v) in parts {
        let (p50, p99) = p50_p99(v);
        said.push(format!("{name} p50 {p50:.2} (p99 {p99:.2})"));
        json[format!("{name}_ms")] = json!({"p50": p50, "p99": p99});
    }
    let line = format!(
        "{RATE}/s for {SECONDS}s, traces on: commit->consumer p50 {total_p50:.2} ms (p99 {total_p99:.2}) = {} ms; claim() executes {claim_us:.0} µs a call in PostgreSQL ({claim_calls} calls for {total} deliveries); {} of {total} split{}",
        said.join(" + "),
        legs.total.len(),
        if all { "" } else { ", INCOMPLETE" },
    );
    Outcome { line, json }
}

/// Each leg's milliseconds, sorted, over the deliveries whose spans came.
struct Legs {
    wake: Vec<f64>,
    claim: Vec<f64>,
    dispatch: Vec<f64>,
    send: Vec<f64>,
    total: Vec<f64>,
}

fn split(spans: &Spans, committed: &HashMap<i64, (u128, SystemTime)>, consumer: &Consumer) -> Legs {
    let spans = spans.lock().unwrap();
    let mut turns: Vec<(u64, u64)> = spans
        .iter()
        .filter(|s| s.name == "watchpump.pump.turn" && s.claimed > 0)
        .map(|s| (s.start_ns, s.end_ns))
        .collect();
    turns.sort_unstable();
    let attempt_start: HashMap<u128, u64> = spans
        .iter()
        .filter(|s| s.name == "POST")
        .map(|s| (s.trace_id, s.start_ns))
        .collect();
    let ns = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_nanos() as i64;
    let ms = |from: i64, to: i64| (to - from) as f64 / 1e6;
    let mut legs = Legs {
        wake: vec![],
        claim: vec![],
        dispatch: vec![],
        send: vec![],
        total: vec![],
    };
    for (change, _, arrived) in consumer.state.arrivals.lock().unwrap().iter() {
        let Some((trace_id, at)) = committed.get(change) else {
            continue;
        };
        let Some(&attempt) = attempt_start.get(trace_id) else {
            continue;
        };
        // The turn that claimed it: the last to claim something and start
        // before its attempt (the loop may start its next turn first).
        let i = turns.partition_point(|&(t, _)| t <= attempt);
        if i == 0 {
            continue;
        }
        let (commit, turn, turn_end, attempt, arrived) = (
            ns(*at),
            turns[i - 1].0 as i64,
            turns[i - 1].1 as i64,
            attempt as i64,
            ns(*arrived),
        );
        legs.wake.push(ms(commit, turn));
        legs.claim.push(ms(turn, turn_end));
        legs.dispatch.push(ms(turn_end, attempt));
        legs.send.push(ms(attempt, arrived));
        legs.total.push(ms(commit, arrived));
    }
    for v in [
        &mut legs.wake,
        &mut legs.claim,
        &mut legs.dispatch,
        &mut legs.send,
        &mut legs.total,
    ] {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    }
    legs
}

fn attempts(spans: &Spans) -> usize {
    spans
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.name == "POST")
        .count()
}

/// An OTLP/HTTP collector on loopback, on a thread of its own (as in
/// `traces`), that keeps each span's name, trace id, start and end.
fn collector(spans: Spans) -> String {
    super::traces::serve_apart(
        Router::new()
            .route("/v1/traces", post(receive))
            .with_state(spans),
    )
}

async fn receive(State(spans): State<Spans>, body: Bytes) -> axum::http::StatusCode {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return axum::http::StatusCode::BAD_REQUEST;
    };
    let mut kept = spans.lock().unwrap();
    for span in request
        .resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .flat_map(|s| &s.spans)
    {
        let trace_id = <[u8; 16]>::try_from(span.trace_id.as_slice())
            .map(u128::from_be_bytes)
            .unwrap_or(0);
        // The field is made 0 and recorded later: the largest value is
        // the recorded one, however the exporter lists the two.
        let claimed = span
            .attributes
            .iter()
            .filter(|a| a.key == "watchpump.claimed")
            .filter_map(|a| match a.value.as_ref()?.value.as_ref()? {
                any_value::Value::IntValue(n) => Some(*n),
                any_value::Value::StringValue(n) => n.parse().ok(),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        kept.push(SpanTimes {
            name: span.name.clone(),
            trace_id,
            start_ns: span.start_time_unix_nano,
            end_ns: span.end_time_unix_nano,
            claimed,
        });
    }
    axum::http::StatusCode::OK
}
