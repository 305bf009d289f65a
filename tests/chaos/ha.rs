//! The failover fault's PostgreSQL: a primary and a streaming standby
//! (synchronous or not) behind HAProxy, set up, failed over and rebuilt by
//! `scripts/chaos-ha.sh`, in `target/chaos-ha`. Everything it started is
//! stopped, and the directory removed, when it is dropped, unless the run
//! failed and it was kept for a look ([`HaPair::keep_for_a_look`]).

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::cluster::Cluster;

pub struct HaPair {
    dir: String,
    /// The cluster as seen through HAProxy's front.
    pub front: Cluster,
    kept: AtomicBool,
}

fn script() -> Command {
    Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/chaos-ha.sh"))
}

/// A free port remembered for this checkout (`scripts/dev-postgres.sh port`).
fn port(name: &str) -> String {
    let out = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/dev-postgres.sh"
    ))
    .args(["port", name])
    .output()
    .expect("run scripts/dev-postgres.sh");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn run(args: &[&str]) -> String {
    let out = script()
        .args(args)
        .output()
        .expect("run scripts/chaos-ha.sh");
    assert!(
        out.status.success(),
        "scripts/chaos-ha.sh {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

impl HaPair {
    pub fn start(synchronous: bool) -> HaPair {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/target/chaos-ha").to_string();
        let (a, b, front) = (port("pg-ha-a"), port("pg-ha-b"), port("pg-ha-front"));
        let sync = if synchronous { "on" } else { "off" };
        let out = run(&["start", &dir, &a, &b, &front, sync]);
        let url = out.lines().last().expect("the front's URL").trim();
        HaPair {
            dir,
            front: Cluster::at(url),
            kept: AtomicBool::new(false),
        }
    }

    /// Freezes the primary's WAL sender for `lag` (a standby fallen
    /// behind), crashes the primary, promotes the standby, switches the
    /// front. Returns how long that took, the lag included.
    pub fn fail_over(&self, lag: std::time::Duration) -> std::time::Duration {
        let started = Instant::now();
        run(&["failover", &self.dir, &lag.as_millis().to_string()]);
        started.elapsed()
    }

    /// The old primary becomes the new one's standby (pg_rewind).
    pub fn rebuild(&self) -> std::time::Duration {
        let started = Instant::now();
        run(&["rebuild", &self.dir]);
        started.elapsed()
    }

    /// Leaves the clusters and HAProxy running when this is dropped, so
    /// that a failed run's database can be read where it is, and says how
    /// to stop them.
    pub fn keep_for_a_look(&self) {
        self.kept.store(true, Ordering::SeqCst);
    }
}

impl Drop for HaPair {
    fn drop(&mut self) {
        if self.kept.load(Ordering::SeqCst) {
            eprintln!(
                "the HA clusters are kept running in {0}; `scripts/chaos-ha.sh stop {0}` stops them",
                self.dir
            );
            return;
        }
        let _ = script().args(["stop", &self.dir]).output();
    }
}
