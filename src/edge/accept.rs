//! The accept loop: caps, refusals, accept errors, graceful shutdown.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioTimer;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::conn::{connection, Shared};
use super::per_ip::PerIp;
use super::refuse::{overloaded_response, refuse, refuse_now, REFUSAL_SLOTS};
use super::EdgeLimits;

/// Back-off after an accept error that is not about one connection (EMFILE,
/// ENFILE, ENOBUFS, ENOMEM): without it the loop would spin at 100 % CPU,
/// since the pending connection stays in the backlog and accept fails again.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);
/// Minimum time between two log lines of the same kind from one accept loop.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// Serves `app` on `listener` within `limits` until `shutdown` resolves, then
/// shuts down gracefully (see [`EdgeLimits::shutdown_grace`]) and returns.
///
/// `name` labels the log lines (`"api"`, `"metrics"`). Handlers may extract
/// `ConnectInfo<SocketAddr>`; do not wrap `app` with
/// `into_make_service_with_connect_info` (this function inserts it itself).
///
/// Returns an error only for invalid `limits` or when the listener's local
/// address cannot be read; accept errors are logged and retried.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: EdgeLimits,
    name: &'static str,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    limits.validate()?;
    let local = listener.local_addr()?;
    tracing::info!(
        listener = name,
        addr = %local,
        max_connections = limits.max_connections,
        max_connections_per_ip = ?limits.max_connections_per_ip,
        header_read_timeout = ?limits.header_read_timeout,
        body_read_timeout = ?limits.body_read_timeout,
        idle_timeout = ?limits.idle_timeout,
        "listening"
    );
    let mut gate = Gate::new(name, app, limits);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let event = tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(done) = gate.conns.join_next(), if !gate.conns.is_empty() => Event::Reaped(done),
            Some(_) = gate.refusals.join_next(), if !gate.refusals.is_empty() => continue,
            accepted = listener.accept() => Event::Accepted(accepted),
        };
        match event {
            Event::Reaped(Err(e)) if e.is_panic() => {
                tracing::error!(listener = name, "connection task panicked: {e}");
            }
            Event::Reaped(_) => {}
            Event::Accepted(Ok((stream, peer))) => gate.admit(stream, peer),
            Event::Accepted(Err(e)) if is_per_connection_error(&e) => {
                // The client gave up between SYN and accept; nothing to do.
            }
            Event::Accepted(Err(e)) => {
                gate.accept_failed(&e);
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(ACCEPT_ERROR_BACKOFF) => {}
                }
            }
        }
    }
    // Stop accepting: new connection attempts are refused by the kernel.
    drop(listener);
    gate.drain().await;
    Ok(())
}

enum Event {
    Accepted(io::Result<(TcpStream, SocketAddr)>),
    Reaped(Result<(), tokio::task::JoinError>),
}

/// One listener's admission state: the connections it serves, the
/// refusals being written, and the caps.
struct Gate {
    shared: Arc<Shared>,
    slots: Arc<Semaphore>,
    refusal_slots: Arc<Semaphore>,
    per_ip: Option<Arc<PerIp>>,
    refusal_full: Arc<[u8]>,
    refusal_per_ip: Arc<[u8]>,
    stop_tx: watch::Sender<bool>,
    conns: JoinSet<()>,
    refusals: JoinSet<()>,
    accept_log: LogLimiter,
    full_log: LogLimiter,
    per_ip_log: LogLimiter,
}

impl Gate {
    fn new(name: &'static str, app: Router, limits: EdgeLimits) -> Gate {
        let mut h1 = hyper::server::conn::http1::Builder::new();
        h1.timer(TokioTimer::new())
            // Backstop only: our per-connection watchdog enforces the header
            // and idle timeouts separately and always fires first (module
            // docs).
            .header_read_timeout(limits.header_read_timeout + limits.idle_timeout)
            .keep_alive(true)
            .max_buf_size(limits.max_header_bytes.max(8192));
        Gate {
            slots: Arc::new(Semaphore::new(limits.max_connections)),
            refusal_slots: Arc::new(Semaphore::new(REFUSAL_SLOTS)),
            per_ip: limits.max_connections_per_ip.map(PerIp::new),
            refusal_full: overloaded_response(
                "the server has too many open connections; retry later",
            )
            .into(),
            refusal_per_ip: overloaded_response(
                "too many open connections from your address; retry later",
            )
            .into(),
            stop_tx: watch::channel(false).0,
            conns: JoinSet::new(),
            refusals: JoinSet::new(),
            accept_log: LogLimiter::default(),
            full_log: LogLimiter::default(),
            per_ip_log: LogLimiter::default(),
            shared: Arc::new(Shared {
                name,
                app,
                limits,
                h1,
            }),
        }
    }

    /// Serves the connection if it fits under both caps, refuses it otherwise.
    fn admit(&mut self, stream: TcpStream, peer: SocketAddr) {
        // Small request/response exchanges: do not wait for Nagle.
        let _ = stream.set_nodelay(true);
        let ip_slot = match &self.per_ip {
            None => None,
            Some(per_ip) => match per_ip.try_take(peer.ip()) {
                Some(slot) => Some(slot),
                None => return self.refuse(stream, peer, true),
            },
        };
        match self.slots.clone().try_acquire_owned() {
            Ok(permit) => {
                self.conns.spawn(connection(
                    stream,
                    peer,
                    self.shared.clone(),
                    self.stop_tx.subscribe(),
                    (permit, ip_slot),
                ));
            }
            Err(_) => self.refuse(stream, peer, false),
        }
    }

    /// Answers `503` and closes: with a task while refusal slots are free,
    /// at once (best effort) during a burst.
    fn refuse(&mut self, stream: TcpStream, peer: SocketAddr, per_ip: bool) {
        let (response, log, what) = if per_ip {
            (
                &self.refusal_per_ip,
                &mut self.per_ip_log,
                "per-address connection limit reached",
            )
        } else {
            (
                &self.refusal_full,
                &mut self.full_log,
                "connection limit reached",
            )
        };
        let lingering = match self.refusal_slots.clone().try_acquire_owned() {
            Ok(permit) => {
                self.refusals
                    .spawn(refuse(stream, response.clone(), permit));
                true
            }
            Err(_) => {
                refuse_now(stream, response);
                false
            }
        };
        if let Some(suppressed) = log.ready() {
            let limits = &self.shared.limits;
            tracing::warn!(
                listener = self.shared.name,
                %peer,
                max_connections = limits.max_connections,
                max_connections_per_ip = ?limits.max_connections_per_ip,
                lingering,
                suppressed,
                "{what}; refusing new connections"
            );
        }
    }

    fn accept_failed(&mut self, e: &io::Error) {
        if let Some(suppressed) = self.accept_log.ready() {
            tracing::error!(
                listener = self.shared.name,
                error = %e,
                open_connections = self.conns.len(),
                suppressed,
                "accept failed; backing off"
            );
        }
    }

    /// Closes idle connections, gives requests in flight the grace period,
    /// then drops what is left.
    async fn drain(mut self) {
        let name = self.shared.name;
        let grace = self.shared.limits.shutdown_grace;
        self.refusals.abort_all();
        tracing::info!(
            listener = name,
            open_connections = self.conns.len(),
            ?grace,
            "shutting down"
        );
        self.stop_tx.send_replace(true);
        let drained = tokio::time::timeout(grace, async {
            while self.conns.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                listener = name,
                dropped = self.conns.len(),
                "shutdown grace over; dropping connections still open"
            );
            self.conns.shutdown().await;
        }
        tracing::info!(listener = name, "stopped");
    }
}

/// Accept errors that concern only the connection being accepted; the next
/// accept can follow at once. Everything else (EMFILE and friends) backs off.
fn is_per_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

/// At most one log line per [`LOG_EVERY`]; counts what it held back.
#[derive(Default)]
struct LogLimiter {
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimiter {
    /// `Some(suppressed since the last line)` when a line may be logged now.
    fn ready(&mut self) -> Option<u64> {
        self.ready_at(Instant::now())
    }

    fn ready_at(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.duration_since(last) < LOG_EVERY => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_limiter_counts_suppressed() {
        let t0 = Instant::now();
        let mut l = LogLimiter::default();
        assert_eq!(l.ready_at(t0), Some(0));
        assert_eq!(l.ready_at(t0 + Duration::from_millis(100)), None);
        assert_eq!(l.ready_at(t0 + Duration::from_millis(900)), None);
        assert_eq!(l.ready_at(t0 + LOG_EVERY), Some(2));
        assert_eq!(l.ready_at(t0 + LOG_EVERY), None);
    }
}
