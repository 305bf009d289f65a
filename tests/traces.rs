//! OpenTelemetry traces (issue 21) with the real exporter (OTLP over
//! HTTP/protobuf) against a real collector on loopback that decodes what it
//! receives: one trace from the producer's span through `emit()` and each
//! attempt into the kit's handler; a collector that is down or hangs; a
//! malformed `watchpump.traceparent`.
//!
//! Each test installs its own `tracing` subscriber for its thread (the
//! tests' runtimes are single-threaded, so the pump, the API and the kit
//! all run under it), exporting to a collector of its own.

#[path = "common/mod.rs"]
mod common;
#[path = "kit/support.rs"]
#[allow(dead_code)]
mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;
use watchpump::kit::{BoxError, Delivery, Handler, Outcome, PgTransaction, WatchRequest};
use watchpump::telemetry::export::QueueSettings;
use watchpump::telemetry::Telemetry;

use common::{
    all, delivery_of, operator_config, pump_config, AppServer, Receiver, RunningPump, TestDb,
};
use support::{Consumer, Work, WORK_SCHEMA};

const LIMIT: Duration = Duration::from_secs(30);
const MAIN: &str = "acme/web/refs/heads/main";

/// One span as the collector decoded it.
#[derive(Debug, Clone)]
struct Span {
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    /// OTLP's SpanKind: 2 server, 3 client.
    kind: i32,
    /// OTLP's status code: 2 is error.
    status: i32,
    attributes: HashMap<String, String>,
    events: Vec<String>,
    start_ns: u64,
    end_ns: u64,
    /// `service.name` of the resource the span came under.
    service: String,
}

/// A real OTLP/HTTP collector: `POST /v1/traces` with a protobuf
/// `ExportTraceServiceRequest`, decoded and kept; or, told to hang, one
/// that takes requests and never answers.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
    hang: Arc<std::sync::atomic::AtomicBool>,
    requests: Arc<AtomicUsize>,
}

impl Collector {
    /// Serves on a thread and runtime of its own: `Telemetry::flush` blocks
    /// the test's (single) runtime thread until the collector answered.
    async fn start() -> (Collector, String) {
        let collector = Collector::default();
        let app = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(collector.clone());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, app).await.unwrap();
            });
        });
        (collector, format!("http://{addr}/v1/traces"))
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    fn of_trace(&self, trace_id: &str) -> Vec<Span> {
        self.spans()
            .into_iter()
            .filter(|s| s.trace_id == trace_id)
            .collect()
    }
}

async fn receive(State(c): State<Collector>, body: Bytes) -> axum::http::StatusCode {
    c.requests.fetch_add(1, Ordering::SeqCst);
    if c.hang.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
    let mut spans = c.spans.lock().unwrap();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for s in scope.spans {
                let attributes = s
                    .attributes
                    .iter()
                    .map(|kv| {
                        (
                            kv.key.clone(),
                            text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
                        )
                    })
                    .collect();
                spans.push(Span {
                    trace_id: hex::encode(&s.trace_id),
                    span_id: hex::encode(&s.span_id),
                    parent: hex::encode(&s.parent_span_id),
                    name: s.name,
                    kind: s.kind,
                    status: s.status.map(|st| st.code).unwrap_or(0),
                    attributes,
                    events: s.events.into_iter().map(|e| e.name).collect(),
                    start_ns: s.start_time_unix_nano,
                    end_ns: s.end_time_unix_nano,
                    service: service.clone(),
                });
            }
        }
    }
    axum::http::StatusCode::OK
}

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

/// This thread's subscriber: the traces layer alone, for watchpump's spans
/// and the test's own.
fn traced(telemetry: &Telemetry) -> tracing::subscriber::DefaultGuard {
    let only_ours = tracing_subscriber::filter::Targets::new()
        .with_target(watchpump::telemetry::TARGET, tracing::Level::TRACE)
        .with_target("traces", tracing::Level::TRACE);
    let subscriber = tracing_subscriber::registry()
        .with(telemetry.layer())
        .with(only_ours);
    tracing::subscriber::set_default(subscriber)
}

fn quick_queue() -> QueueSettings {
    QueueSettings {
        max_queue_size: 2048,
        max_batch_size: 512,
        schedule_delay: Duration::from_millis(100),
    }
}

/// The metrics recorder, once per process, for the dropped-span counter.
fn recorder() -> &'static metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: OnceLock<metrics_exporter_prometheus::PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder).expect("no other recorder in this binary");
        handle
    })
}

fn counter(name: &str) -> f64 {
    common::prometheus::Scrape::parse(recorder().render()).sum(name, &[])
}

/// The consumer's handler: the kit's `Work`, inside a span of the
/// consumer's own (its deploy), which must hang under the kit's handler
/// span.
#[derive(Clone, Default)]
struct DeployWork(Work);

impl Handler for DeployWork {
    async fn handle(&self, tx: &mut PgTransaction<'_>, d: &Delivery) -> Result<Outcome, BoxError> {
        let span = tracing::info_span!(target: "traces", "deploy");
        self.0.handle(tx, d).instrument(span).await
    }
}

/// One test at a time in this binary (`cargo test` runs them on threads of
/// one process): `tracing` caches whether a callsite is enabled across
/// threads, and a test without a traces layer hitting a callsite while
/// another installs its layer could leave that callsite off for it.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The trace as an indented tree, each span with its start (from the
/// trace's first), duration and main attributes: docs/operator.md's "Traces"
/// rendering comes from this (`--nocapture` prints it).
fn render(spans: &[Span]) -> String {
    let t0 = spans.iter().map(|s| s.start_ns).min().unwrap_or(0);
    let mut out = String::new();
    fn walk(spans: &[Span], parent: &str, depth: usize, t0: u64, out: &mut String) {
        let mut children: Vec<&Span> = spans.iter().filter(|s| s.parent == parent).collect();
        children.sort_by_key(|s| s.start_ns);
        for s in children {
            let keys = [
                "http.request.resend_count",
                "http.response.status_code",
                "error.type",
                "watchpump.delivery_id",
                "watchpump.change_id",
                "watchpump.claimed",
            ];
            let attrs: Vec<String> = keys
                .iter()
                .filter_map(|k| s.attributes.get(*k).map(|v| format!("{k}={v}")))
                .collect();
            out.push_str(&format!(
                "{:>9.3} ms {:>8.3} ms  {}{}{} {}\n",
                (s.start_ns - t0) as f64 / 1e6,
                (s.end_ns - s.start_ns) as f64 / 1e6,
                "  ".repeat(depth),
                s.name,
                if s.status == 2 { " [error]" } else { "" },
                attrs.join(" ")
            ));
            walk(spans, &s.span_id, depth + 1, t0, out);
        }
    }
    let roots: std::collections::HashSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    let top: Vec<String> = spans
        .iter()
        .filter(|s| !roots.contains(s.parent.as_str()))
        .map(|s| s.parent.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for parent in top {
        walk(spans, &parent, 0, t0, &mut out);
    }
    out
}

fn attr<'a>(s: &'a Span, key: &str) -> &'a str {
    s.attributes.get(key).map(String::as_str).unwrap_or("")
}

#[tokio::test]
async fn one_trace_runs_from_the_producers_span_through_each_attempt_into_the_handler() {
    let _serial = SERIAL.lock().await;
    let (collector, url) = Collector::start().await;
    let telemetry = Telemetry::otlp_http(&url, Duration::from_secs(5), quick_queue()).unwrap();
    let _traced = traced(&telemetry);

    let db = TestDb::new().await;
    let api = AppServer::start(&db.pool, &operator_config()).await;
    let work = DeployWork::default();
    work.0.fail_next.store(1, Ordering::SeqCst); // 500 first, then 200
    let consumer = Consumer::start(&db, &api, "deploy", WORK_SCHEMA, work.clone()).await;
    consumer
        .watch(WatchRequest {
            resource: "app-1".into(),
            object: MAIN.into(),
            filters: Default::default(),
        })
        .await;
    let pump = RunningPump::start(&db.pool, pump_config());

    // The producer's request, which emits in its transaction.
    let request = tracing::info_span!(target: "traces", "POST /push", otel.kind = "server");
    let trace_id = watchpump::telemetry::of(&request).unwrap().trace_id_hex();
    let change = async {
        let mut tx = db.pool.begin().await.unwrap();
        let id = watchpump::emit(&mut tx, MAIN, "push", &serde_json::json!({"after": "9f2c"}))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        id
    }
    .instrument(request.clone())
    .await;
    drop(request);
    let id = delivery_of(&db, change).await;
    db.wait_state(id, "delivered", LIMIT).await;
    pump.stop().await.unwrap();
    telemetry.flush();

    let spans = collector.of_trace(&trace_id);
    println!("trace {trace_id}\n{}", render(&spans));
    // Every span under the resource's service.name: watchpump, unless the
    // environment names another (before, the exporter never got the
    // resource, and the collector saw none).
    let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "watchpump".into());
    assert!(
        spans.iter().all(|s| s.service == service),
        "every span's service.name is {service}: {spans:#?}"
    );
    let named = |name: &str| -> Vec<&Span> { spans.iter().filter(|s| s.name == name).collect() };
    let producer = named("POST /push");
    assert_eq!(producer.len(), 1, "{spans:#?}");
    let emit = named("watchpump.emit");
    assert_eq!(emit.len(), 1, "{spans:#?}");
    assert_eq!(emit[0].parent, producer[0].span_id);
    assert_eq!(attr(emit[0], "watchpump.change_id"), change.to_string());

    // Two CLIENT attempt spans under emit(): 500 then 200.
    let mut attempts = named("POST");
    attempts.sort_by_key(|s| attr(s, "http.request.resend_count").to_string());
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    for (resend, (status, error)) in [("500", true), ("200", false)].into_iter().enumerate() {
        let a = attempts[resend];
        assert_eq!(a.kind, 3, "CLIENT");
        assert_eq!(a.parent, emit[0].span_id);
        assert_eq!(attr(a, "http.request.resend_count"), resend.to_string());
        assert_eq!(attr(a, "http.request.method"), "POST");
        assert_eq!(attr(a, "http.response.status_code"), status);
        assert_eq!(attr(a, "url.full"), consumer.events_url());
        assert_eq!(attr(a, "server.address"), "127.0.0.1");
        assert_eq!(
            attr(a, "server.port"),
            consumer.server.addr.port().to_string()
        );
        assert_eq!(attr(a, "watchpump.delivery_id"), id.to_string());
        assert_eq!(attr(a, "watchpump.object"), MAIN);
        assert_eq!(attr(a, "watchpump.sequence"), "1");
        assert_eq!(attr(a, "watchpump.service"), "deploy");
        assert!(!attr(a, "watchpump.watch_id").is_empty());
        assert_eq!(a.status == 2, error, "status error on the 500 only: {a:#?}");
        assert_eq!(attr(a, "error.type") == "500", error);
    }

    // The kit's request span hangs under each attempt that reached it (the
    // traceparent it received names that attempt's span); the handler and
    // the consumer's own work under the second.
    let served = named("POST /api/v1/{producer}/events");
    assert_eq!(served.len(), 2, "{spans:#?}");
    for a in &attempts {
        assert_eq!(
            served.iter().filter(|s| s.parent == a.span_id).count(),
            1,
            "one kit request span under attempt {}: {spans:#?}",
            a.span_id
        );
    }
    let handlers = named("watchpump.handle");
    assert_eq!(
        handlers.len(),
        2,
        "the handler ran twice (failed, then done)"
    );
    let second_served = served
        .iter()
        .find(|s| s.parent == attempts[1].span_id)
        .unwrap();
    let handler = handlers
        .iter()
        .find(|h| h.parent == second_served.span_id)
        .expect("the handler span of the second attempt");
    assert_eq!(attr(handler, "watchpump.delivery_id"), id.to_string());
    let deploys = named("deploy");
    assert!(
        deploys.iter().any(|d| d.parent == handler.span_id),
        "{spans:#?}"
    );
    telemetry.shutdown();
}

#[tokio::test]
async fn a_collector_down_or_hanging_does_not_slow_deliveries() {
    let _serial = SERIAL.lock().await;
    const CHANGES: usize = 100;
    let (hanging, hanging_url) = Collector::start().await;
    hanging.hang.store(true, Ordering::SeqCst);
    let down_url = format!("http://127.0.0.1:{}/v1/traces", common::free_port());
    for (name, url) in [("hanging", hanging_url), ("down", down_url)] {
        // A small queue, so that it fills: one export at a time is stuck.
        let queue = QueueSettings {
            max_queue_size: 16,
            max_batch_size: 8,
            schedule_delay: Duration::from_millis(10),
        };
        let telemetry = Telemetry::otlp_http(&url, Duration::from_secs(60), queue).unwrap();
        let _traced = traced(&telemetry);
        let dropped_before = counter(watchpump::metrics::TRACE_SPANS_DROPPED);

        let db = TestDb::new().await;
        let consumer = Receiver::start().await;
        let (svc, _) = db.add_service("deploy", &consumer.base_url()).await;
        db.add_watch(svc.id, "app-1", "acme/", all()).await;
        let pump = RunningPump::start(&db.pool, pump_config());
        for i in 0..CHANGES {
            let span = tracing::info_span!(target: "traces", "POST /push");
            db.emit(&format!("acme/web/{i}"), "push", serde_json::json!({}))
                .instrument(span)
                .await;
        }
        // Every delivery goes, each carrying its attempt's traceparent,
        // while the exporter is stuck or failing.
        let received = consumer.wait_for(CHANGES, LIMIT).await;
        assert_eq!(received.len(), CHANGES, "{name}");
        assert!(
            received
                .iter()
                .all(|r| r.headers.contains_key("traceparent")),
            "{name}"
        );
        common::eventually(LIMIT, "every delivery delivered", || async {
            db.count_state("delivered").await == CHANGES as i64
        })
        .await;
        pump.stop().await.unwrap();

        // At least 2 spans per change (emit, attempt) were made; the queue
        // holds 16 and one batch of 8 may be in the stuck export: the rest
        // were dropped and counted, none exported.
        let dropped = counter(watchpump::metrics::TRACE_SPANS_DROPPED) - dropped_before;
        assert!(
            dropped >= (2 * CHANGES - 16 - 8) as f64,
            "{name}: {dropped} dropped"
        );
        if name == "hanging" {
            assert!(hanging.spans().is_empty(), "the collector never answered");
            assert!(
                hanging.requests.load(Ordering::SeqCst) >= 1,
                "the exporter did try"
            );
        }
        drop(_traced);
        // Not shut down: that would wait for the stuck export.
        drop(telemetry);
    }
}

#[tokio::test]
async fn a_malformed_traceparent_records_and_sends_the_change_without_context() {
    let _serial = SERIAL.lock().await;
    // No traces layer here: the pump forwards the change's own context.
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (svc, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(svc.id, "app-1", "acme/", all()).await;
    let malformed_before: i64 = sqlx::query_scalar(
        "select case when is_called then last_value else 0 end from watchpump.trace_context_malformed",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(malformed_before, 0);

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let cases = [
        ("acme/a", "00-not-a-trace-context", ""),
        ("acme/b", GOOD, "bad state with spaces and no equals"),
        ("acme/c", GOOD, "vendor=abc"),
        (
            "acme/d",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "",
        ),
    ];
    for (object, traceparent, tracestate) in cases {
        let mut tx = db.pool.begin().await.unwrap();
        sqlx::query("select set_config('watchpump.traceparent', $1, true), set_config('watchpump.tracestate', $2, true)")
            .bind(traceparent)
            .bind(tracestate)
            .execute(&mut *tx)
            .await
            .unwrap();
        sqlx::query("select watchpump.emit($1, 'push', '{}')")
            .bind(object)
            .execute(&mut *tx)
            .await
            .expect("a malformed trace context never fails emit()");
        tx.commit().await.unwrap();
    }
    let kept: Vec<(String, Option<String>, Option<String>)> = sqlx::query_as(
        "select object, traceparent, tracestate from watchpump.changes order by object",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        kept,
        vec![
            ("acme/a".into(), None, None),
            ("acme/b".into(), Some(GOOD.into()), None),
            (
                "acme/c".into(),
                Some(GOOD.into()),
                Some("vendor=abc".into())
            ),
            ("acme/d".into(), None, None),
        ]
    );
    let malformed: i64 =
        sqlx::query_scalar("select last_value from watchpump.trace_context_malformed")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(malformed, 3, "a, b's tracestate and d are counted");

    let pump = RunningPump::start(&db.pool, pump_config());
    let received = consumer.wait_for(4, LIMIT).await;
    pump.stop().await.unwrap();
    let header = |object: &str, name: &str| {
        let r = received
            .iter()
            .find(|r| r.body["object"] == object)
            .unwrap_or_else(|| panic!("{object} was delivered"));
        r.headers.get(name).map(|v| v.to_str().unwrap().to_string())
    };
    assert_eq!(header("acme/a", "traceparent"), None);
    assert_eq!(header("acme/d", "traceparent"), None);
    assert_eq!(header("acme/b", "traceparent").as_deref(), Some(GOOD));
    assert_eq!(header("acme/b", "tracestate"), None);
    assert_eq!(header("acme/c", "traceparent").as_deref(), Some(GOOD));
    assert_eq!(
        header("acme/c", "tracestate").as_deref(),
        Some("vendor=abc")
    );
}

#[tokio::test]
async fn an_attempt_answered_410_ends_with_an_event_saying_the_delivery_is_dropped() {
    let _serial = SERIAL.lock().await;
    let (collector, url) = Collector::start().await;
    let telemetry = Telemetry::otlp_http(&url, Duration::from_secs(5), quick_queue()).unwrap();
    let _traced = traced(&telemetry);
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    consumer.reply_with(410);
    let (svc, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(svc.id, "app-1", MAIN, all()).await;
    let request = tracing::info_span!(target: "traces", "POST /push");
    let trace_id = watchpump::telemetry::of(&request).unwrap().trace_id_hex();
    let change = db
        .emit(MAIN, "push", serde_json::json!({}))
        .instrument(request)
        .await;
    let id = delivery_of(&db, change).await;
    let pump = RunningPump::start(&db.pool, pump_config());
    db.wait_state(id, "dropped", LIMIT).await;
    pump.stop().await.unwrap();
    telemetry.flush();
    let spans = collector.of_trace(&trace_id);
    let attempt = spans
        .iter()
        .find(|s| s.name == "POST")
        .expect("the attempt span");
    assert_eq!(attr(attempt, "http.response.status_code"), "410");
    assert!(
        attempt
            .events
            .iter()
            .any(|e| e.starts_with("delivery dropped")),
        "{attempt:#?}"
    );
    telemetry.shutdown();
}

#[tokio::test]
async fn serve_exports_every_attempt_of_a_change_emitted_under_a_traceparent() {
    let _serial = SERIAL.lock().await;
    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    let (collector, url) = Collector::start().await;
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    consumer.reply_with(500);
    let (svc, _) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(svc.id, "app-1", MAIN, all()).await;
    // The binary as operators run it: only the standard variables, and a
    // log level (warn, but for the start-up lines) that must not turn the
    // spans off. The producer's context is sampled, so the parent-based
    // ratio keeps every attempt.
    let log = StartUpLog::new();
    let _serve = common::KillOnDrop(
        common::watchpump_cli(Some(&db.url))
            .arg("serve")
            .env("WATCHPUMP_LISTEN", "127.0.0.1:0")
            .env("WATCHPUMP_METRICS_LISTEN", "off")
            .env("WATCHPUMP_PRODUCER", common::PRODUCER)
            .env("WATCHPUMP_PRODUCER_TOKEN", common::PRODUCER_TOKEN)
            .env("WATCHPUMP_RETRY_INITIAL_MS", "100")
            .env("RUST_LOG", "warn,watchpump::server=info")
            .env("NO_COLOR", "1")
            .env(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                url.trim_end_matches("/v1/traces"),
            )
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .env("OTEL_SERVICE_NAME", "watchpump-under-test")
            .env("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
            .env("OTEL_TRACES_SAMPLER_ARG", "0.25")
            .stdout(std::process::Stdio::null())
            .stderr(log.file())
            .spawn()
            .unwrap(),
    );
    // It says once at start that traces are on, where they go, the ratio
    // and the name they go under.
    let line = log.line_with("traces on").await;
    assert_eq!(log.count("traces o"), 1, "{}", log.text());
    for says in [
        format!("spans go over OTLP/HTTP to {url}, sampled at ratio 0.25"),
        "sampler=parentbased_traceidratio".to_string(),
        "service_name=watchpump-under-test".to_string(),
    ] {
        assert!(line.contains(&says), "{says} in {line}");
    }
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("select set_config('watchpump.traceparent', $1, true)")
        .bind(PARENT)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("select watchpump.emit($1, 'push', '{}')")
        .bind(MAIN)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    consumer.wait_for(1, LIMIT).await;
    consumer.reply_with(200);
    let received = consumer.wait_for(2, LIMIT).await;

    common::eventually(LIMIT, "both attempt spans at the collector", || async {
        collector
            .of_trace(TRACE)
            .iter()
            .filter(|s| s.name == "POST")
            .count()
            == 2
    })
    .await;
    let mut attempts: Vec<Span> = collector
        .of_trace(TRACE)
        .into_iter()
        .filter(|s| s.name == "POST")
        .collect();
    attempts.sort_by_key(|s| attr(s, "http.request.resend_count").to_string());
    for (i, (a, status)) in attempts.iter().zip(["500", "200"]).enumerate() {
        assert_eq!(
            a.parent, "00f067aa0ba902b7",
            "a child of the producer's span"
        );
        assert_eq!(a.kind, 3);
        assert_eq!(attr(a, "http.request.resend_count"), i.to_string());
        assert_eq!(attr(a, "http.response.status_code"), status);
        assert_eq!(attr(a, "watchpump.service"), "deploy");
        // The consumer got the same trace, with this attempt as the parent.
        let header = received[i].headers["traceparent"].to_str().unwrap();
        assert_eq!(header, format!("00-{TRACE}-{}-01", a.span_id));
        // Under the resource OTEL_SERVICE_NAME names.
        assert_eq!(a.service, "watchpump-under-test");
    }
}

/// serve's stderr, in a file the test reads while it runs.
struct StartUpLog(std::path::PathBuf);

impl StartUpLog {
    fn new() -> StartUpLog {
        StartUpLog(
            std::env::temp_dir().join(format!("watchpump-serve-{}.log", rand::random::<u64>())),
        )
    }

    fn file(&self) -> std::fs::File {
        std::fs::File::create(&self.0).unwrap()
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.0).unwrap_or_default()
    }

    fn count(&self, needle: &str) -> usize {
        self.text().lines().filter(|l| l.contains(needle)).count()
    }

    /// The first line with `needle`, once serve has written it.
    async fn line_with(&self, needle: &str) -> String {
        common::eventually(LIMIT, &format!("serve logs {needle:?}"), || async {
            self.count(needle) > 0
        })
        .await;
        let text = self.text();
        text.lines()
            .find(|l| l.contains(needle))
            .unwrap()
            .to_string()
    }
}

impl Drop for StartUpLog {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// With no endpoint set, serve says at start that traces are off and what
/// turns them on, once.
#[tokio::test]
async fn serve_says_once_at_start_that_traces_are_off_and_what_turns_them_on() {
    let db = TestDb::new().await;
    let log = StartUpLog::new();
    let mut serve = common::watchpump_cli(Some(&db.url));
    for var in [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_SDK_DISABLED",
    ] {
        serve.env_remove(var);
    }
    let _serve = common::KillOnDrop(
        serve
            .arg("serve")
            .env("WATCHPUMP_LISTEN", "127.0.0.1:0")
            .env("WATCHPUMP_METRICS_LISTEN", "off")
            .env("WATCHPUMP_PRODUCER", common::PRODUCER)
            .env("WATCHPUMP_PRODUCER_TOKEN", common::PRODUCER_TOKEN)
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null())
            .stderr(log.file())
            .spawn()
            .unwrap(),
    );
    let line = log.line_with("traces off").await;
    assert!(
        line.contains(
            "no OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set"
        ),
        "{line}"
    );
    log.line_with("watches API listening").await;
    assert_eq!(log.count("traces o"), 1, "{}", log.text());
}

#[tokio::test]
async fn the_panel_shows_a_deliverys_trace_id_and_links_it_when_told_where() {
    let _serial = SERIAL.lock().await;
    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    let db = TestDb::new().await;
    let (svc, _) = db.add_service("deploy", "http://127.0.0.1:9").await;
    db.add_watch(svc.id, "app-1", "acme/", all()).await;
    let traced = {
        let mut tx = db.pool.begin().await.unwrap();
        sqlx::query("select set_config('watchpump.traceparent', $1, true)")
            .bind(PARENT)
            .execute(&mut *tx)
            .await
            .unwrap();
        let id: i64 = sqlx::query_scalar("select watchpump.emit('acme/a', 'push', '{}')")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        delivery_of(&db, id).await
    };
    let untraced = delivery_of(&db, db.emit("acme/b", "push", serde_json::json!({})).await).await;

    let plain = AppServer::start(&db.pool, &operator_config()).await;
    let page = plain
        .panel_get(&format!("/panel/deliveries/{traced}"))
        .await;
    assert!(
        page.contains(&format!(r#"<code id="trace">{TRACE}</code>"#)),
        "{page}"
    );
    let page = plain
        .panel_get(&format!("/panel/deliveries/{untraced}"))
        .await;
    assert!(page.contains("emitted outside a traced span") && !page.contains(TRACE));

    let mut cfg = operator_config();
    cfg.trace_url = Some("https://traces.example/explore?traceId={trace_id}&x=1".into());
    let linked = AppServer::start(&db.pool, &cfg).await;
    let page = linked
        .panel_get(&format!("/panel/deliveries/{traced}"))
        .await;
    assert!(
        page.contains(&format!(
            r#"<a id="trace" href="https://traces.example/explore?traceId={TRACE}&amp;x=1"><code>{TRACE}</code></a>"#
        )),
        "{page}"
    );
}

/// Every audience's routes get a SERVER span named by the route, a child
/// of the caller's `traceparent`: the consumer API, the admin API and the
/// panel alike (the span is applied once, to the whole application;
/// before, only the consumer API's routes had it).
#[tokio::test]
async fn serve_traces_a_request_to_each_audiences_routes_under_its_callers_context() {
    let _serial = SERIAL.lock().await;
    const TRACE: &str = "5cf92f3577b34da6a3ce929d0e0e4737";
    const CALLER: &str = "10f067aa0ba902b8";
    let (collector, url) = Collector::start().await;
    let db = TestDb::new().await;
    let (_svc, token) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let port = common::free_port();
    let _serve = common::KillOnDrop(
        common::watchpump_cli(Some(&db.url))
            .arg("serve")
            .env("WATCHPUMP_LISTEN", format!("127.0.0.1:{port}"))
            .env("WATCHPUMP_METRICS_LISTEN", "off")
            .env("WATCHPUMP_PRODUCER", common::PRODUCER)
            .env("WATCHPUMP_PRODUCER_TOKEN", common::PRODUCER_TOKEN)
            .env("WATCHPUMP_ADMIN_TOKEN", common::ADMIN_TOKEN)
            .env(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                url.trim_end_matches("/v1/traces"),
            )
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    common::eventually(LIMIT, "serve answering /healthz", || async {
        http.get(format!("{base}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    let traceparent = format!("00-{TRACE}-{CALLER}-01");
    let asks = [
        (
            "/api/v1/watches",
            Some(token.as_str()),
            "GET /api/v1/watches",
        ),
        (
            "/api/v1/admin/backlog",
            Some(common::ADMIN_TOKEN),
            "GET /api/v1/admin/backlog",
        ),
        ("/panel/login", None, "GET /panel/login"),
    ];
    for (path, bearer, _) in asks {
        let mut request = http
            .get(format!("{base}{path}"))
            .header("traceparent", &traceparent);
        if let Some(bearer) = bearer {
            request = request.bearer_auth(bearer);
        }
        let status = request.send().await.unwrap().status();
        assert!(status.is_success(), "{path}: {status}");
    }
    common::eventually(
        LIMIT,
        "a span for each request at the collector",
        || async { collector.of_trace(TRACE).len() >= asks.len() },
    )
    .await;
    let spans = collector.of_trace(TRACE);
    for (path, _, name) in asks {
        let span = spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no span {name} for {path} in {}", render(&spans)));
        assert_eq!(span.kind, 2, "{name} is a SERVER span");
        assert_eq!(span.parent, CALLER, "{name} is the caller's child");
        assert_eq!(attr(span, "http.response.status_code"), "200");
    }
}
