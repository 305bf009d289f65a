//! The partition fault's network, all on loopback: each pump a host of its
//! own, with a loopback source address for its deliveries
//! (`WATCHPUMP_SOURCE_ADDRESS`) and a HAProxy front port of its own for
//! PostgreSQL (`scripts/chaos-net.sh`). A host is cut off from the database
//! or from its consumers by nftables drop rules on `lo`, and healed.
//! Everything is removed when this is dropped.

use std::process::Command;

/// One pump's place: where it sends from, and its way to the database.
#[derive(Clone, Debug)]
pub struct Host {
    /// A loopback address of its own (127.0.0.11, .12, ...).
    pub source: String,
    /// PostgreSQL's port as this host reaches it (through HAProxy).
    pub front_port: u16,
}

pub struct Net {
    dir: String,
    pub hosts: Vec<Host>,
}

fn script() -> Command {
    Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/chaos-net.sh"))
}

fn run(args: &[String]) -> String {
    let out = script()
        .args(args)
        .output()
        .expect("run scripts/chaos-net.sh");
    assert!(
        out.status.success(),
        "scripts/chaos-net.sh {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A free port remembered under `name` (`scripts/dev-postgres.sh port`).
fn remembered_port(name: &str) -> u16 {
    let out = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/dev-postgres.sh"
    ))
    .args(["port", name])
    .output()
    .expect("run scripts/dev-postgres.sh");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

impl Net {
    pub fn up(hosts: usize, pg_port: u16) -> Net {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/target/chaos-net").to_string();
        let hosts: Vec<Host> = (1..=hosts)
            .map(|h| Host {
                source: run(&["source".into(), h.to_string()]),
                front_port: remembered_port(&format!("pg-net-front-{h}")),
            })
            .collect();
        let mut args = vec!["up".into(), dir.clone(), pg_port.to_string()];
        args.extend(hosts.iter().map(|h| h.front_port.to_string()));
        run(&args);
        Net { dir, hosts }
    }

    /// Drops host `host`'s traffic to and from its database front port.
    pub fn cut_from_database(&self, host: usize) {
        run(&[
            "cut-db".into(),
            self.dir.clone(),
            (host + 1).to_string(),
            self.hosts[host].front_port.to_string(),
        ]);
    }

    /// Drops host `host`'s traffic to and from the consumers' `ports`.
    pub fn cut_from_consumers(&self, host: usize, ports: &[u16]) {
        let mut args = vec![
            "cut-consumers".into(),
            self.dir.clone(),
            (host + 1).to_string(),
        ];
        args.extend(ports.iter().map(|p| p.to_string()));
        run(&args);
    }

    pub fn heal(&self, host: usize) {
        run(&["heal".into(), self.dir.clone(), (host + 1).to_string()]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = script().args(["down", &self.dir]).output();
    }
}
