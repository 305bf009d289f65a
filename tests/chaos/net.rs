//! The partition fault's network: each pump a host of its own, in a
//! network namespace with its own address, reaching PostgreSQL (through
//! HAProxy) and the consumers on a bridge (`scripts/chaos-net.sh`). A host
//! is cut off from the database or from its consumers by drop rules in its
//! namespace, and healed. Everything is removed when this is dropped.

use std::process::Command;

/// Where the hosts reach this machine: the bridge's address.
pub const GATEWAY: &str = "10.231.0.1";

pub struct Net {
    dir: String,
    pub hosts: Vec<String>,
    /// PostgreSQL's port as the hosts reach it.
    pub front_port: u16,
}

fn script() -> Command {
    Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/chaos-net.sh"))
}

fn run(args: &[String]) {
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
}

impl Net {
    pub fn up(hosts: usize, pg_port: u16) -> Net {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/target/chaos-net").to_string();
        let front_port: u16 = {
            let out = Command::new(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/scripts/dev-postgres.sh"
            ))
            .args(["port", "pg-net-front"])
            .output()
            .expect("run scripts/dev-postgres.sh");
            String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
        };
        run(&[
            "up".into(),
            dir.clone(),
            hosts.to_string(),
            front_port.to_string(),
            pg_port.to_string(),
        ]);
        Net {
            dir,
            hosts: (1..=hosts).map(|h| format!("wpchaos-h{h}")).collect(),
            front_port,
        }
    }

    /// Drops host `host`'s traffic to and from `ports` on the gateway.
    pub fn cut(&self, host: usize, ports: &[u16]) {
        let mut args = vec!["cut".into(), self.dir.clone(), (host + 1).to_string()];
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
