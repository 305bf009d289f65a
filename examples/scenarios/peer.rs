//! `make bench SCENARIOS=peer`: bulk-1's workload run by the peer,
//! graphile-worker (`scripts/peer/bulk1.js`; `npm ci --prefix scripts/peer`
//! first), for the comparison issue 18 asks to state.
//!
//! The same consumer as bulk-1's, in this process; 20,000 jobs added in
//! one transaction before the worker runs (bulk-1 emits its changes in one
//! transaction before the pump starts); each job POSTs a body of bulk-1's
//! shape, signed. The clock runs from the worker's start (after its jobs
//! are added) to the 20,000th arrival, as bulk-1's runs from the pump's
//! start; the worker's CPU is its process's over that time. Alternate it
//! with bulk-1 (`make bench SCENARIOS="bulk-1 peer"` a few times).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{cpu_seconds_of, peak_rss_mib_of, Bench, Consumer, Outcome};

const JOBS: usize = 20_000;

pub async fn peer(b: Bench) -> Outcome {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/peer");
    if !dir.join("node_modules/graphile-worker").exists() {
        return Outcome {
            line: "skipped: `npm ci --prefix scripts/peer` installs graphile-worker first".into(),
            json: json!({"skipped": true}),
        };
    }
    let consumer = Consumer::start(1).await;
    let mut child = Command::new("node")
        .arg(dir.join("bulk1.js"))
        .env("DATABASE_URL", &b.url)
        .env("CONSUMER_URL", format!("http://{}", consumer.addrs[0]))
        .env("JOBS", JOBS.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("node (Node 20)");
    let stat = format!("/proc/{}/stat", child.id());
    // "added": the jobs are in; the worker starts now.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let added = tokio::task::spawn_blocking(move || lines.next())
        .await
        .unwrap();
    assert!(
        matches!(&added, Some(Ok(l)) if l == "added"),
        "bulk1.js: {added:?}"
    );
    let (start, cpu_before) = (Instant::now(), cpu_seconds_of(&stat));
    let all = consumer.wait_for(JOBS, Duration::from_secs(120)).await;
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds_of(&stat) - cpu_before;
    let rss = peak_rss_mib_of(&stat.replace("/stat", "/status"));
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        all,
        "graphile-worker delivered {} of {JOBS}",
        consumer.received()
    );
    let rate = JOBS as f64 / elapsed;
    let cpu_us = cpu * 1e6 / JOBS as f64;
    Outcome {
        line: format!(
            "graphile-worker 0.18.0, {JOBS} jobs: {rate:.0} deliveries/s from worker start to last arrival ({elapsed:.2} s), worker CPU {cpu_us:.0} µs/delivery, peak RSS {rss:.1} MiB"
        ),
        json: json!({"deliveries_per_s": rate, "elapsed_s": elapsed, "worker_cpu_us_per_delivery": cpu_us,
                     "worker_peak_rss_mib": rss}),
    }
}
