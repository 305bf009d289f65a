//! `kit::serve`: the kit's endpoint on watchpump's edge, over real loopback
//! sockets. Idle, slow-header and slow-body connections are closed within
//! the limits (short ones, so the tests are quick; bounds on waiting are
//! only hang guards, 10 to 20 times the limit, never timed assertions); a
//! flood of connections from one address leaves room for a genuine
//! delivery; and a path with CR, LF and ESC cannot forge a log line.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::oneshot;
use watchpump::kit::{self, WatchRequest};

use crate::common::{operator_config, AppServer, TestDb, PRODUCER, PRODUCER_TOKEN};
use crate::support::{delivery, endpoint, now, post, signed, Consumer, Work, WORK_SCHEMA};

const MAIN: &str = "acme/web/refs/heads/main";
/// How long a test waits for something that must happen well within a
/// limit of 0.5 s: a guard against a hang, not a measure.
const GUARD: Duration = Duration::from_secs(10);

fn limits() -> kit::Limits {
    kit::Limits {
        header_read_timeout: Duration::from_millis(500),
        body_read_timeout: Duration::from_millis(500),
        idle_timeout: Duration::from_millis(500),
        write_timeout: Duration::from_secs(5),
        max_connections: 32,
        max_connections_per_ip: Some(8),
        shutdown_grace: Duration::from_secs(1),
        max_header_bytes: 16 * 1024,
    }
}

/// `app` on a loopback port through `kit::serve`, until dropped.
struct KitServer {
    addr: SocketAddr,
    _stop: oneshot::Sender<()>,
}

impl KitServer {
    async fn start(app: Router, limits: kit::Limits) -> KitServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(kit::serve(listener, app, limits, async move {
            let _ = stopped.await;
        }));
        KitServer { addr, _stop: stop }
    }

    fn events_url(&self) -> String {
        format!("http://{}/api/v1/{PRODUCER}/events", self.addr)
    }
}

/// A registered consumer (its database, its watch on `MAIN`) and its
/// endpoint served by `kit::serve` within `limits`.
async fn consumer_on_edge(limits: kit::Limits) -> (TestDb, Consumer, i64, KitServer) {
    let producer = TestDb::new().await;
    let api = AppServer::start(&producer.pool, &operator_config()).await;
    let work = Work::default();
    let us = Consumer::start(&producer, &api, "deploy", WORK_SCHEMA, work.clone()).await;
    let watch = us.watch(WatchRequest::new("app-1", MAIN)).await;
    let app = endpoint(&us.db.pool, vec![us.secret.clone()], work);
    let server = KitServer::start(app, limits).await;
    (producer, us, watch, server)
}

/// Reads until the server closes the connection; what it sent meanwhile.
/// Panics when the connection is still open after [`GUARD`].
async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(GUARD, stream.read(&mut buf)).await {
            Err(_) => panic!(
                "still open after {GUARD:?}; received {:?}",
                String::from_utf8_lossy(&seen)
            ),
            Ok(Ok(0)) | Ok(Err(_)) => return String::from_utf8_lossy(&seen).into_owned(),
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test]
async fn idle_slow_header_and_slow_body_connections_are_closed_within_the_limits() {
    let (_producer, _us, _watch, server) = consumer_on_edge(limits()).await;

    // Connected and silent: closed without an answer.
    let mut idle = TcpStream::connect(server.addr).await.unwrap();
    assert_eq!(read_to_close(&mut idle).await, "", "idle connection");

    // A header line every 100 ms: trickling does not extend the limit.
    let mut slow = TcpStream::connect(server.addr).await.unwrap();
    slow.write_all(format!("POST /api/v1/{PRODUCER}/events HTTP/1.1\r\n").as_bytes())
        .await
        .unwrap();
    let trickle = tokio::time::timeout(GUARD, async {
        let mut n = 0;
        while slow
            .write_all(format!("x-trickle-{n}: 1\r\n").as_bytes())
            .await
            .is_ok()
        {
            n += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut probe = [0u8; 1];
            if let Ok(Ok(0) | Err(_)) =
                tokio::time::timeout(Duration::from_millis(1), slow.read(&mut probe)).await
            {
                return n;
            }
        }
        n
    })
    .await
    .expect("a trickled header was not cut");
    println!("trickled header lines before the cut: {trickle}");

    // Headers with the producer's token, then a body that never completes:
    // the endpoint reads the body, which times out: 408 and close.
    let mut body = TcpStream::connect(server.addr).await.unwrap();
    let head = format!(
        "POST /api/v1/{PRODUCER}/events HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {PRODUCER_TOKEN}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"delivery_id\""
    );
    body.write_all(head.as_bytes()).await.unwrap();
    let answer = read_to_close(&mut body).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "slow body: {answer:?}");

    // A complete request, then nothing: the kept-alive connection is
    // closed after the idle limit.
    let mut kept = TcpStream::connect(server.addr).await.unwrap();
    kept.write_all(b"GET /api/v1/git/events HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = read_to_close(&mut kept).await;
    assert!(answer.starts_with("HTTP/1.1 405"), "kept-alive: {answer:?}");
}

/// A connection from `from`, left silent (or refused by the edge).
async fn connect_from(from: IpAddr, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    socket.connect(to).await.unwrap()
}

#[tokio::test]
async fn a_connection_flood_leaves_room_for_a_genuine_delivery() {
    // Headers may take 30 s here, so that the flood's connections are held
    // for the whole test rather than cut.
    let limits = kit::Limits {
        header_read_timeout: Duration::from_secs(30),
        ..limits()
    };
    let (_producer, us, watch, server) = consumer_on_edge(limits.clone()).await;

    // Each flood connection begins a request it never finishes (a refusal
    // waits for a request to begin before it answers 503).
    let flooder = IpAddr::from([127, 0, 0, 3]);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..(limits.max_connections * 3) {
        let to = server.addr;
        tasks.spawn(async move {
            let mut stream = connect_from(flooder, to).await;
            let _ = stream
                .write_all(b"POST /api/v1/git/events HTTP/1.1\r\n")
                .await;
            // Held: no answer and still open after 3 s (the header limit
            // here is 30 s). Refused: a 503, or, when refusals come faster
            // than the edge's refusal slots, a close or reset.
            let mut buf = [0u8; 64];
            let read = tokio::time::timeout(Duration::from_secs(3), stream.read(&mut buf)).await;
            let answered_503 = matches!(read, Ok(Ok(n)) if buf[..n].starts_with(b"HTTP/1.1 503"));
            (stream, read.is_err(), answered_503)
        });
    }
    let flood: Vec<(TcpStream, bool, bool)> = tasks.join_all().await;
    let held = flood.iter().filter(|(_, held, _)| *held).count();
    let answered_503 = flood.iter().filter(|(_, _, refused)| *refused).count();
    println!(
        "flood: {} connections, {held} held, {answered_503} answered 503",
        flood.len()
    );
    assert_eq!(
        held,
        limits.max_connections_per_ip.unwrap(),
        "the per-address cap did not hold"
    );
    assert!(answered_503 > 0, "no refusal was a 503");

    // The producer's delivery, from another address, gets through and its
    // work commits, while the flood's connections are still held.
    let body = serde_json::to_vec(&delivery(7, watch, MAIN, 1)).unwrap();
    let (status, answer) = post(
        &server.events_url(),
        &signed(7, now(), &body, &us.secret),
        body,
    )
    .await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("done")));
    assert_eq!(us.db.work_and_inbox().await, (1, 1));
    drop(flood);
}

/// A `MakeWriter` that appends everything logged to one buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

#[tokio::test]
async fn a_path_with_cr_lf_and_esc_cannot_forge_a_log_line() {
    let (_producer, _us, _watch, server) = consumer_on_edge(limits()).await;
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    // This test's runtime has one thread, which runs the server's tasks
    // too: the thread's default subscriber sees their events.
    let _logging = tracing::subscriber::set_default(subscriber);

    let forged = "x%0D%0A2026-01-01T00:00:00Z%20INFO%20FORGED%1B[31mred";
    let url = format!("http://{}/api/v1/{forged}/events", server.addr);
    let (status, answer) = post(&url, &[], b"{}".to_vec()).await;
    assert_eq!(status, 404, "{answer}");

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let refused: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("delivery refused"))
        .collect();
    assert_eq!(refused.len(), 1, "the refusal was not logged once: {text}");
    assert!(
        refused[0].contains(r#"x\r\n2026-01-01T00:00:00Z INFO FORGED\u{1b}[31mred"#),
        "the path is not logged escaped: {text}"
    );
    assert!(
        !text.contains('\r') && !text.contains('\u{1b}'),
        "raw CR or ESC in the log: {text:?}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("2026-01-01")),
        "a forged line: {text}"
    );
    // Nor is the answer a way to smuggle them.
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        !message.contains('\r') && !message.contains('\u{1b}'),
        "{message:?}"
    );
}
