//! Issue 9's incident, end to end: a real `watchpump serve` child process
//! whose open-file limit (2048) is lower than the number of slow-header
//! connections thrown at it (3000, each re-opened as soon as it is closed),
//! while its pump delivers to a healthy consumer on loopback.
//!
//! Without the edge the child would run out of descriptors: the API would
//! stop answering and the pump could not connect to the consumer. With it,
//! deliveries go on, and a normal API request gets an answer:
//!
//! 1. one flooding address, the default per-address cap: the other client
//!    (127.0.0.2) is served 200;
//! 2. the per-address cap off (as behind a proxy): the flood fills the API
//!    listener to its budget, the other client gets a complete answer (a 200
//!    or the 503 refusal, never a hang), and the pump, whose descriptors are
//!    reserved, still delivers.
//!
//! Nothing is timed: bounds on waiting are hang guards. The numbers seen are
//! printed (`--no-capture`).

mod common;

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const OPEN_FILES: u64 = 2048;
const FLOOD: usize = 3000;
const DELIVERIES: usize = 20;
const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_header_flood_past_the_open_file_limit_stops_neither_deliveries_nor_the_api() {
    watchpump::edge::raise_open_file_limit().unwrap();
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (service, token) = db.add_service("deploy", &consumer.base_url()).await;
    db.add_watch(service.id, "web", "acme/", all()).await;

    let one = Scenario::run(&db, &consumer, &token, "128", 0).await;
    assert_eq!(one.api_status, 200, "{one:#?}");
    assert_eq!(one.flood.answered, 0, "{one:#?}");
    assert!(
        one.flood.refused > 0,
        "the per-address cap never refused: {one:#?}"
    );

    let many = Scenario::run(&db, &consumer, &token, "0", DELIVERIES).await;
    assert!(
        many.api_status == 200 || many.api_status == 503,
        "{many:#?}"
    );
    assert!(
        many.flood.peak_open >= many.api_budget,
        "the flood never filled the listener: {many:#?}"
    );
    assert_eq!(many.flood.answered, 0, "{many:#?}");
}

/// What one run saw (printed, hence Debug only for some fields).
#[derive(Debug)]
#[allow(dead_code)]
struct Scenario {
    /// The API listener's cap, from the child's "connection budget" line.
    api_budget: usize,
    flood: FloodStats,
    /// The other client's answer during the flood.
    api_status: u16,
    delivered_during_flood: usize,
}

impl Scenario {
    /// Starts a child with `per_ip` as its per-address cap, floods it from
    /// 127.0.0.1 until `DELIVERIES` changes have been delivered and the
    /// other client has had its answer, then checks it recovers and stops
    /// cleanly. `already` deliveries were made by earlier runs.
    async fn run(
        db: &TestDb,
        consumer: &Receiver,
        token: &str,
        per_ip: &str,
        already: usize,
    ) -> Scenario {
        let child = Child::start(db, per_ip).await;
        let api_budget = child.budget();
        let flood = Flood::start(child.addr, FLOOD);
        // The flood is in full swing once the listener refuses connections
        // and the header timeout has cut some it held (they re-open).
        eventually(WAIT, "the flood reaches a cap and is cut", || async {
            let stats = flood.stats();
            stats.refused > 0 && stats.cut > 0
        })
        .await;

        for n in 0..DELIVERIES {
            db.emit(&format!("acme/{per_ip}/{n}"), "push", json!({ "n": n }))
                .await;
        }
        consumer.wait_for(already + DELIVERIES, WAIT).await;
        let api_status = get_watches(child.addr, token).await;
        let stats = flood.stop().await;
        let scenario = Scenario {
            api_budget,
            flood: stats,
            api_status,
            delivered_during_flood: consumer.count() - already,
        };
        println!("per-address cap {per_ip}: {scenario:#?}");

        // Once the flood is gone, the API serves everyone again.
        eventually(WAIT, "the API answers 200 after the flood", || async {
            get_watches(child.addr, token).await == 200
        })
        .await;
        child.stop_and_check();
        scenario
    }
}

/// `GET /api/v1/watches` from 127.0.0.2, as a normal client; the status of
/// the complete answer. A hang fails the test. A failed request is tried
/// again (four times at most): when more connections are refused at once
/// than the edge has refusal slots, it writes the 503 without waiting for
/// the request and closes, which a client can see as an unsolicited answer
/// or a reset.
async fn get_watches(addr: SocketAddr, token: &str) -> u16 {
    let client = reqwest::Client::builder()
        .local_address(IpAddr::from([127, 0, 0, 2]))
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut tries = 0;
    let resp = loop {
        tries += 1;
        match client
            .get(format!("http://{addr}/api/v1/watches"))
            .bearer_auth(token)
            .send()
            .await
        {
            Ok(resp) => break resp,
            Err(e) if tries < 5 && !e.is_timeout() => {
                println!(
                    "normal request: {e} ({:?}); again",
                    std::error::Error::source(&e)
                )
            }
            Err(e) => panic!("no answer from the API during the flood: {e}"),
        }
    };
    let status = resp.status().as_u16();
    let body = resp.text().await.expect("the whole answer");
    if status == 503 {
        assert!(body.contains(r#""code":"overloaded""#), "{body}");
    }
    status
}

/// The `watchpump serve` child, with `OPEN_FILES` as its hard and soft
/// open-file limit, killed on drop.
struct Child {
    process: KillOnDrop,
    addr: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Child {
    async fn start(db: &TestDb, per_ip: &str) -> Child {
        let port = free_port();
        let mut cmd = watchpump_cli(Some(&db.url));
        cmd.arg("serve")
            .env("WATCHPUMP_LISTEN", format!("127.0.0.1:{port}"))
            .env("WATCHPUMP_METRICS_LISTEN", "off")
            .env("WATCHPUMP_PRODUCER", PRODUCER)
            .env("WATCHPUMP_PRODUCER_TOKEN", PRODUCER_TOKEN)
            .env("WATCHPUMP_SWEEP_INTERVAL_MS", "200")
            .env("WATCHPUMP_HEADER_TIMEOUT_MS", "2000")
            .env("WATCHPUMP_MAX_CONNECTIONS_PER_IP", per_ip)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: setrlimit is async-signal-safe and touches only the child.
        unsafe {
            cmd.pre_exec(|| {
                let limit = libc::rlimit {
                    rlim_cur: OPEN_FILES as libc::rlim_t,
                    rlim_max: OPEN_FILES as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut process = KillOnDrop(cmd.spawn().unwrap());
        let logs = Arc::new(Mutex::new(Vec::new()));
        let stderr = process.0.stderr.take().unwrap();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(without_ansi(&line));
            }
        });
        let child = Child {
            process,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            logs,
        };
        let http = reqwest::Client::new();
        eventually(WAIT, "serve answers /healthz", || async {
            http.get(format!("http://{}/healthz", child.addr))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
        })
        .await;
        child
    }

    fn log(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    /// `api_connections` from the "connection budget" log line.
    fn budget(&self) -> usize {
        // The line is written before the API listens, but the thread that
        // reads stderr may not have read it yet when /healthz answers.
        let started = std::time::Instant::now();
        while !self.log().contains("connection budget") && started.elapsed() < WAIT {
            std::thread::sleep(Duration::from_millis(20));
        }
        let log = self.log();
        let line = log
            .lines()
            .find(|l| l.contains("connection budget"))
            .unwrap_or_else(|| panic!("no budget logged:\n{log}"));
        let value = line.split("api_connections=").nth(1).unwrap();
        let budget: usize = value.split(' ').next().unwrap().parse().unwrap();
        assert!(
            budget < OPEN_FILES as usize,
            "the budget ignores the open-file limit: {line}"
        );
        budget
    }

    /// SIGTERM; the child must exit 0 and never have failed to accept or
    /// connect for lack of descriptors.
    fn stop_and_check(mut self) {
        let pid = self.process.0.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        let status = self.process.0.wait().unwrap();
        let log = self.log();
        assert_eq!(status.code(), Some(0), "serve after SIGTERM:\n{log}");
        for sign in ["Too many open files", "accept failed"] {
            assert!(!log.contains(sign), "{sign}:\n{log}");
        }
    }
}

/// `line` without terminal colour codes (`ESC [ ... m`).
fn without_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| *c == 'm');
        } else {
            out.push(c);
        }
    }
    out
}

/// What the flood's connections met (printed, hence Debug only for some
/// fields).
#[derive(Debug, Default, Clone)]
#[allow(dead_code)]
struct FloodStats {
    /// Connections opened in all (each flooder re-opens as soon as it is
    /// closed).
    opened: usize,
    /// Answered 503 (a connection cap) and closed.
    refused: usize,
    /// Closed without an answer: the header timeout.
    cut: usize,
    connect_errors: usize,
    /// Answered anything but 503: must stay 0 (a head never completes).
    answered: usize,
    /// Most flood connections open at once (client side: held by the
    /// server, or waiting in its accept queue).
    peak_open: usize,
}

#[derive(Default)]
struct Counters {
    opened: AtomicUsize,
    refused: AtomicUsize,
    cut: AtomicUsize,
    connect_errors: AtomicUsize,
    answered: AtomicUsize,
    open: AtomicUsize,
    peak_open: AtomicUsize,
}

/// `n` slow-header clients from 127.0.0.1, each sending a request line and
/// then a header line a second, and re-opening when closed, until stopped.
struct Flood {
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    tasks: tokio::task::JoinSet<()>,
}

impl Flood {
    fn start(addr: SocketAddr, n: usize) -> Flood {
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..n {
            let (counters, stop) = (counters.clone(), stop.clone());
            tasks.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    flood_once(addr, &counters, &stop).await;
                    // A pause before re-opening: this is a slow flood, not
                    // a connection-rate attack.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            });
        }
        Flood {
            counters,
            stop,
            tasks,
        }
    }

    fn stats(&self) -> FloodStats {
        let c = &self.counters;
        FloodStats {
            opened: c.opened.load(Ordering::SeqCst),
            refused: c.refused.load(Ordering::SeqCst),
            cut: c.cut.load(Ordering::SeqCst),
            connect_errors: c.connect_errors.load(Ordering::SeqCst),
            answered: c.answered.load(Ordering::SeqCst),
            peak_open: c.peak_open.load(Ordering::SeqCst),
        }
    }

    async fn stop(mut self) -> FloodStats {
        self.stop.store(true, Ordering::SeqCst);
        while self.tasks.join_next().await.is_some() {}
        self.stats()
    }
}

/// One slow-header connection, until the server closes it or the flood stops.
async fn flood_once(addr: SocketAddr, c: &Counters, stop: &AtomicBool) {
    let Ok(mut s) = TcpStream::connect(addr).await else {
        c.connect_errors.fetch_add(1, Ordering::SeqCst);
        return;
    };
    c.opened.fetch_add(1, Ordering::SeqCst);
    let open = c.open.fetch_add(1, Ordering::SeqCst) + 1;
    c.peak_open.fetch_max(open, Ordering::SeqCst);
    let mut answer = Vec::new();
    if s.write_all(b"GET /api/v1/watches HTTP/1.1\r\nHost: flood\r\n")
        .await
        .is_ok()
    {
        let mut buf = [0u8; 512];
        while !stop.load(Ordering::Relaxed) {
            tokio::select! {
                r = s.read(&mut buf) => match r {
                    Ok(0) | Err(_) => break,
                    Ok(k) => answer.extend_from_slice(&buf[..k]),
                },
                () = tokio::time::sleep(Duration::from_secs(1)) => {
                    if s.write_all(b"X-Slow: 1\r\n").await.is_err() {
                        break;
                    }
                }
            }
        }
    }
    c.open.fetch_sub(1, Ordering::SeqCst);
    if answer.starts_with(b"HTTP/1.1 503 ") {
        c.refused.fetch_add(1, Ordering::SeqCst);
    } else if !answer.is_empty() {
        c.answered.fetch_add(1, Ordering::SeqCst);
    } else if !stop.load(Ordering::Relaxed) {
        c.cut.fetch_add(1, Ordering::SeqCst);
    }
}

/// Issue 17: the outbound reserve does not grow with the number of
/// services (352 services at 64 connections each left the API listener 1
/// connection, and one idle client then got everyone else 503). With 400
/// services the child's API keeps what it has with none, and another client
/// is served while an idle, unauthenticated connection is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_services_leave_the_api_listener_its_connections() {
    watchpump::edge::raise_open_file_limit().unwrap();
    let db = TestDb::new().await;
    let (_, token) = db.add_service("deploy", "http://127.0.0.1:9").await;
    let child = Child::start(&db, "128").await;
    let alone = child.budget();
    child.stop_and_check();
    for i in 0..400 {
        db.add_service(&format!("svc{i}"), "http://127.0.0.1:9")
            .await;
    }
    let child = Child::start(&db, "128").await;
    let many = child.budget();
    println!("api_connections: {alone} with 1 service, {many} with 401");
    assert_eq!(many, alone);
    assert!(many >= watchpump::edge::config::API_FLOOR, "{many}");
    let _idle = TcpStream::connect(child.addr).await.unwrap();
    assert_eq!(get_watches(child.addr, &token).await, 200);
    child.stop_and_check();
}
