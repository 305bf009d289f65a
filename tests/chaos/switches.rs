//! What moves the primary of the Patroni cluster ([`crate::patroni`])
//! under load, as production sees it happen; Patroni does the rest:
//!
//! - a planned **switchover**, asked of the primary's agent over its REST
//!   API (what `patronictl switchover` does);
//! - a **crash** of the primary's machine: its agent, its postmaster and
//!   every PostgreSQL process SIGKILLed at once, after its WAL sender was
//!   frozen for a while (SIGSTOP), a standby fallen behind as over a slow
//!   link; the standby's agent takes the leader key once it expires. The
//!   machine then comes back: its agent is started again, and rewinds it
//!   into a standby;
//! - a **partition** of the primary's agent from etcd (nftables drop rules
//!   on its etcd port, both ways: packets vanish, as in a real partition),
//!   while PostgreSQL replication and the clients still reach it. The agent
//!   demotes its node when it cannot renew the leader key, and the
//!   standby's agent takes the key once it expires. Healed once the front
//!   has switched.
//!
//! Each is timed from the fault to the first connection through the front
//! that lands on the new primary, and the old primary's return as a
//! streaming standby is waited for before the next.

use std::process::Command;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::daemon;
use crate::patroni::{http, PatroniCluster};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Switchover,
    Crash,
    Partition,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Switchover => "switchover",
            Kind::Crash => "crash",
            Kind::Partition => "partition from etcd",
        }
    }
}

/// How long Patroni gets to move the primary, and to bring the old one
/// back as a standby: a few leader-key TTLs, on a loaded machine.
const SWITCH_LIMIT: Duration = Duration::from_secs(90);
const REBUILD_LIMIT: Duration = Duration::from_secs(180);

/// A fault done and the front switched; the old primary not back yet.
pub struct Switched {
    pub kind: Kind,
    old: usize,
    new: usize,
    pub from: &'static str,
    pub to: &'static str,
    /// When the fault began (a crash: when the WAL sender froze).
    pub began: DateTime<Utc>,
    /// When a connection through the front first landed on the new
    /// primary.
    pub promoted_at: DateTime<Utc>,
    pub took: Duration,
    /// The partition, healed when dropped.
    cut: Option<EtcdCut>,
}

/// Does `kind` to the current primary and waits for the front to reach the
/// new one. `lag`: how long a crashed primary's WAL sender is frozen first.
pub fn cause(cluster: &PatroniCluster, kind: Kind, lag: Duration) -> Switched {
    let old = cluster
        .primary()
        .expect("a primary before the switch (GET /primary answers 200 on neither node)");
    let new = 1 - old;
    let began = Utc::now();
    let started = Instant::now();
    let mut cut = None;
    match kind {
        Kind::Switchover => {
            let body = format!(
                r#"{{"leader": "{}", "candidate": "{}"}}"#,
                cluster.name(old),
                cluster.name(new)
            );
            let answer = http(
                cluster.rest_port(old),
                "POST",
                "/switchover",
                &body,
                SWITCH_LIMIT,
            );
            assert!(
                answer.as_ref().is_some_and(|(status, _)| *status == 200),
                "Patroni refused the switchover from {} to {}: {answer:?}",
                cluster.name(old),
                cluster.name(new)
            );
        }
        Kind::Crash => {
            // Asynchronous: the primary commits on, and what it commits now
            // the standby never gets. Synchronous: commits wait for the
            // standby, and the crash leaves them in doubt (never
            // acknowledged). The frozen sender dies with the rest (SIGKILL
            // reaches a stopped process).
            if let Some(sender) = cluster.wal_sender(old) {
                daemon::signal("STOP", [sender]);
                std::thread::sleep(lag);
            }
            cluster.crash(old);
        }
        Kind::Partition => cut = Some(EtcdCut::new(cluster.etcd_port(old))),
    }
    cluster
        .wait_front_on(new, SWITCH_LIMIT)
        .unwrap_or_else(|e| panic!("{} of {}: {e}", kind.name(), cluster.name(old)));
    Switched {
        kind,
        old,
        new,
        from: cluster.name(old),
        to: cluster.name(new),
        began,
        promoted_at: Utc::now(),
        took: started.elapsed(),
        cut,
    }
}

impl Switched {
    /// Brings the old primary back (a crashed machine's agent is started
    /// again; a partition is healed) and waits until it streams from the
    /// new one. Returns how long that took.
    pub fn rebuild(&mut self, cluster: &PatroniCluster) -> Duration {
        let started = Instant::now();
        match self.kind {
            Kind::Switchover => {}
            Kind::Crash => cluster.start_patroni(self.old),
            Kind::Partition => drop(self.cut.take()),
        }
        cluster
            .wait_streaming(self.new, REBUILD_LIMIT)
            .unwrap_or_else(|e| {
                panic!(
                    "after the {} of {}: {e}",
                    self.kind.name(),
                    cluster.name(self.old)
                )
            });
        started.elapsed()
    }
}

/// One agent cut off from etcd: packets to and from its etcd client port
/// dropped on `lo` (the input and output hooks see loopback packets), in an
/// nftables table of its own, removed when this is dropped. The port was
/// chosen free for this run, so the table's name is this run's alone.
pub struct EtcdCut {
    table: String,
}

fn nft_bin() -> &'static str {
    ["/usr/sbin/nft", "/sbin/nft"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or("nft")
}

fn nft(args: &[&str]) {
    let out = Command::new(nft_bin())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("nft {}: {e}", args.join(" ")));
    assert!(
        out.status.success(),
        "nft {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl EtcdCut {
    fn new(port: u16) -> EtcdCut {
        let table = format!("wpchaos_etcd_{port}");
        let _ = Command::new(nft_bin())
            .args(["delete", "table", "inet", &table])
            .output();
        let cut = EtcdCut {
            table: table.clone(),
        };
        nft(&["add", "table", "inet", &table]);
        for (chain, hook) in [("in", "input"), ("out", "output")] {
            nft(&[&format!(
                "add chain inet {table} {chain} {{ type filter hook {hook} priority 0; }}"
            )]);
            for dir in ["dport", "sport"] {
                nft(&[&format!(
                    "add rule inet {table} {chain} tcp {dir} {port} drop"
                )]);
            }
        }
        cut
    }
}

impl Drop for EtcdCut {
    fn drop(&mut self) {
        let _ = Command::new(nft_bin())
            .args(["delete", "table", "inet", &self.table])
            .output();
    }
}
