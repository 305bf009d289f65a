//! The edge's settings, part of `watchpump serve` (each doc comment is what
//! `--help` prints), and how they become [`EdgeLimits`] within the
//! open-file budget.

use std::time::Duration;

use clap::Args;

use super::{connection_budget, EdgeLimits, REFUSAL_SLOTS};

/// Connections the API listener keeps whatever the open-file limit leaves
/// once the reserve is taken (unless `WATCHPUMP_MAX_CONNECTIONS` is lower):
/// the watches API, the admin API and the panel stay usable by several
/// clients at once. Issue 17: with 352 services the reserve left it one
/// connection, and one idle client then got everyone else 503. Tested in
/// `a_tiny_limit_keeps_the_api_floor` and `tests/edge_flood.rs`.
pub const API_FLOOR: usize = 64;

/// Connections one address may hold on the metrics listener: enough for a
/// Prometheus pair and a person with curl, while the per-address cap is on.
const METRICS_PER_IP: usize = 4;

/// What a client may cost the API and metrics listeners, and how often it
/// may fail to authenticate.
#[derive(Debug, Clone, Args)]
pub struct EdgeConfig {
    /// Connections the API listener (watches API, admin API, panel) holds
    /// at once; one more is answered 503 and closed. Lowered at start when
    /// the open-file limit leaves less once the database and the pump's
    /// outbound connections are reserved (logged as "connection budget").
    #[arg(long, env = "WATCHPUMP_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,

    /// Connections one client address (IPv4 address, IPv6 /64) may hold on
    /// the API listener. 0 turns the per-address cap off: do that behind a
    /// reverse proxy or NAT that funnels clients through a few addresses.
    #[arg(long, env = "WATCHPUMP_MAX_CONNECTIONS_PER_IP", default_value_t = 128)]
    pub max_connections_per_ip: usize,

    /// Connections the metrics listener holds at once (4 per address while
    /// the per-address cap is on).
    #[arg(long, env = "WATCHPUMP_METRICS_MAX_CONNECTIONS", default_value_t = 16)]
    pub metrics_max_connections: usize,

    /// Time a client has to send a request's line and headers, from the
    /// accept (or from the first byte of a later request); then the
    /// connection is closed without an answer. Trickling header lines does
    /// not extend it.
    #[arg(long, env = "WATCHPUMP_HEADER_TIMEOUT_MS", default_value_t = 10_000)]
    pub header_timeout_ms: u64,

    /// Time a client has to send a request's body once its headers are in;
    /// then it is answered 408 and the connection closed.
    #[arg(long, env = "WATCHPUMP_BODY_TIMEOUT_MS", default_value_t = 30_000)]
    pub body_timeout_ms: u64,

    /// How long a kept-alive connection may sit idle between requests.
    #[arg(long, env = "WATCHPUMP_IDLE_TIMEOUT_MS", default_value_t = 60_000)]
    pub idle_timeout_ms: u64,

    /// How long a client may leave an answer unread (a write that makes no
    /// progress) before the connection is dropped.
    #[arg(long, env = "WATCHPUMP_WRITE_TIMEOUT_MS", default_value_t = 30_000)]
    pub write_timeout_ms: u64,

    /// Failed authentications allowed per client address.
    #[command(flatten)]
    pub throttle: crate::throttle::ThrottleConfig,
}

/// The listeners' connection caps, as sized at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub api: usize,
    /// None when the metrics listener is off.
    pub metrics: Option<usize>,
}

impl EdgeConfig {
    /// The defaults; for tests and embedding.
    pub fn new() -> Self {
        #[derive(clap::Parser)]
        struct Only {
            #[command(flatten)]
            edge: EdgeConfig,
        }
        <Only as clap::Parser>::parse_from(["watchpump"]).edge
    }

    /// Rejects settings the edge cannot work with.
    pub fn validate(&self) -> Result<(), String> {
        let zero = [
            ("WATCHPUMP_MAX_CONNECTIONS", self.max_connections as u64),
            (
                "WATCHPUMP_METRICS_MAX_CONNECTIONS",
                self.metrics_max_connections as u64,
            ),
            ("WATCHPUMP_HEADER_TIMEOUT_MS", self.header_timeout_ms),
            ("WATCHPUMP_BODY_TIMEOUT_MS", self.body_timeout_ms),
            ("WATCHPUMP_IDLE_TIMEOUT_MS", self.idle_timeout_ms),
            ("WATCHPUMP_WRITE_TIMEOUT_MS", self.write_timeout_ms),
        ]
        .into_iter()
        .find(|(_, v)| *v == 0);
        match zero {
            Some((name, _)) => Err(format!("{name} must be above zero")),
            None => self.throttle.validate(),
        }
    }

    /// The caps within an open-file limit of `soft`, keeping `reserve`
    /// descriptors for the database and the pump: the metrics listener
    /// gets its share first (it is small), the API listener what is left,
    /// each at most what is configured.
    pub fn budget(&self, soft: u64, reserve: u64, metrics: bool) -> Budget {
        let metrics = metrics.then(|| {
            self.metrics_max_connections
                .min(connection_budget(soft, reserve, 2))
        });
        let taken_by_metrics = metrics.map_or(0, |m| (m + 1 + REFUSAL_SLOTS) as u64);
        let api = self
            .max_connections
            .min(connection_budget(soft, reserve + taken_by_metrics, 1).max(API_FLOOR));
        Budget { api, metrics }
    }

    /// The API listener's limits with `max_connections` connections.
    pub fn api_limits(&self, max_connections: usize) -> EdgeLimits {
        EdgeLimits {
            header_read_timeout: Duration::from_millis(self.header_timeout_ms),
            body_read_timeout: Duration::from_millis(self.body_timeout_ms),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            write_timeout: Duration::from_millis(self.write_timeout_ms),
            max_connections,
            max_connections_per_ip: (self.max_connections_per_ip > 0)
                .then_some(self.max_connections_per_ip),
            ..EdgeLimits::default()
        }
    }

    /// The metrics listener's limits: the same timeouts, its own caps.
    pub fn metrics_limits(&self, max_connections: usize) -> EdgeLimits {
        let api = self.api_limits(max_connections);
        EdgeLimits {
            max_connections_per_ip: api.max_connections_per_ip.map(|n| n.min(METRICS_PER_IP)),
            ..api
        }
    }
}

impl Default for EdgeConfig {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generous_limit_gives_what_is_configured() {
        let cfg = EdgeConfig::new();
        let b = cfg.budget(1 << 20, 2_000, true);
        assert_eq!(
            b,
            Budget {
                api: 1024,
                metrics: Some(16)
            }
        );
        assert!(cfg.api_limits(b.api).validate().is_ok());
        assert_eq!(cfg.metrics_limits(16).max_connections_per_ip, Some(4));
    }

    #[test]
    fn a_small_limit_shrinks_the_api_listener_and_keeps_the_reserve() {
        let cfg = EdgeConfig::new();
        let b = cfg.budget(2_048, 1_100, true);
        let metrics = b.metrics.unwrap();
        assert_eq!(metrics, 16);
        // Both listeners full, with their sockets and refusals in progress,
        // plus the base overhead, never reach into the reserve.
        let used = (b.api + 1 + REFUSAL_SLOTS) + (metrics + 1 + REFUSAL_SLOTS) + 64;
        assert!(used as u64 + 1_100 <= 2_048, "{b:?}");
        assert!(b.api < 1024 && b.api > 700, "{b:?}");
        let off = cfg.budget(2_048, 1_100, false);
        assert_eq!(off.metrics, None);
        assert!(off.api > b.api);
    }

    #[test]
    fn a_tiny_limit_keeps_the_api_floor() {
        let cfg = EdgeConfig::new();
        let b = cfg.budget(1_024, 2_000, true);
        assert_eq!(b.api, API_FLOOR);
        let mut few = EdgeConfig::new();
        few.max_connections = 10;
        assert_eq!(few.budget(1_024, 2_000, true).api, 10);
    }

    #[test]
    fn zero_is_refused_and_the_per_address_cap_can_be_off() {
        let mut cfg = EdgeConfig::new();
        assert!(cfg.validate().is_ok());
        cfg.max_connections_per_ip = 0;
        assert_eq!(cfg.api_limits(10).max_connections_per_ip, None);
        cfg.header_timeout_ms = 0;
        assert!(cfg.validate().unwrap_err().contains("HEADER_TIMEOUT"));
    }
}
