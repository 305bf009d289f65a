//! Accepting at the open-file limit: `accept` fails with EMFILE while the
//! descriptor table is full; the server must neither spin nor stop, and must
//! serve the waiting connection once descriptors are free again.
//!
//! Its own test binary (one test): it lowers this process's soft
//! RLIMIT_NOFILE and fills the descriptor table, which would break any test
//! running beside it.

use std::fs::File;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use watchpump::edge::{serve, EdgeLimits};

fn cpu_time() -> Duration {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct we own.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) }, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn set_soft_nofile(soft: u64) {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain libc calls on a struct we own.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl), 0);
        rl.rlim_cur = soft as libc::rlim_t;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &rl), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_at_emfile_backs_off_and_recovers() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    set_soft_nofile(256);

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().route("/", get(|| async { "ok" }));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        listener,
        app,
        EdgeLimits {
            max_connections: 10_000, // far above the descriptors there are
            ..EdgeLimits::default()
        },
        "test",
        async move {
            let _ = stop_rx.await;
        },
    ));

    // Fill the descriptor table, then free exactly one for the client.
    let mut fillers = Vec::new();
    loop {
        match File::open("/dev/null") {
            Ok(f) => fillers.push(f),
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) => break,
            Err(e) => panic!("{e}"),
        }
    }
    fillers.pop();
    let mut client = TcpStream::connect(addr).await.unwrap();
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();

    // The server cannot accept it now: no answer, no spinning.
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let mut buf = [0u8; 1024];
    let early = tokio::time::timeout(Duration::from_secs(2), client.read(&mut buf)).await;
    let cpu = cpu_time() - cpu0;
    let wall = t0.elapsed();
    println!(
        "at EMFILE ({} descriptors held by the test): {cpu:?} CPU in {wall:?} wall",
        fillers.len()
    );
    assert!(early.is_err(), "answered although no descriptor was free");
    assert!(!server.is_finished(), "serve() ended on EMFILE");
    // Spinning shows as CPU time close to the 2 s of wall time; a loop that
    // backs off uses a few milliseconds. Measured in CPU time, not wall
    // time, so a busy machine does not make this fail.
    assert!(
        cpu < Duration::from_millis(500),
        "accept loop spins: {cpu:?} CPU in {wall:?}"
    );

    // Free descriptors: the waiting connection is accepted and served.
    fillers.truncate(fillers.len() - 20);
    let t1 = Instant::now();
    let n = tokio::time::timeout(Duration::from_secs(10), client.read(&mut buf))
        .await
        .expect("served after descriptors were freed")
        .unwrap();
    let reply = String::from_utf8_lossy(&buf[..n]);
    println!(
        "served {:?} after freeing descriptors: {:?}",
        t1.elapsed(),
        reply.lines().next()
    );
    assert!(reply.starts_with("HTTP/1.1 200 "));

    drop(fillers);
    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
}
