//! The failover fault's PostgreSQL, as production runs it: two PostgreSQL
//! nodes, each under a Patroni agent (Debian's `patroni` 3.0.2), one etcd
//! (Debian's `etcd-server` 3.4) holding the leader key, and HAProxy in
//! front asking each agent's REST API which node is the primary
//! (`GET /primary`: 200 on the leader only). Patroni, not the suite,
//! decides the primary; the suite only does to the nodes what happens to
//! them in production ([`crate::switches`]).
//!
//! Everything is a child process of the suite ([`Daemon`]), with its
//! configuration and logs in `target/chaos-patroni`, on free loopback
//! ports; nothing is installed as a system service (Patroni and etcd are
//! unpacked into `target/tools` by `scripts/patroni-tools.sh`). Dropping
//! the cluster stops every process, the PostgreSQL nodes too, whether the
//! run passed, failed or panicked; the directory (logs, data) is kept when
//! it failed, and removed otherwise.
//!
//! One etcd, not three: the fault cut off here is the primary's way to the
//! DCS, which a single etcd shows as well as a quorum does. Each node's
//! agent reaches etcd on a client port of its own (etcd listens on both;
//! `use_proxies` stops Patroni from discovering the other), so that one
//! agent alone can be cut off by port.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::cluster::Cluster;
use crate::daemon::{self, Daemon};

/// Patroni's timing (its defaults are 30, 10 and 10 s): the leader key
/// lives `TTL` s, the agents loop every `LOOP_WAIT` s, and a DCS call is
/// given up after `RETRY_TIMEOUT` s. Patroni wants LOOP_WAIT + 2 ×
/// RETRY_TIMEOUT <= TTL: a primary cut off from etcd then demotes itself
/// before its key expires and the standby may take it. A crashed primary is
/// replaced about TTL s after its last renewal; production's 30 s would
/// make each failover of the run three times as long.
const TTL: u64 = 10;
const LOOP_WAIT: u64 = 1;
const RETRY_TIMEOUT: u64 = 4;
/// A standby further behind than this is not promoted when the primary is
/// lost (Patroni's `maximum_lag_on_failover`, 1 MiB by default): the bound
/// on what an asynchronous failover may lose. The suite's standby falls a
/// second behind before the crash; at this machine's write rates that is
/// below 16 MiB, and the 1 MiB default could leave no node promoted.
const MAX_LAG_ON_FAILOVER: u64 = 16 << 20;

const PROGRAMS: &[&str] = &["patroni", "etcd", "haproxy"];

/// One PostgreSQL node and its agent.
pub struct Node {
    pub name: &'static str,
    pub pg_port: u16,
    pub rest_port: u16,
    /// The etcd client port this node's agent uses (its alone).
    pub etcd_port: u16,
    config: PathBuf,
    data: PathBuf,
    patroni: Option<Daemon>,
}

pub struct PatroniCluster {
    dir: PathBuf,
    pub synchronous: bool,
    tools: PathBuf,
    bindir: PathBuf,
    nodes: Vec<Mutex<Node>>,
    /// HAProxy, then etcd: dropped (stopped) after the nodes (`Drop`).
    haproxy: Mutex<Option<Daemon>>,
    etcd: Mutex<Option<Daemon>>,
    /// The cluster as seen through HAProxy's front.
    pub front: Cluster,
    front_port: u16,
    failed: AtomicBool,
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The newest installed PostgreSQL's binaries (as scripts/dev-postgres.sh
/// finds them).
fn pg_bindir() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is installed under /usr/lib/postgresql")
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|d| d.join("initdb").exists())
        .collect();
    dirs.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop().expect("a PostgreSQL with initdb")
}

/// `count` distinct ports free on 127.0.0.1 now, below Linux's ephemeral
/// range (as scripts/dev-postgres.sh chooses them), so that outgoing
/// connections do not take them meanwhile.
fn free_ports(count: usize) -> Vec<u16> {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    let mut ports: Vec<u16> = Vec::new();
    while ports.len() < count {
        let port = rng.gen_range(20_000..32_768);
        if !ports.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.push(port);
        }
    }
    ports
}

/// Runs a command as the `postgres` user (PostgreSQL refuses root) with
/// setpriv, which execs rather than forks: the child is the program.
fn as_postgres(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new("setpriv");
    command
        .args(["--reuid=postgres", "--regid=postgres", "--init-groups"])
        .arg(program)
        .current_dir("/");
    command
}

fn run_ok(mut command: Command, what: &str) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// A plain HTTP/1.0 request to an agent's REST API on loopback; the status
/// and body, or None when it does not answer within `timeout`.
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let status = answer.split_whitespace().nth(1)?.parse().ok()?;
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Some((status, body.to_string()))
}

impl PatroniCluster {
    /// Starts etcd, bootstraps node a as the primary, clones node b from
    /// it as a standby (the synchronous one when `synchronous`), and puts
    /// HAProxy in front; returns once the front reaches the primary.
    pub fn start(synchronous: bool) -> PatroniCluster {
        let uid = Command::new("id").arg("-u").output().expect("run id -u");
        assert!(
            String::from_utf8_lossy(&uid.stdout).trim() == "0",
            "the failover fault runs PostgreSQL and Patroni as the postgres user and cuts etcd off with nftables: run it as root"
        );
        let tools = root().join("target/tools");
        let install = Command::new(root().join("scripts/patroni-tools.sh"))
            .status()
            .expect("run scripts/patroni-tools.sh");
        assert!(
            install.success(),
            "Patroni and etcd are not available (scripts/patroni-tools.sh)"
        );
        let dir = Self::fresh_dir();
        let ports = free_ports(8);
        let (front_port, peer_port) = (ports[0], ports[1]);
        let node = |i: usize, name: &'static str| Node {
            name,
            pg_port: ports[2 + i],
            rest_port: ports[4 + i],
            etcd_port: ports[6 + i],
            config: dir.join(format!("{name}.yml")),
            data: dir.join(name),
            patroni: None,
        };
        let nodes = vec![Mutex::new(node(0, "a")), Mutex::new(node(1, "b"))];
        let cluster = PatroniCluster {
            front: Cluster::at(&format!(
                "postgres://postgres@127.0.0.1:{front_port}/postgres"
            )),
            dir,
            synchronous,
            tools,
            bindir: pg_bindir(),
            nodes,
            haproxy: Mutex::new(None),
            etcd: Mutex::new(None),
            front_port,
            failed: AtomicBool::new(false),
        };
        cluster.start_etcd(peer_port);
        for i in 0..2 {
            let n = cluster.nodes[i].lock().unwrap();
            std::fs::write(&n.config, cluster.patroni_config(&n)).unwrap();
        }
        // b clones a: a must be the leader, and running, first.
        cluster.start_patroni(0);
        cluster.wait(Duration::from_secs(120), "node a to lead", || {
            cluster.primary() == Some(0)
        });
        cluster.start_patroni(1);
        cluster
            .wait_streaming(0, Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("{e}"));
        cluster.start_haproxy();
        cluster
            .wait_front_on(0, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e}"));
        cluster
    }

    /// `target/chaos-patroni`, emptied (stopping what an earlier run that
    /// was killed outright left running), and writable by `postgres`.
    fn fresh_dir() -> PathBuf {
        let dir = root().join("target/chaos-patroni");
        daemon::stop_leftovers(&dir, PROGRAMS);
        for node in ["a", "b"] {
            stop_leftover_postmaster(&dir.join(node));
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        run_ok(
            {
                let mut c = Command::new("chown");
                c.arg("postgres").arg(&dir);
                c
            },
            "chown the cluster's directory to postgres",
        );
        let writable = as_postgres("test").arg("-w").arg(&dir).status();
        assert!(
            writable.is_ok_and(|s| s.success()),
            "the postgres user cannot write {}: put the checkout where it can (not under a private home)",
            dir.display()
        );
        dir
    }

    fn start_etcd(&self, peer_port: u16) {
        let [a, b] = [0, 1].map(|i| self.nodes[i].lock().unwrap().etcd_port);
        let peer = format!("http://127.0.0.1:{peer_port}");
        let mut command = Command::new(self.tools.join("etcd/usr/bin/etcd"));
        command
            .arg("--name=chaos")
            .arg(format!("--data-dir={}", self.dir.join("etcd").display()))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=chaos={peer}"))
            .arg(format!(
                "--listen-client-urls=http://127.0.0.1:{a},http://127.0.0.1:{b}"
            ))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{a}"))
            .arg("--logger=zap")
            .arg("--log-level=warn");
        *self.etcd.lock().unwrap() = Some(Daemon::start(
            "etcd",
            command,
            &self.dir,
            Duration::from_secs(10),
        ));
        self.wait(Duration::from_secs(30), "etcd to answer", || {
            http(a, "GET", "/health", "", Duration::from_secs(1))
                .is_some_and(|(s, body)| s == 200 && body.contains("true"))
        });
    }

    fn patroni_config(&self, n: &Node) -> String {
        let dir = self.dir.display();
        format!(
            r#"# watchpump's chaos suite (tests/chaos/patroni.rs): node {name}
scope: watchpump-chaos
name: {name}
restapi:
  listen: 127.0.0.1:{rest}
  connect_address: 127.0.0.1:{rest}
etcd3:
  hosts: 127.0.0.1:{etcd}
  # This port only: no discovery of etcd's other client URL (the other
  # node's), so that cutting this port cuts this node off.
  use_proxies: true
bootstrap:
  dcs:
    ttl: {TTL}
    loop_wait: {LOOP_WAIT}
    retry_timeout: {RETRY_TIMEOUT}
    maximum_lag_on_failover: {MAX_LAG_ON_FAILOVER}
    synchronous_mode: {sync}
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_level: replica
        hot_standby: "on"
        max_connections: 200
        max_wal_senders: 5
        max_replication_slots: 5
        wal_keep_size: 512MB
        # pg_rewind needs hint bits in the WAL (or data checksums).
        wal_log_hints: "on"
        fsync: "on"
  initdb:
    - encoding: UTF8
    - auth: trust
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {data}
  bin_dir: {bindir}
  pgpass: {dir}/{name}.pgpass
  # A former primary that cannot be rewound is cloned again.
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
    rewind:
      username: postgres
  pg_hba:
    - host replication postgres 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
  parameters:
    unix_socket_directories: ''
    shared_buffers: 128MB
    logging_collector: "on"
    log_directory: {dir}/{name}-pglog
    log_min_messages: warning
    log_min_error_statement: panic
"#,
            name = n.name,
            rest = n.rest_port,
            etcd = n.etcd_port,
            pg = n.pg_port,
            data = n.data.display(),
            bindir = self.bindir.display(),
            sync = self.synchronous,
        )
    }

    /// Starts node `i`'s agent (which starts, clones or rewinds its
    /// PostgreSQL as the cluster needs).
    pub fn start_patroni(&self, i: usize) {
        let mut n = self.nodes[i].lock().unwrap();
        let mut command = as_postgres("/usr/bin/python3");
        command.args(["-m", "patroni"]).arg(&n.config).env(
            "PYTHONPATH",
            self.tools.join("patroni/usr/lib/python3/dist-packages"),
        );
        let name = format!("patroni-{}", n.name);
        // Patroni stops its PostgreSQL (fast) before it exits on SIGTERM.
        n.patroni = Some(Daemon::start(
            &name,
            command,
            &self.dir,
            Duration::from_secs(60),
        ));
    }

    fn start_haproxy(&self) {
        let [a, b] = [0, 1].map(|i| {
            let n = self.nodes[i].lock().unwrap();
            (n.pg_port, n.rest_port)
        });
        let config = format!(
            r#"# watchpump's chaos suite (tests/chaos/patroni.rs)
global
    maxconn 2000
    # Read by the suite: which servers HAProxy holds up.
    stats socket {socket} mode 600 level user

defaults
    mode tcp
    timeout connect 2s
    timeout client 1h
    timeout server 1h
    timeout check 2s
    # Keepalives toward the pumps: a pump cut off from the front is noticed
    # in about 11 s and its session (with a leader's advisory lock) closed
    # on the server, as docs/scaling.md asks of a proxy in production.
    option clitcpka
    clitcpka-idle 5s
    clitcpka-intvl 2s
    clitcpka-cnt 3

# Patroni's own HAProxy template, checking each agent's REST API: only the
# leader answers 200 to GET /primary. A server marked down has its sessions
# shut down, so that no client stays on a demoted primary. Checked every
# second (the template: 3 s, 3 falls, 2 rises), for shorter switches.
listen postgres
    bind 127.0.0.1:{front}
    option httpchk GET /primary
    http-check expect status 200
    default-server inter 1s fall 2 rise 1 on-marked-down shutdown-sessions
    server a 127.0.0.1:{pa} check port {ra}
    server b 127.0.0.1:{pb} check port {rb}
"#,
            front = self.front_port,
            socket = self.dir.join("haproxy.sock").display(),
            pa = a.0,
            ra = a.1,
            pb = b.0,
            rb = b.1,
        );
        let path = self.dir.join("haproxy.cfg");
        std::fs::write(&path, config).unwrap();
        let haproxy = ["/usr/sbin/haproxy", "/usr/bin/haproxy"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or("haproxy");
        let mut command = Command::new(haproxy);
        // -db: in the foreground, one process, so that this child is it.
        command.arg("-db").arg("-f").arg(&path);
        *self.haproxy.lock().unwrap() = Some(Daemon::start(
            "haproxy",
            command,
            &self.dir,
            Duration::from_secs(10),
        ));
    }

    pub fn name(&self, i: usize) -> &'static str {
        self.nodes[i].lock().unwrap().name
    }

    pub fn rest_port(&self, i: usize) -> u16 {
        self.nodes[i].lock().unwrap().rest_port
    }

    pub fn etcd_port(&self, i: usize) -> u16 {
        self.nodes[i].lock().unwrap().etcd_port
    }

    /// The node whose agent says it is the primary (`GET /primary` → 200),
    /// as HAProxy asks.
    pub fn primary(&self) -> Option<usize> {
        (0..2).find(|&i| {
            http(
                self.rest_port(i),
                "GET",
                "/primary",
                "",
                Duration::from_secs(2),
            )
            .is_some_and(|(status, _)| status == 200)
        })
    }

    /// One SQL statement on node `i` directly (not through the front);
    /// its output, or None when the node does not answer.
    pub fn sql_on(&self, i: usize, statement: &str) -> Option<String> {
        let port = self.nodes[i].lock().unwrap().pg_port;
        self.psql(port, statement)
    }

    fn psql(&self, port: u16, statement: &str) -> Option<String> {
        let out = Command::new(self.bindir.join("psql"))
            .arg(format!(
                "host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=2"
            ))
            .args(["-qtAX", "-c", statement])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Waits until HAProxy holds node `i` alone up, and a connection
    /// through the front lands on it and may write: what the pumps and
    /// producers see of a switch. (HAProxy starts with every server up,
    /// before its first check: a connection landing on the primary once
    /// proves nothing then.)
    pub fn wait_front_on(&self, i: usize, limit: Duration) -> Result<(), String> {
        let (name, port) = (
            self.name(i),
            self.nodes[i].lock().unwrap().pg_port.to_string(),
        );
        self.wait_for(
            limit,
            &format!("the front to reach node {name} alone"),
            || {
                self.servers_up() == [name]
                    && self
                        .psql(
                            self.front_port,
                            "select inet_server_port() where not pg_is_in_recovery()",
                        )
                        .is_some_and(|p| p == port)
            },
        )
    }

    /// The servers HAProxy gives connections to, from its stats socket
    /// (`show stat`: CSV, the status in the 18th column).
    fn servers_up(&self) -> Vec<String> {
        use std::io::{Read, Write};
        let Ok(mut socket) = std::os::unix::net::UnixStream::connect(self.dir.join("haproxy.sock"))
        else {
            return Vec::new();
        };
        let mut stat = String::new();
        if socket.write_all(b"show stat\n").is_err() || socket.read_to_string(&mut stat).is_err() {
            return Vec::new();
        }
        stat.lines()
            .map(|line| line.split(',').collect::<Vec<_>>())
            // "UP 1/2": going down, still given connections (how HAProxy
            // starts every server before its first check).
            .filter(|f| f.len() > 17 && f[0] == "postgres" && f[17].starts_with("UP"))
            .filter(|f| f[1] != "FRONTEND" && f[1] != "BACKEND")
            .map(|f| f[1].to_string())
            .collect()
    }

    /// Waits until primary `i` has the other node streaming from it and,
    /// in synchronous mode, Patroni names it the synchronous standby in
    /// etcd (`sync_standby` in `GET /cluster`): the cluster whole again.
    /// PostgreSQL calls a standby synchronous a moment before Patroni
    /// records it, and until then Patroni promotes no standby when the
    /// primary is lost (it might lack commits).
    pub fn wait_streaming(&self, i: usize, limit: Duration) -> Result<(), String> {
        let other = self.name(1 - i);
        let want = if self.synchronous { "sync" } else { "async" };
        let query = format!(
            "select count(*) from pg_stat_replication
             where application_name = '{other}' and state = 'streaming' and sync_state = '{want}'"
        );
        let recorded = format!(r#""name": "{other}", "role": "sync_standby""#);
        self.wait_for(
            limit,
            &format!("node {other} to stream from node {} ({want})", self.name(i)),
            || {
                self.sql_on(i, &query).as_deref() == Some("1")
                    && (!self.synchronous
                        || http(
                            self.rest_port(i),
                            "GET",
                            "/cluster",
                            "",
                            Duration::from_secs(2),
                        )
                        .is_some_and(|(status, body)| status == 200 && body.contains(&recorded)))
            },
        )
    }

    /// Polls `done` every 100 ms for `limit`; the error names what did not
    /// happen, with the end of each agent's log.
    pub fn wait_for(
        &self,
        limit: Duration,
        what: &str,
        mut done: impl FnMut() -> bool,
    ) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            if done() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "waited {limit:?} for {what} in vain; {}",
                    self.log_tails()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait(&self, limit: Duration, what: &str, done: impl FnMut() -> bool) {
        if let Err(e) = self.wait_for(limit, what, done) {
            panic!("{e}");
        }
    }

    /// The last lines of each agent's log, for a failure's message.
    fn log_tails(&self) -> String {
        let mut tails = Vec::new();
        for name in ["patroni-a", "patroni-b"] {
            let log =
                std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(8)..].join("\n  ");
            tails.push(format!("{name}.log ends:\n  {tail}"));
        }
        tails.join("\n")
    }

    /// The pid of node `i`'s WAL sender (to its standby), if any.
    pub fn wal_sender(&self, i: usize) -> Option<u32> {
        self.sql_on(i, "select pid from pg_stat_replication limit 1")
            .and_then(|p| p.parse().ok())
    }

    /// Node `i`'s machine dies: its agent, its postmaster and every
    /// PostgreSQL process of it are SIGKILLed at once.
    pub fn crash(&self, i: usize) {
        let mut n = self.nodes[i].lock().unwrap();
        let mut pids: Vec<u32> = Vec::new();
        if let Some(patroni) = &n.patroni {
            pids.push(patroni.pid());
        }
        if let Some(postmaster) = postmaster_of(&n.data) {
            pids.push(postmaster);
            pids.extend(children_of(postmaster));
        }
        daemon::signal("KILL", pids);
        if let Some(patroni) = n.patroni.take() {
            patroni.kill();
        }
    }

    /// Keeps the directory (logs, data) when dropped: the run failed.
    pub fn keep_for_a_look(&self) {
        self.failed.store(true, Ordering::SeqCst);
    }
}

/// The postmaster running on `data`, from its postmaster.pid, if it runs
/// (on that directory: a pid can be reused).
fn postmaster_of(data: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(data.join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    String::from_utf8_lossy(&cmdline)
        .contains(&*data.to_string_lossy())
        .then_some(pid)
}

fn children_of(pid: u32) -> Vec<u32> {
    let out = Command::new("pgrep")
        .args(["-P", &pid.to_string()])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    out.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// A PostgreSQL left running on `data` by an agent that was killed
/// (Patroni starts its postmaster detached): stopped at once.
fn stop_leftover_postmaster(data: &Path) {
    if let Some(postmaster) = postmaster_of(data) {
        eprintln!("stopping PostgreSQL on {} left running", data.display());
        let mut pids = vec![postmaster];
        pids.extend(children_of(postmaster));
        daemon::signal("KILL", pids);
        std::thread::sleep(Duration::from_millis(200));
    }
}

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        // The front first (no client reconnects meanwhile), then the agents
        // (each stops its PostgreSQL), then etcd.
        drop(
            self.haproxy
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        let mut nodes: Vec<_> = self
            .nodes
            .iter()
            .map(|n| n.lock().unwrap_or_else(|p| p.into_inner()))
            .collect();
        // Both at once: an agent left alone would take the leader key the
        // other gives up, and promote its node on the way out.
        for n in nodes.iter_mut() {
            if let Some(patroni) = n.patroni.as_mut() {
                patroni.terminate();
            }
        }
        for n in nodes.iter_mut() {
            drop(n.patroni.take());
            // An agent that was killed leaves its PostgreSQL behind.
            stop_leftover_postmaster(&n.data);
        }
        drop(nodes);
        drop(self.etcd.lock().unwrap_or_else(|p| p.into_inner()).take());
        if self.failed.load(Ordering::SeqCst) || std::thread::panicking() {
            eprintln!(
                "the Patroni cluster is stopped; its logs and data are kept in {}",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
