//! One connection: hyper's HTTP/1 connection future under a watchdog that
//! enforces the header and idle clocks (`ConnState`), and an I/O wrapper
//! that ends a write the client stopped reading (`EdgeIo`).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify, OwnedSemaphorePermit};
use tokio::time::{Instant, Sleep};

use super::accept::Shared;
use super::body::EdgeService;
use super::per_ip::IpSlot;
use super::EdgeLimits;

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

/// Where a connection is in its request cycle, as far as timeouts go.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for a request head since `since` (the accept, or the first
    /// byte after an idle period): bounded by `header_read_timeout`.
    Head { since: Instant },
    /// Keep-alive with nothing received since the last response finished at
    /// `since`: bounded by `idle_timeout`.
    Idle { since: Instant },
    /// A request is being handled (head parsed, response not yet fully
    /// written). The body is bounded by `TimedBody`, a stalled response by
    /// `EdgeIo`'s write timeout; the handler's own time is not bounded here.
    ///
    /// Bytes that arrive while busy (a pipelined next request) do not start
    /// a header clock; if they form only part of a head, the connection is
    /// then bounded by `idle_timeout` (and hyper's backstop), not by
    /// `header_read_timeout`.
    Busy { in_flight: u32 },
}

/// Phase tracking shared by the connection's watchdog (`connection`), its
/// I/O (`EdgeIo`, which sees bytes arrive) and its service (`EdgeService`,
/// which sees requests start and responses end).
pub(super) struct ConnState {
    phase: Mutex<Phase>,
    /// Wakes the watchdog when the deadline may have moved earlier.
    changed: Notify,
}

impl ConnState {
    pub(super) fn new(accepted: Instant) -> Self {
        ConnState {
            phase: Mutex::new(Phase::Head { since: accepted }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn deadline(&self, limits: &EdgeLimits) -> Option<(Instant, &'static str)> {
        match *self.lock() {
            Phase::Head { since } => Some((
                since + limits.header_read_timeout,
                "request head not received within header_read_timeout",
            )),
            Phase::Idle { since } => Some((since + limits.idle_timeout, "idle_timeout")),
            Phase::Busy { .. } => None,
        }
    }

    /// Bytes arrived: an idle connection starts its header clock.
    fn on_read(&self) {
        let mut phase = self.lock();
        if let Phase::Idle { .. } = *phase {
            *phase = Phase::Head {
                since: Instant::now(),
            };
            drop(phase);
            self.changed.notify_one();
        }
    }

    pub(super) fn begin_request(self: &Arc<Self>) -> RequestGuard {
        let mut phase = self.lock();
        *phase = match *phase {
            Phase::Busy { in_flight } => Phase::Busy {
                in_flight: in_flight + 1,
            },
            _ => Phase::Busy { in_flight: 1 },
        };
        RequestGuard {
            state: self.clone(),
        }
    }

    fn end_request(&self) {
        let mut phase = self.lock();
        if let Phase::Busy { in_flight } = *phase {
            *phase = if in_flight > 1 {
                Phase::Busy {
                    in_flight: in_flight - 1,
                }
            } else {
                Phase::Idle {
                    since: Instant::now(),
                }
            };
            drop(phase);
            self.changed.notify_one();
        }
    }
}

/// Marks a request as in flight from the moment hyper hands it to the
/// service until its response body is dropped (fully written, or the
/// connection failed).
pub(super) struct RequestGuard {
    state: Arc<ConnState>,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.state.end_request();
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
