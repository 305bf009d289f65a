//! The hardened HTTP/1.1 edge of watchpump's listeners (the API with the
//! panel, and /metrics): issue 9, "a consumer cannot hurt the producer".
//!
//! `axum::serve` accepts every connection and keeps it for as long as the
//! client likes: it gives hyper no timer, so hyper's header-read timeout is
//! off, and there is no cap on connections. A client that opens thousands of
//! connections and sends one header line every 30 s therefore holds a file
//! descriptor per connection until the process reaches its open-file limit;
//! from then on the API cannot accept and the pump cannot open outbound
//! connections ("Too many open files").
//!
//! [`serve`] runs an axum [`Router`](axum::Router) on a listener with these bounds:
//!
//! * **Connections** are capped per listener ([`EdgeLimits::max_connections`]).
//!   A connection over the cap gets a short `503` with a JSON error body and
//!   `Connection: close` and is closed (never silently held). Size the caps
//!   with [`connection_budget`] so that every listener full at once still
//!   leaves file descriptors for the pump and the database pool. A
//!   per-address cap ([`EdgeLimits::max_connections_per_ip`]) keeps one
//!   host from filling the listener for everyone else.
//! * **Request headers** must arrive within [`EdgeLimits::header_read_timeout`],
//!   counted from the accept (for a first request) or from the first byte of a
//!   later request on a kept-alive connection. Trickling one header line at a
//!   time does not extend it.
//! * **Idle keep-alive** connections (no request in flight, no byte received
//!   since the last response) are closed after [`EdgeLimits::idle_timeout`].
//!   This is separate from the header timeout (see below for why hyper's own
//!   timer cannot do both).
//! * **Request bodies** must be complete within [`EdgeLimits::body_read_timeout`]
//!   of the headers; a trickled body makes the body fail, the client gets
//!   `408` with `Connection: close`, and the connection is closed.
//! * **Responses** a client does not read: a write that makes no progress for
//!   [`EdgeLimits::write_timeout`] ends the connection (slow-read defence).
//! * **Accept errors** such as `EMFILE` never end the server nor spin: the
//!   loop backs off 100 ms and logs at most once a second.
//! * **Graceful shutdown**: stop accepting, close idle connections, let
//!   requests in flight finish for at most [`EdgeLimits::shutdown_grace`],
//!   then drop what is left and return.
//!
//! Handlers can extract `axum::extract::ConnectInfo<SocketAddr>` (the TCP
//! peer address) exactly as with `into_make_service_with_connect_info`.
//!
//! ## What hyper's `header_read_timeout` does (hyper 1.12, checked by the
//! `edge_hyper_timeout` test)
//!
//! With a timer set, hyper starts the timer whenever the connection is ready
//! to read a request head: right after the accept, and again as soon as a
//! response is finished on a keep-alive connection. It is stopped when the
//! whole head has been parsed. So it bounds "connected but silent",
//! "trickled headers" *and* "idle keep-alive" with one and the same
//! duration, and it does not apply to request bodies. Used alone, a 10 s
//! header timeout would therefore also close every idle keep-alive connection
//! after 10 s (a 60 s idle timeout could not be had), and a slow body would
//! not be bounded at all. This module therefore tracks each connection's
//! phase itself (see `conn::ConnState`) and gives hyper's timer only the role of a
//! backstop (`header_read_timeout + idle_timeout`), which never fires before
//! ours.
//!
//! Without a timer (as in `axum::serve`) hyper applies no header timeout at
//! all: its 30 s default is silently ignored.
//!
//! # Layout
//!
//! - [`serve`] (`accept`): the accept loop, the caps, the refusals
//!   (`refuse`) and the per-address counts (`per_ip`).
//! - `conn`: one connection's watchdog (header and idle clocks, write
//!   stalls); `body`: the service around the router (`ConnectInfo`, the
//!   body deadline, `408`).
//! - [`fd`]: the open-file limit and the connection budget.
//! - `config`: the `watchpump serve` settings that become [`EdgeLimits`]
//!   (with the `producer` feature: they are clap arguments).
//!
//! The consumer kit serves its events endpoint on this edge too
//! (`kit::serve`): a consumer faces the same slow and idle clients as the
//! producer's API.

mod accept;
mod body;
#[cfg(feature = "producer")]
pub mod config;
mod conn;
pub mod fd;
mod per_ip;
mod phase;
mod refuse;

use std::io;
use std::time::Duration;

use tokio::sync::Semaphore;

pub use accept::serve;
pub use body::BodyTimeout;
#[cfg(feature = "producer")]
pub use config::EdgeConfig;
pub use fd::{connection_budget, raise_open_file_limit, FD_BASE_OVERHEAD};
pub use per_ip::client_key;
pub use refuse::REFUSAL_SLOTS;

/// Per-listener limits. Start from [`EdgeLimits::default`] and override
/// fields; every timeout must be above zero and `max_connections` at least 1
/// ([`serve`] refuses to start otherwise).
#[derive(Debug, Clone)]
pub struct EdgeLimits {
    /// A client must send the complete request head (request line and all
    /// headers) within this, counted from the accept for the first request
    /// and from the first byte for a later one on the same connection.
    /// Otherwise the connection is closed without a response (as hyper and
    /// nginx do): a slowloris client is not worth a reply.
    pub header_read_timeout: Duration,
    /// The whole request body must arrive within this, counted from the
    /// moment the head was parsed. A handler reading the body then sees a
    /// body error and the client gets `408` (`request_timeout`) with
    /// `Connection: close`. Bodies over axum's `DefaultBodyLimit` (2 MiB
    /// unless the router changes it) already get `413` from the extractors.
    pub body_read_timeout: Duration,
    /// A keep-alive connection with no request in flight and no byte
    /// received since its last response is closed after this.
    pub idle_timeout: Duration,
    /// A write to the client that makes no progress for this long (the
    /// client does not read its response) ends the connection.
    pub write_timeout: Duration,
    /// Connections this listener holds at once. When they are all taken, a
    /// new connection gets `503` (`overloaded`) with `Connection: close` and
    /// is closed. See [`connection_budget`] for sizing.
    pub max_connections: usize,
    /// Connections one client address may hold at once on this listener
    /// (IPv4 address, or IPv6 /64 prefix); over it, the same `503`.
    /// Without it a single host that opens `max_connections` connections and
    /// re-opens them as the header timeout closes them keeps the listener
    /// full and every other client gets `503`. Set `None` when the listener
    /// is behind a reverse proxy or NAT that funnels clients through a few
    /// addresses.
    pub max_connections_per_ip: Option<usize>,
    /// After the shutdown future resolves, requests in flight get this long
    /// to finish; connections still open then are dropped.
    pub shutdown_grace: Duration,
    /// Upper bound on the bytes buffered while reading a request head; a
    /// larger head gets `431`. Bounds memory per connection at
    /// roughly this (hyper's default is about 400 KiB, which times a few
    /// thousand slow connections is gigabytes). Values below 8192 are raised
    /// to 8192 (hyper's minimum).
    pub max_header_bytes: usize,
}

impl Default for EdgeLimits {
    /// Production values: 10 s headers, 30 s body, 60 s idle, 30 s stalled
    /// write, 1024 connections, 128 per client address, 30 s shutdown
    /// grace, 64 KiB of headers.
    fn default() -> Self {
        EdgeLimits {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
            max_connections: 1024,
            max_connections_per_ip: Some(128),
            shutdown_grace: Duration::from_secs(30),
            max_header_bytes: 64 * 1024,
        }
    }
}

impl EdgeLimits {
    /// Refuses limits [`serve`] cannot work with.
    pub fn validate(&self) -> io::Result<()> {
        let zero = [
            ("header_read_timeout", self.header_read_timeout),
            ("body_read_timeout", self.body_read_timeout),
            ("idle_timeout", self.idle_timeout),
            ("write_timeout", self.write_timeout),
            ("shutdown_grace", self.shutdown_grace),
        ]
        .into_iter()
        .find(|(_, d)| d.is_zero());
        if let Some((name, _)) = zero {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("edge limit {name} must be above zero"),
            ));
        }
        if self.max_connections == 0 || self.max_connections > Semaphore::MAX_PERMITS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "edge limit max_connections must be at least 1",
            ));
        }
        if self.max_connections_per_ip == Some(0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "edge limit max_connections_per_ip must be at least 1 (or None)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_validate() {
        assert!(EdgeLimits::default().validate().is_ok());
        let zero = EdgeLimits {
            max_connections: 0,
            ..EdgeLimits::default()
        };
        assert!(zero.validate().is_err());
        let no_idle = EdgeLimits {
            idle_timeout: Duration::ZERO,
            ..EdgeLimits::default()
        };
        assert!(no_idle.validate().is_err());
    }
}
