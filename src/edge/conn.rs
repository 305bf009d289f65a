//! One connection: hyper's HTTP/1 connection future under a watchdog that
//! enforces the header and idle clocks (`ConnState`), and an I/O wrapper
//! that ends a write the client stopped reading (`EdgeIo`).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio::time::{Instant, Sleep};

use super::body::EdgeService;
use super::per_ip::IpSlot;
use super::phase::ConnState;
use super::EdgeLimits;

/// What every connection of one listener shares.
pub(super) struct Shared {
    pub(super) name: &'static str,
    pub(super) app: Router,
    pub(super) limits: EdgeLimits,
    pub(super) h1: hyper::server::conn::http1::Builder,
}

/// Serves one accepted connection and enforces the header, idle and
/// shutdown rules around hyper's connection future.
pub(super) async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    _slots: (OwnedSemaphorePermit, Option<IpSlot>),
) {
    let limits = &shared.limits;
    let accepted = Instant::now();
    let state = Arc::new(ConnState::new(accepted));
    let io = TokioIo::new(EdgeIo {
        inner: stream,
        state: state.clone(),
        write_timeout: limits.write_timeout,
        write_stall: None,
    });
    let service = EdgeService {
        app: shared.app.clone(),
        peer,
        state: state.clone(),
        body_read_timeout: limits.body_read_timeout,
    };
    let conn = shared.h1.serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    let mut draining = false;
    loop {
        let deadline = state.deadline(limits);
        let wait = async {
            match deadline {
                Some((at, _)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(listener = shared.name, %peer, age = ?accepted.elapsed(), error = %e, "connection ended with an error");
                }
                return;
            }
            () = state.changed.notified() => {}
            _ = stop.wait_for(|stop| *stop), if !draining => {
                // Closes the connection now if no request is in progress,
                // otherwise after the response to the current one.
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
            () = wait => {
                if let Some((at, what)) = state.deadline(limits) {
                    if Instant::now() >= at {
                        // No request is in flight (the deadline exists only
                        // then), so dropping the connection loses nothing.
                        tracing::debug!(listener = shared.name, %peer, age = ?accepted.elapsed(), "closing connection: {what}");
                        return;
                    }
                }
            }
        }
    }
}

/// The TCP stream as hyper sees it: reports arriving bytes to `ConnState`
/// and fails a write that has made no progress for `write_timeout`.
struct EdgeIo {
    inner: TcpStream,
    state: Arc<ConnState>,
    write_timeout: Duration,
    write_stall: Option<Pin<Box<Sleep>>>,
}

impl EdgeIo {
    /// Called when a write returned `Pending`: arms (once) and polls the
    /// stall timer.
    fn poll_stalled(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let timeout = self.write_timeout;
        let stall = self
            .write_stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match stall.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                "client did not read the response within write_timeout",
            )),
            Poll::Pending => Poll::Pending,
        }
    }

    /// A write that returned is progress (or a final error): clear the stall
    /// timer. A pending one arms it.
    fn after_write<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match result {
            Poll::Ready(r) => {
                self.write_stall = None;
                Poll::Ready(r)
            }
            Poll::Pending => self.poll_stalled(cx).map(Err),
        }
    }
}

impl AsyncRead for EdgeIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.state.on_read();
        }
        result
    }
}

impl AsyncWrite for EdgeIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.after_write(cx, result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.after_write(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // A flush is no progress (a TCP flush is a no-op): it neither arms
        // nor clears the stall timer unless it is itself pending.
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending => self.poll_stalled(cx).map(Err),
            ready => ready,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
