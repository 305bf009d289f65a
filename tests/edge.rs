//! The edge against real loopback sockets (127.0.0.1 only): slow-header
//! flood, connection cap, idle keep-alive, trickled body, stalled response,
//! graceful shutdown, and `ConnectInfo`.
//!
//! Timeouts are short (about 1 s) so the tests are quick. No test asserts
//! how long something took: a bound on waiting (10 to 20 times the timeout)
//! only keeps a broken server from hanging the test, and "still open after
//! N× the timeout" checks a timeout that must not fire. Numbers observed are
//! printed (`cargo nextest run --no-capture` shows them).

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::routing::{get, post};
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use watchpump::edge::{raise_open_file_limit, serve, EdgeLimits};

fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// Short timeouts for tests; each test overrides what it is about.
fn test_limits() -> EdgeLimits {
    EdgeLimits {
        header_read_timeout: secs(1.0),
        body_read_timeout: secs(3.0),
        idle_timeout: secs(30.0),
        write_timeout: secs(30.0),
        max_connections: 1000,
        max_connections_per_ip: None,
        shutdown_grace: secs(10.0),
        max_header_bytes: 16 * 1024,
    }
}

fn app(started: Option<mpsc::UnboundedSender<()>>) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route(
            "/ip",
            get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.ip().to_string() }),
        )
        .route(
            "/echo",
            post(|body: Bytes| async move { body.len().to_string() }),
        )
        .route(
            "/slow",
            get(move || async move {
                if let Some(started) = started {
                    let _ = started.send(());
                }
                tokio::time::sleep(secs(1.5)).await;
                "done"
            }),
        )
        .route(
            "/forever",
            get(|| async {
                std::future::pending::<()>().await;
                "never"
            }),
        )
        .route("/big", get(|| async { Body::from(vec![b'x'; 64 << 20]) }))
}

struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<io::Result<()>>,
}

impl Server {
    async fn start(limits: EdgeLimits) -> Server {
        Self::start_with(limits, app(None)).await
    }

    async fn start_with(limits: EdgeLimits, app: Router) -> Server {
        init_logs();
        // A backlog of 4096 (tokio's `bind` uses 1024) so that a burst of
        // thousands of connects is not slowed by SYN retries in the kernel.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(4096).unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, app, limits, "test", async move {
            let _ = rx.await;
        }));
        Server {
            addr,
            stop: Some(tx),
            task,
        }
    }

    fn shutdown(&mut self) {
        let _ = self.stop.take().unwrap().send(());
    }
}

struct Reply {
    status: u16,
    head: String,
    body: String,
}

/// Reads one HTTP/1.1 response with a content-length body from `s`, without
/// reading past it (the connection may be reused).
async fn read_reply(s: &mut TcpStream) -> io::Result<Reply> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    let status = head[9..12].parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await?;
    Ok(Reply {
        status,
        head,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

async fn send_get(s: &mut TcpStream, path: &str) -> io::Result<Reply> {
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes())
        .await?;
    read_reply(s).await
}

async fn get_fresh(addr: SocketAddr, path: &str) -> io::Result<Reply> {
    let mut s = TcpStream::connect(addr).await?;
    tokio::time::timeout(secs(10.0), send_get(&mut s, path))
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
}

/// Waits up to `within` for the server to close `s` (EOF or reset),
/// discarding anything it sends. Returns how long that took, or `None`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    let mut buf = [0u8; 4096];
    let result = tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    result.ok().map(|()| t0.elapsed())
}

/// The attack from the incident, scaled down: 2,000 connections that send a
/// request line and then one header line a second. The server must close
/// each once `header_read_timeout` (1 s) has passed, and keep answering a
/// normal request on a fresh connection meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_header_flood_is_cut_and_normal_requests_are_served() {
    let (soft, hard) = raise_open_file_limit().unwrap();
    const N: usize = 2000;
    assert!(
        soft >= 3 * N as u64 + 100,
        "open-file limit {soft}/{hard} too low"
    );
    let server = Server::start(EdgeLimits {
        max_connections: N + 100,
        ..test_limits()
    })
    .await;
    let addr = server.addr;

    let open = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let t_flood = Instant::now();
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..N {
        let open = open.clone();
        let peak = peak.clone();
        flood.spawn(async move {
            let mut s = TcpStream::connect(addr).await?;
            let t0 = Instant::now();
            let now_open = open.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now_open, Ordering::SeqCst);
            let mut lines = 0u32;
            let mut got_data = false;
            let outcome = async {
                s.write_all(b"GET / HTTP/1.1\r\n").await?;
                let mut buf = [0u8; 256];
                loop {
                    tokio::select! {
                        r = s.read(&mut buf) => match r {
                            Ok(0) | Err(_) => return Ok::<bool, io::Error>(true),
                            Ok(_) => got_data = true,
                        },
                        () = tokio::time::sleep(secs(1.0)) => {
                            if t0.elapsed() > secs(20.0) {
                                return Ok(false);
                            }
                            if s.write_all(b"X-Slow: 1\r\n").await.is_err() {
                                return Ok(true);
                            }
                            lines += 1;
                        }
                    }
                }
            }
            .await;
            open.fetch_sub(1, Ordering::SeqCst);
            let closed_by_server = outcome.unwrap_or(true);
            Ok::<_, io::Error>((closed_by_server, t0.elapsed(), lines, got_data))
        });
    }

    // Normal requests on fresh connections while the flood holds its
    // connections.
    let mut normal = Vec::new();
    for _ in 0..5 {
        tokio::time::sleep(secs(0.3)).await;
        let held = open.load(Ordering::SeqCst);
        let t0 = Instant::now();
        let reply = get_fresh(addr, "/")
            .await
            .expect("normal request during the flood");
        normal.push((held, reply.status, t0.elapsed()));
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, "ok");
    }

    let mut holds = Vec::new();
    let mut connect_errors = 0;
    let mut max_lines = 0;
    while let Some(joined) = flood.join_next().await {
        match joined.unwrap() {
            Ok((closed_by_server, held_for, lines, got_data)) => {
                assert!(
                    closed_by_server,
                    "a flood connection was still open after 20 s"
                );
                assert!(!got_data, "the server answered an incomplete request head");
                holds.push(held_for);
                max_lines = max_lines.max(lines);
            }
            Err(_) => connect_errors += 1,
        }
    }
    assert_eq!(connect_errors, 0);
    holds.sort();
    let all_closed_after = t_flood.elapsed();
    println!(
        "flood: {N} slow-header connections, peak held open at once {}, \
         hold time min {:?} median {:?} max {:?}, most header lines sent on one {max_lines}, \
         all closed {:?} after the flood began",
        peak.load(Ordering::SeqCst),
        holds[0],
        holds[N / 2],
        holds[N - 1],
        all_closed_after,
    );
    for (held, status, took) in &normal {
        println!("normal request with {held} flood connections open: {status} in {took:?}");
    }
    // The server still works after the flood.
    assert_eq!(get_fresh(addr, "/").await.unwrap().status, 200);
}

/// Over `max_connections`, a new connection gets a 503 with the JSON error
/// and `Connection: close` and is closed; once some connections close, new
/// ones are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_cap_gets_503_then_recovers() {
    const CAP: usize = 8;
    let server = Server::start(EdgeLimits {
        max_connections: CAP,
        header_read_timeout: secs(10.0),
        ..test_limits()
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..CAP {
        let mut s = TcpStream::connect(server.addr).await.unwrap();
        // A reply proves the server accepted it and holds its slot.
        assert_eq!(send_get(&mut s, "/").await.unwrap().status, 200);
        held.push(s);
    }

    let mut extra = TcpStream::connect(server.addr).await.unwrap();
    let refusal = tokio::time::timeout(secs(10.0), send_get(&mut extra, "/"))
        .await
        .expect("refusal arrives")
        .expect("refusal is a complete response");
    println!("refusal: {}\r\n{}", refusal.head.trim_end(), refusal.body);
    assert_eq!(refusal.status, 503);
    assert!(refusal.head.contains("connection: close"));
    assert!(refusal.head.contains("content-type: application/json"));
    assert!(refusal
        .body
        .starts_with(r#"{"error":{"code":"overloaded","message":"#));
    let closed = closed_within(&mut extra, secs(10.0)).await;
    assert!(closed.is_some(), "refused connection left open");

    // A connection that sends nothing is refused the same way.
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    let refusal = tokio::time::timeout(secs(10.0), read_reply(&mut silent))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(refusal.status, 503);

    // The held connections are unaffected.
    assert_eq!(send_get(&mut held[0], "/").await.unwrap().status, 200);

    // Free three slots; new connections are served again (eventually: the
    // server notices the close asynchronously).
    held.truncate(CAP - 3);
    let t0 = Instant::now();
    loop {
        let reply = get_fresh(server.addr, "/").await.unwrap();
        if reply.status == 200 {
            break;
        }
        assert_eq!(reply.status, 503);
        assert!(t0.elapsed() < secs(10.0), "slots never freed");
        tokio::time::sleep(secs(0.05)).await;
    }
    println!(
        "served again {:?} after closing 3 held connections",
        t0.elapsed()
    );
}

/// A kept-alive connection with no request is closed after `idle_timeout`,
/// and the idle timeout is distinct from the header timeout both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_is_closed_after_idle_timeout() {
    // Idle shorter than the header timeout: our watchdog closes it, not
    // hyper's timer (which is set to header + idle = 6 s).
    let short_idle = Server::start(EdgeLimits {
        idle_timeout: secs(1.0),
        header_read_timeout: secs(5.0),
        ..test_limits()
    })
    .await;
    let mut s = TcpStream::connect(short_idle.addr).await.unwrap();
    assert_eq!(send_get(&mut s, "/").await.unwrap().status, 200);
    let closed = closed_within(&mut s, secs(4.0)).await;
    println!("idle_timeout 1 s, header 5 s: idle connection closed after {closed:?}");
    assert!(closed.is_some(), "idle connection not closed within 4 s");

    // Idle longer than the header timeout: an idle connection survives well
    // past the header timeout and can be reused...
    let long_idle = Server::start(EdgeLimits {
        idle_timeout: secs(30.0),
        header_read_timeout: secs(1.0),
        ..test_limits()
    })
    .await;
    let mut s = TcpStream::connect(long_idle.addr).await.unwrap();
    assert_eq!(send_get(&mut s, "/").await.unwrap().status, 200);
    assert!(
        closed_within(&mut s, secs(3.0)).await.is_none(),
        "closed by the header timeout while idle"
    );
    assert_eq!(send_get(&mut s, "/").await.unwrap().status, 200);
    println!("idle_timeout 30 s, header 1 s: idle connection still served after 3 s idle");

    // ...but once bytes of a next request arrive, the header clock runs.
    s.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    let closed = closed_within(&mut s, secs(5.0)).await;
    println!("partial head on a kept-alive connection: closed after {closed:?}");
    assert!(closed.is_some());

    // And a connection that never sends anything is bounded by the header
    // timeout, not the idle one.
    let mut silent = TcpStream::connect(long_idle.addr).await.unwrap();
    let closed = closed_within(&mut silent, secs(5.0)).await;
    println!("silent new connection: closed after {closed:?}");
    assert!(closed.is_some());
}

/// A client that sends its headers and then trickles the body gets 408 when
/// `body_read_timeout` passes, and the connection is closed; a body that is
/// slow but finishes in time is accepted even though it took longer than the
/// header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickled_body_is_cut_off() {
    let server = Server::start(EdgeLimits {
        header_read_timeout: secs(1.0),
        body_read_timeout: secs(3.0),
        ..test_limits()
    })
    .await;

    // Slow but in time: 4 chunks 0.5 s apart (1.5 s > header timeout).
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 40\r\n\r\n")
        .await
        .unwrap();
    for _ in 0..4 {
        tokio::time::sleep(secs(0.5)).await;
        s.write_all(&[b'a'; 10]).await.unwrap();
    }
    let reply = read_reply(&mut s).await.unwrap();
    assert_eq!((reply.status, reply.body.as_str()), (200, "40"));

    // Trickled: 1 byte every 200 ms of a declared 1000.
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n")
        .await
        .unwrap();
    let t0 = Instant::now();
    let (mut rd, mut wr) = s.split();
    let trickle = async {
        for _ in 0..100 {
            tokio::time::sleep(secs(0.2)).await;
            if wr.write_all(b"x").await.is_err() {
                break;
            }
        }
    };
    let reply = async {
        let mut buf = Vec::new();
        let _ = rd.read_to_end(&mut buf).await;
        buf
    };
    let raw = tokio::select! {
        raw = reply => raw,
        () = trickle => panic!("trickled for 20 s without being cut off"),
    };
    let took = t0.elapsed();
    let text = String::from_utf8_lossy(&raw);
    println!("trickled body cut after {took:?}: {text:?}");
    assert!(text.starts_with("HTTP/1.1 408 "), "{text}");
    assert!(text.to_ascii_lowercase().contains("connection: close"));
    assert!(text.contains(r#""code":"request_timeout""#));

    // A handler that never reads the body answers at once; hyper then
    // closes the connection instead of waiting for the unread body.
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\nxx")
        .await
        .unwrap();
    let reply = read_reply(&mut s).await.unwrap();
    assert_eq!(reply.status, 200);
    assert!(closed_within(&mut s, secs(5.0)).await.is_some());
}

/// A client that requests a large response and never reads it is dropped
/// after `write_timeout` without progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_response_is_dropped_after_write_timeout() {
    let server = Server::start(EdgeLimits {
        write_timeout: secs(1.0),
        ..test_limits()
    })
    .await;
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(secs(4.0)).await;
    let mut total = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    let ended = tokio::time::timeout(secs(10.0), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => total += n,
            }
        }
    })
    .await;
    println!(
        "stalled reader: received {total} of {} bytes, then the connection ended",
        64 << 20
    );
    assert!(ended.is_ok(), "connection not ended");
    assert!(total < 64 << 20);
}

/// Shutdown lets an in-flight slow request finish, closes idle connections
/// at once, stops accepting, and then `serve` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_in_flight_request() {
    let (started_tx, mut started_rx) = mpsc::unbounded_channel();
    let mut server = Server::start_with(test_limits(), app(Some(started_tx))).await;

    let mut idle = TcpStream::connect(server.addr).await.unwrap();
    assert_eq!(send_get(&mut idle, "/").await.unwrap().status, 200);

    let mut slow = TcpStream::connect(server.addr).await.unwrap();
    slow.write_all(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    started_rx.recv().await.unwrap();

    let t0 = Instant::now();
    server.shutdown();
    let idle_closed = closed_within(&mut idle, secs(5.0)).await;
    assert!(
        idle_closed.is_some(),
        "idle connection kept open during shutdown"
    );

    let reply = tokio::time::timeout(secs(10.0), read_reply(&mut slow))
        .await
        .unwrap()
        .unwrap();
    let answered = t0.elapsed();
    assert_eq!((reply.status, reply.body.as_str()), (200, "done"));
    assert!(reply.head.contains("connection: close"));
    tokio::time::timeout(secs(10.0), &mut server.task)
        .await
        .expect("serve returned")
        .unwrap()
        .unwrap();
    println!(
        "shutdown: idle closed after {idle_closed:?}, in-flight answered after {answered:?}, \
         serve returned after {:?}",
        t0.elapsed()
    );
    assert!(
        TcpStream::connect(server.addr).await.is_err(),
        "still accepting"
    );
}

/// A request that never finishes does not hold shutdown beyond the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_grace_is_bounded() {
    let mut server = Server::start(EdgeLimits {
        shutdown_grace: secs(1.0),
        ..test_limits()
    })
    .await;
    let mut stuck = TcpStream::connect(server.addr).await.unwrap();
    stuck
        .write_all(b"GET /forever HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(secs(0.3)).await;
    let t0 = Instant::now();
    server.shutdown();
    tokio::time::timeout(secs(10.0), &mut server.task)
        .await
        .expect("serve returned within the bound")
        .unwrap()
        .unwrap();
    println!(
        "shutdown with a stuck request returned after {:?}",
        t0.elapsed()
    );
    assert!(closed_within(&mut stuck, secs(5.0)).await.is_some());
}

/// Handlers get the client's address through `ConnectInfo<SocketAddr>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_info_is_available() {
    let server = Server::start(test_limits()).await;
    let reply = get_fresh(server.addr, "/ip").await.unwrap();
    assert_eq!((reply.status, reply.body.as_str()), (200, "127.0.0.1"));
}

/// Invalid limits are refused up front rather than misbehaving later.
#[tokio::test]
async fn invalid_limits_are_an_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = serve(
        listener,
        app(None),
        EdgeLimits {
            max_connections: 0,
            ..test_limits()
        },
        "test",
        async {},
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
}

async fn connect_from(source: &str, addr: SocketAddr) -> io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(format!("{source}:0").parse().unwrap())?;
    socket.connect(addr).await
}

#[derive(Debug, Default)]
struct FloodOutcome {
    /// Got the 503 refusal.
    refused_503: usize,
    /// Closed without a reply in under 1 s: over the cap while all refusal
    /// slots were busy.
    closed_at_once: usize,
    /// Closed without a reply after 1 s or more: held, then cut by the
    /// header timeout (2 s).
    closed_by_timeout: usize,
    other: usize,
    longest_hold: Duration,
}

/// `n` slow-header connections from 127.0.0.1; waits for all to end.
fn spawn_flood(addr: SocketAddr, n: usize) -> JoinHandle<FloodOutcome> {
    tokio::spawn(async move {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..n {
            set.spawn(async move {
                let mut s = TcpStream::connect(addr).await?;
                let t0 = Instant::now();
                s.write_all(b"GET / HTTP/1.1\r\n").await?;
                let mut got = Vec::new();
                let mut buf = [0u8; 512];
                loop {
                    tokio::select! {
                        r = s.read(&mut buf) => match r {
                            Ok(0) | Err(_) => break,
                            Ok(k) => got.extend_from_slice(&buf[..k]),
                        },
                        () = tokio::time::sleep(secs(1.0)) => {
                            assert!(t0.elapsed() < secs(20.0), "flood connection held 20 s");
                            if s.write_all(b"X-Slow: 1\r\n").await.is_err() {
                                break;
                            }
                        }
                    }
                }
                Ok::<_, io::Error>((got, t0.elapsed()))
            });
        }
        let mut out = FloodOutcome::default();
        while let Some(r) = set.join_next().await {
            match r.unwrap() {
                Ok((got, held)) if got.starts_with(b"HTTP/1.1 503 ") => {
                    out.refused_503 += 1;
                    let _ = held;
                }
                Ok((got, held)) if got.is_empty() => {
                    if held < secs(1.0) {
                        out.closed_at_once += 1;
                    } else {
                        out.closed_by_timeout += 1;
                    }
                    out.longest_hold = out.longest_hold.max(held);
                }
                _ => out.other += 1,
            }
        }
        out
    })
}

/// A flood larger than the listener's cap from one address: with the
/// per-address cap, the flooder gets 503s beyond its share and a client on
/// another address (127.0.0.2) is still served; every flood connection is
/// either refused with a 503 or closed by the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flood_over_the_cap_with_per_ip_limit() {
    raise_open_file_limit().unwrap();
    const N: usize = 3000;
    let server = Server::start(EdgeLimits {
        max_connections: 1000,
        max_connections_per_ip: Some(200),
        header_read_timeout: secs(2.0),
        ..test_limits()
    })
    .await;
    let flood = spawn_flood(server.addr, N);
    let mut normal = Vec::new();
    for _ in 0..6 {
        tokio::time::sleep(secs(0.4)).await;
        let mut s = connect_from("127.0.0.2", server.addr).await.unwrap();
        let reply = tokio::time::timeout(secs(10.0), send_get(&mut s, "/"))
            .await
            .unwrap()
            .unwrap();
        normal.push(reply.status);
    }
    let out = flood.await.unwrap();
    println!("per-ip 200, cap 1000, {N} flood connections: {out:?}; other client got {normal:?}");
    assert!(normal.iter().all(|&s| s == 200));
    assert_eq!(out.other, 0);
    assert_eq!(
        out.refused_503 + out.closed_at_once + out.closed_by_timeout,
        N
    );
    assert!(out.refused_503 > 0);
}

/// The same flood without a per-address cap fills the listener: the other
/// client then gets a clean 503 (never a hang), and the listener recovers
/// once the header timeout has emptied it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flood_over_the_cap_without_per_ip_limit() {
    raise_open_file_limit().unwrap();
    const N: usize = 3000;
    let server = Server::start(EdgeLimits {
        max_connections: 1000,
        max_connections_per_ip: None,
        header_read_timeout: secs(2.0),
        ..test_limits()
    })
    .await;
    let flood = spawn_flood(server.addr, N);
    let mut normal = Vec::new();
    for _ in 0..6 {
        tokio::time::sleep(secs(0.4)).await;
        let mut s = connect_from("127.0.0.2", server.addr).await.unwrap();
        let reply = tokio::time::timeout(secs(10.0), send_get(&mut s, "/"))
            .await
            .expect("an answer, not a hang")
            .unwrap();
        normal.push(reply.status);
    }
    let out = flood.await.unwrap();
    println!(
        "no per-ip cap, cap 1000, {N} flood connections: {out:?}; other client got {normal:?}"
    );
    assert!(normal.iter().all(|&s| s == 200 || s == 503));
    assert_eq!(out.other, 0);
    assert_eq!(
        out.refused_503 + out.closed_at_once + out.closed_by_timeout,
        N
    );
    assert_eq!(get_fresh(server.addr, "/").await.unwrap().status, 200);
}

/// A request head over `max_header_bytes` gets 431 instead of growing the
/// connection's buffer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_head_gets_431() {
    let server = Server::start(EdgeLimits {
        max_header_bytes: 16 * 1024,
        ..test_limits()
    })
    .await;
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    let big = "a".repeat(32 * 1024);
    s.write_all(format!("GET / HTTP/1.1\r\nHost: t\r\nX-Big: {big}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let reply = tokio::time::timeout(secs(10.0), read_reply(&mut s))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reply.status, 431);
    // Within the limit is fine.
    let ok = "a".repeat(8 * 1024);
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(format!("GET / HTTP/1.1\r\nHost: t\r\nX-Big: {ok}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_reply(&mut s).await.unwrap().status, 200);
}

/// A real HTTP client (reqwest, on hyper) over the cap gets the 503 as an
/// answer, not an "unsolicited response" error: the refusal waits for the
/// request to begin before it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_client_over_the_cap_reads_the_503() {
    let server = Server::start(EdgeLimits {
        max_connections: 1,
        header_read_timeout: secs(10.0),
        ..test_limits()
    })
    .await;
    let mut held = TcpStream::connect(server.addr).await.unwrap();
    assert_eq!(send_get(&mut held, "/").await.unwrap().status, 200);
    let client = reqwest::Client::new();
    for n in 0..20 {
        let resp = client
            .get(format!("http://{}/", server.addr))
            .send()
            .await
            .unwrap_or_else(|e| panic!("request {n}: the refusal is an answer: {e:?}"));
        assert_eq!(resp.status(), 503);
        let body = resp.text().await.unwrap();
        assert!(body.contains(r#""code":"overloaded""#), "{body}");
    }
}
