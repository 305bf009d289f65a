//! What hyper 1.x's own `http1::Builder::header_read_timeout` covers, checked
//! on loopback sockets against bare hyper (no edge), so that a hyper upgrade
//! that changes it shows up here. Findings (hyper 1.12):
//!
//! * with a timer, the clock starts when hyper is ready to read a head: at
//!   once for a new connection (even if the client sends nothing) and again
//!   right after each response on a keep-alive connection; so it is also
//!   the idle keep-alive timeout, with the same duration;
//! * it bounds the whole head, not each read: trickled header lines do not
//!   extend it;
//! * it does not cover the request body;
//! * without a timer (which is how `axum::serve` builds its connections) no
//!   header timeout applies at all: the 30 s default is ignored.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// Bare hyper HTTP/1 server; `header_read_timeout: None` means no timer
/// at all (like `axum::serve`). Answers with the request body's length.
async fn hyper_server(header_read_timeout: Option<Duration>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut builder = hyper::server::conn::http1::Builder::new();
                if let Some(t) = header_read_timeout {
                    builder.timer(TokioTimer::new()).header_read_timeout(t);
                }
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let body = axum::body::to_bytes(Body::new(req.into_body()), usize::MAX)
                        .await
                        .map(|b| b.len())
                        .unwrap_or(0);
                    Ok::<_, Infallible>(Response::new(Body::from(body.to_string())))
                });
                let _ = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// Waits up to `within` for EOF or reset; returns how long it took.
async fn closed_within(s: &mut TcpStream, within: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
    .map(|()| t0.elapsed())
}

async fn read_response(s: &mut TcpStream) -> io::Result<String> {
    // Responses here are tiny and arrive in one segment.
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyper_header_read_timeout_semantics() {
    let addr = hyper_server(Some(secs(1.0))).await;

    // 1. Connected but silent: closed by the header timeout.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let silent = closed_within(&mut s, secs(5.0)).await;
    println!("hyper, header_read_timeout 1 s, silent connection closed after {silent:?}");
    assert!(silent.is_some_and(|d| d >= secs(0.5)));

    // 2. Trickled headers (a line every 300 ms): one budget for the whole
    //    head, not reset per line.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 256];
    let trickle_closed = loop {
        tokio::select! {
            r = s.read(&mut buf) => match r {
                Ok(0) | Err(_) => break Some(t0.elapsed()),
                Ok(_) => panic!("hyper answered an incomplete head"),
            },
            () = tokio::time::sleep(secs(0.3)) => {
                if t0.elapsed() > secs(10.0) {
                    break None;
                }
                if s.write_all(b"X-Slow: 1\r\n").await.is_err() {
                    break Some(t0.elapsed());
                }
            }
        }
    };
    println!("hyper, trickled header lines: closed after {trickle_closed:?}");
    assert!(
        trickle_closed.is_some(),
        "trickled header lines kept the connection open"
    );

    // 3. Idle keep-alive after a response: closed after the same 1 s.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let first = read_response(&mut s).await.unwrap();
    assert!(first.starts_with("HTTP/1.1 200 "));
    let idle = closed_within(&mut s, secs(5.0)).await;
    println!("hyper, idle keep-alive connection closed after {idle:?}");
    assert!(idle.is_some());

    // 4. The body is not covered: a body trickled over ~3 s (3x the header
    //    timeout) is read to the end and answered.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 6\r\n\r\n")
        .await
        .unwrap();
    for _ in 0..6 {
        tokio::time::sleep(secs(0.5)).await;
        s.write_all(b"x").await.unwrap();
    }
    let reply = read_response(&mut s).await.unwrap();
    println!("hyper, body trickled over 3 s: {:?}", reply.lines().next());
    assert!(reply.starts_with("HTTP/1.1 200 ") && reply.ends_with("\r\n\r\n6"));
}

/// Without a timer (as `axum::serve` runs hyper) nothing closes a slow or
/// silent connection: this is the hole the edge closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_timer_hyper_has_no_header_timeout() {
    let addr = hyper_server(None).await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    assert!(closed_within(&mut silent, secs(3.0)).await.is_none());
    assert!(closed_within(&mut slow, secs(0.1)).await.is_none());
    println!("hyper without a timer: silent and slow-header connections still open after 3 s");
}

/// The same for `axum::serve` itself, as watchpump uses it today.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_serve_has_no_header_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 64];
    for _ in 0..3 {
        tokio::time::sleep(secs(1.0)).await;
        slow.write_all(b"X-Slow: 1\r\n").await.unwrap();
    }
    assert!(
        tokio::time::timeout(secs(0.1), slow.read(&mut buf))
            .await
            .is_err(),
        "axum::serve closed or answered"
    );
    println!(
        "axum::serve: slow-header connection still open after {:?}",
        t0.elapsed()
    );
}
