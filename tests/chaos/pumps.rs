//! Pump processes (`watchpump serve`), killed, stopped and replaced. A pump
//! that exits by itself, or exits non-zero on SIGTERM, is a violation. Each
//! pump's log is kept in `target/chaos/`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::Rng;

use crate::Settings;

/// The chaos consumers listen on loopback, which serve refuses by default.
const ALLOWED: &str = "127.0.0.0/8,::1";

/// Where a pump runs, with the partition fault (tests/chaos/net.rs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// The database through this host's own front port.
    pub url: String,
    /// Its deliveries' source address (`WATCHPUMP_SOURCE_ADDRESS`).
    pub source: Option<String>,
}

struct Running {
    name: String,
    child: Child,
    /// The host it runs as (the partition fault's).
    host: Option<Host>,
}

pub struct Pumps {
    url: String,
    /// Hosts to run the pumps as, one pump each; empty: all alike, on
    /// `url`.
    hosts: Vec<Host>,
    settings: Settings,
    running: Vec<Running>,
    started: usize,
    pub kills: usize,
    pub graceful_stops: usize,
    /// What went wrong with pumps: exits nobody asked for, bad exit codes.
    pub unexpected: Vec<String>,
}

fn log_dir() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/chaos");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Pumps {
    pub fn new(url: &str, settings: &Settings, hosts: Vec<Host>) -> Pumps {
        for old in std::fs::read_dir(log_dir()).unwrap().flatten() {
            let _ = std::fs::remove_file(old.path());
        }
        Pumps {
            url: url.to_string(),
            hosts,
            settings: settings.clone(),
            running: Vec::new(),
            started: 0,
            kills: 0,
            graceful_stops: 0,
            unexpected: Vec::new(),
        }
    }

    pub fn start(&mut self, n: usize) {
        for _ in 0..n {
            self.spawn();
        }
    }

    fn spawn(&mut self) {
        self.started += 1;
        let name = format!("chaos-{}", self.started);
        let log = std::fs::File::create(log_dir().join(format!("{name}.log"))).unwrap();
        let ms = |d: Duration| d.as_millis().to_string();
        let host = self
            .hosts
            .iter()
            .find(|h| !self.running.iter().any(|r| r.host.as_ref() == Some(*h)))
            .cloned();
        let mut command = Command::new(env!("CARGO_BIN_EXE_watchpump"));
        let url = host.as_ref().map_or(&self.url, |h| &h.url);
        if let Some(source) = host.as_ref().and_then(|h| h.source.as_ref()) {
            command.env("WATCHPUMP_SOURCE_ADDRESS", source);
        }
        let child = command
            .arg("serve")
            .env("DATABASE_URL", url)
            .env("WATCHPUMP_ALLOWED_DESTINATIONS", ALLOWED)
            .env("WATCHPUMP_LISTEN", "127.0.0.1:0")
            .env("WATCHPUMP_METRICS_LISTEN", "off")
            .env("WATCHPUMP_PRODUCER", "git")
            .env("WATCHPUMP_PRODUCER_TOKEN", "chaos-producer-token")
            .env("WATCHPUMP_PUMP_NAME", &name)
            .env(
                "WATCHPUMP_REQUEST_TIMEOUT_MS",
                ms(self.settings.request_timeout),
            )
            .env("WATCHPUMP_CONNECT_TIMEOUT_MS", "500")
            .env("WATCHPUMP_LEASE_MS", ms(self.settings.lease))
            .env("WATCHPUMP_SWEEP_INTERVAL_MS", "200")
            .env("WATCHPUMP_RETRY_INITIAL_MS", "50")
            .env("WATCHPUMP_RETRY_MAX_MS", "1000")
            .env("WATCHPUMP_PROBE_INTERVAL_MS", "300")
            .env("WATCHPUMP_SERVICE_CONCURRENCY", "16")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start watchpump serve");
        self.running.push(Running { name, child, host });
    }

    /// Notices pumps that exited on their own.
    pub fn reap(&mut self) {
        let mut still = Vec::new();
        for mut p in self.running.drain(..) {
            match p.child.try_wait() {
                Ok(Some(status)) => self.unexpected.push(format!(
                    "pump {} exited by itself ({status}){}; see target/chaos/{}.log",
                    p.name,
                    last_words(&p.name),
                    p.name
                )),
                _ => still.push(p),
            }
        }
        self.running = still;
    }

    pub fn top_up(&mut self, n: usize) {
        while self.running.len() < n {
            self.spawn();
        }
    }

    pub fn kill_one(&mut self, rng: &mut impl Rng) {
        if self.running.is_empty() {
            return;
        }
        let mut p = self.running.remove(rng.gen_range(0..self.running.len()));
        let _ = p.child.kill();
        let _ = p.child.wait();
        self.kills += 1;
    }

    pub async fn stop_one_gracefully(&mut self, rng: &mut impl Rng) {
        if self.running.is_empty() {
            return;
        }
        let p = self.running.remove(rng.gen_range(0..self.running.len()));
        if let Some(problem) = self.stop(p).await {
            self.unexpected.push(problem);
        }
    }

    /// SIGTERM to every pump; returns the ones that did not exit 0 in time.
    pub async fn stop_all_gracefully(&mut self) -> Vec<String> {
        let running: Vec<Running> = self.running.drain(..).collect();
        for p in &running {
            terminate(&p.child);
        }
        let mut problems = Vec::new();
        for p in running {
            if let Some(problem) = self.stop(p).await {
                problems.push(problem);
            }
        }
        problems
    }

    /// Sends SIGTERM (again, harmlessly, after stop_all) and waits for exit 0
    /// within the request timeout plus the pump's own grace.
    async fn stop(&mut self, mut p: Running) -> Option<String> {
        terminate(&p.child);
        self.graceful_stops += 1;
        let limit = self.settings.request_timeout + Duration::from_secs(10);
        let deadline = Instant::now() + limit;
        loop {
            match p.child.try_wait() {
                Ok(Some(status)) if status.success() => return None,
                Ok(Some(status)) => {
                    return Some(format!(
                        "pump {} exited with {status} on SIGTERM{}; see target/chaos/{}.log",
                        p.name,
                        last_words(&p.name),
                        p.name
                    ))
                }
                _ if Instant::now() > deadline => {
                    let _ = p.child.kill();
                    let _ = p.child.wait();
                    return Some(format!(
                        "pump {} did not stop within {limit:?} of SIGTERM",
                        p.name
                    ));
                }
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }
}

/// What a pump said as it exited (`watchpump: <error>` on stderr, its
/// last line), for the violation: CI keeps the test's output, not
/// `target/chaos/`.
fn last_words(name: &str) -> String {
    let log = std::fs::read_to_string(log_dir().join(format!("{name}.log"))).unwrap_or_default();
    log.lines()
        .rev()
        .find(|line| line.starts_with("watchpump: "))
        .map(|line| format!(", saying {line:?}"))
        .unwrap_or_default()
}

fn terminate(child: &Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
}

impl Drop for Pumps {
    fn drop(&mut self) {
        for p in &mut self.running {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}
