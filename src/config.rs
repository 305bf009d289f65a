//! `watchpump serve`'s configuration: the pump's knobs and the listeners',
//! each a flag with an environment variable, whose doc comment here is what
//! `watchpump serve --help` prints, and the checks of what cannot work
//! together. The command's grammar (its subcommands and their arguments)
//! is [`crate::cli`]'s, beside what runs each.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use clap::{Args, Parser};

use crate::destinations::{Destinations, Lookup};
use crate::retry::RetryPolicy;

/// `watchpump serve`: the pump plus the HTTP listeners.
#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// Address of the watches API.
    #[arg(long, env = "WATCHPUMP_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Address of the Prometheus endpoint (/metrics); "off" disables it.
    #[arg(
        long,
        env = "WATCHPUMP_METRICS_LISTEN",
        default_value = "127.0.0.1:9464"
    )]
    pub metrics_listen: String,

    /// Database connections in the pool (pump and API share it).
    #[arg(long, env = "WATCHPUMP_DB_POOL", default_value_t = 8)]
    pub db_pool: u32,

    /// PostgreSQL connection URL of a streaming standby of DATABASE_URL's
    /// primary, for the pages that only list: the panel's overview,
    /// deliveries, watches and warnings, the admin API's backlog,
    /// deliveries, watches and warnings, the consumer API's deliveries and
    /// watches, and the backlog gauges. Each such page then says how far
    /// behind the standby is (`replica_lag_seconds`, a line in the panel).
    /// Claims, sweeps and everything that writes stay on the primary, and
    /// so do the pages of one delivery, one watch or one service. Up to
    /// WATCHPUMP_DB_POOL connections to the standby. Unset, everything
    /// reads the primary.
    #[arg(long, env = "WATCHPUMP_READ_DATABASE_URL", hide_env_values = true)]
    pub read_database_url: Option<String>,

    /// How often the backlog gauges (watchpump_backlog,
    /// watchpump_oldest_due_age_seconds) are read from the database. One pump
    /// at a time does it, on a connection of its own outside the pool.
    #[arg(long, env = "WATCHPUMP_BACKLOG_INTERVAL_MS", default_value_t = 5000)]
    pub backlog_interval_ms: u64,

    #[command(flatten)]
    pub pump: PumpConfig,

    /// Connection caps and timeouts of the listeners (boxed, as
    /// `operator`).
    #[command(flatten)]
    pub edge: Box<crate::edge::EdgeConfig>,

    /// Panel, admin API, warnings to notify, pruning (boxed: it would
    /// make every `Command` as large as itself).
    #[command(flatten)]
    pub operator: Box<crate::operator::config::OperatorConfig>,
}

/// How the pump delivers.
#[derive(Debug, Clone, Args)]
pub struct PumpConfig {
    /// This producer's name (required); deliveries go to
    /// `<consumer>/api/v1/<producer>/events`.
    // Checked in validate() rather than by clap, so that the message names
    // the environment variable, which is how it is usually set.
    #[arg(
        long,
        env = "WATCHPUMP_PRODUCER",
        default_value = "",
        hide_default_value = true
    )]
    pub producer: String,

    /// This producer's own service token (required), sent as
    /// `Authorization: Bearer` on every delivery.
    #[arg(
        long,
        env = "WATCHPUMP_PRODUCER_TOKEN",
        hide_env_values = true,
        default_value = "",
        hide_default_value = true
    )]
    pub producer_token: String,

    /// How often the pump sweeps without being notified: due retries, missed
    /// notifications, leases of pumps that died, deadlines that passed.
    #[arg(long, env = "WATCHPUMP_SWEEP_INTERVAL_MS", default_value_t = 1000)]
    pub sweep_interval_ms: u64,

    /// Time allowed to open a connection to a consumer.
    #[arg(long, env = "WATCHPUMP_CONNECT_TIMEOUT_MS", default_value_t = 2000)]
    pub connect_timeout_ms: u64,

    /// The local address deliveries (and operator notifications) are sent
    /// from: one of this host's addresses, for a host with several (a
    /// consumer's firewall that admits one of them, a route per address);
    /// unset, the system picks. Checked at start: it must be an address of
    /// this host, not unspecified or multicast.
    #[arg(long, env = "WATCHPUMP_SOURCE_ADDRESS", value_parser = parse_source_address)]
    pub source_address: Option<IpAddr>,

    /// Time allowed for a whole delivery request, answer included.
    #[arg(long, env = "WATCHPUMP_REQUEST_TIMEOUT_MS", default_value_t = 10_000)]
    pub request_timeout_ms: u64,

    /// How long a claimed delivery stays this pump's; after that another pump
    /// may send it again. Must exceed the request timeout.
    #[arg(long, env = "WATCHPUMP_LEASE_MS", default_value_t = 60_000)]
    pub lease_ms: u64,

    /// After an attempt that got no answer (the request timed out or its
    /// connection broke), how long nothing more of its (watch, object) is
    /// sent, counted from when the request timeout would have ended it:
    /// time for a consumer still working on the abandoned request to finish
    /// (docs/protocol.md, "One at a time"). Default: the request
    /// timeout, but at most a quarter of what the lease leaves beyond it
    /// (the rest is the time a claimed delivery may wait to be sent:
    /// src/pump/fence.rs). The lease must exceed the request timeout plus
    /// this hold.
    #[arg(long, env = "WATCHPUMP_HOLD_AFTER_NO_ANSWER_MS")]
    pub hold_after_no_answer_ms: Option<u64>,

    /// How long a finished attempt's outcome waits in the pump for others to
    /// be written with it, in one statement (issue 33): the longest newer
    /// news of the same (watch, object) waits for an older delivery's
    /// outcome, and what a crash of the pump can leave unrecorded (those
    /// deliveries are sent again when their leases run out). A 410 and a
    /// stop are written at once. 0 writes what is there as soon as the last
    /// write is done.
    #[arg(long, env = "WATCHPUMP_FLUSH_INTERVAL_MS", default_value_t = 10)]
    pub flush_interval_ms: u64,

    /// Objects one resync goes through at most (docs/protocol.md,
    /// "Resync"): each may queue a replayed delivery, so a consumer asking
    /// for the state of a watch over millions of objects costs the queue
    /// this many rows at most per call; the answer says "truncated" when
    /// the watch covers more (tests/consumer_resync.rs).
    #[arg(long, env = "WATCHPUMP_RESYNC_MAX_OBJECTS", default_value_t = 10_000)]
    pub resync_max_objects: u32,

    /// Deliveries in flight to one consumer service at most, so a slow
    /// consumer cannot hold up the others.
    #[arg(long, env = "WATCHPUMP_SERVICE_CONCURRENCY", default_value_t = 64)]
    pub service_concurrency: u32,

    /// Deliveries in flight to a consumer service that has not answered
    /// yet. Each answer lets one more go (up to
    /// WATCHPUMP_SERVICE_CONCURRENCY) and each failure halves it, so that
    /// consumers that hang hold this many of WATCHPUMP_MAX_IN_FLIGHT each,
    /// not the whole budget.
    #[arg(long, env = "WATCHPUMP_INITIAL_CONCURRENCY", default_value_t = 1)]
    pub initial_concurrency: u32,

    /// Deliveries in flight across all consumer services at most: the
    /// pump's outbound requests (and so its sockets) whatever the number of
    /// services. Claims take no more than the free part of it.
    #[arg(long, env = "WATCHPUMP_MAX_IN_FLIGHT", default_value_t = 512)]
    pub max_in_flight: u32,

    /// Payload bytes held by deliveries in flight across all consumers at
    /// most (each change's payload counted once, however many deliveries
    /// share it). A claim stops adding deliveries at the free part of it,
    /// but always takes at least one when nothing is in flight.
    #[arg(long, env = "WATCHPUMP_MAX_IN_FLIGHT_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub max_in_flight_bytes: u64,

    // The retry policy these bound: src/retry.rs.
    /// First retry delay; it doubles with each attempt (with jitter).
    #[arg(long, env = "WATCHPUMP_RETRY_INITIAL_MS", default_value_t = 1000)]
    pub retry_initial_ms: u64,

    /// Longest retry delay.
    #[arg(long, env = "WATCHPUMP_RETRY_MAX_MS", default_value_t = 3_600_000)]
    pub retry_max_ms: u64,

    /// Consecutive failed attempts after which a consumer counts as down:
    /// it is then probed with one delivery at a time instead of being sent
    /// its backlog, and its backlog is released when a probe succeeds.
    #[arg(long, env = "WATCHPUMP_DOWN_AFTER", default_value_t = 3)]
    pub down_after_failures: u32,

    /// Longest pause between probes of a consumer that is down (the pause
    /// starts at a tenth of this and doubles).
    #[arg(long, env = "WATCHPUMP_PROBE_INTERVAL_MS", default_value_t = 1000)]
    pub probe_interval_ms: u64,

    /// After finding work, how long the pump keeps polling before it sleeps
    /// and asks producers to NOTIFY it (NOTIFY serialises their commits).
    /// 0 relies on NOTIFY alone.
    #[arg(long, env = "WATCHPUMP_LINGER_MS", default_value_t = 50)]
    pub linger_ms: u64,

    /// Linger only while the pump claims at least this many deliveries a
    /// second; below it, NOTIFY costs producers little and wakes the pump
    /// sooner than polling.
    #[arg(long, env = "WATCHPUMP_LINGER_ABOVE_PER_SEC", default_value_t = 500)]
    pub linger_above_per_sec: u32,

    /// How often a lingering pump polls for new deliveries, in microseconds.
    #[arg(long, env = "WATCHPUMP_POLL_US", default_value_t = 1000)]
    pub poll_us: u64,

    /// A name for this pump in leases and logs (default: host and process id).
    #[arg(long, env = "WATCHPUMP_PUMP_NAME")]
    pub pump_name: Option<String>,

    /// Where deliveries may go: comma-separated host names, addresses and
    /// networks (10.0.0.0/8). When set, only these are accepted, at
    /// `services add`/`set-url` and at send time. Unset, loopback,
    /// unspecified (0.0.0.0, ::), private (10/8, 172.16/12, 192.168/16,
    /// fc00::/7, 100.64/10) addresses and `localhost` are refused; list
    /// them to allow them (127.0.0.0/8,::1 for a consumer on this host).
    /// Set or not, link-local and cloud metadata addresses (169.254.0.0/16,
    /// fe80::/10, 100.100.100.200, fd00:ec2::254, and the IPv6 forms that
    /// embed them) are refused unless an entry names them (an address or
    /// network inside them). No proxy is used for deliveries.
    #[arg(long, env = "WATCHPUMP_ALLOWED_DESTINATIONS", value_parser = Destinations::parse)]
    pub allowed_destinations: Option<Destinations>,

    /// How consumers' host names are looked up: the system's resolver
    /// unless a test injects one (one that never answers).
    #[arg(skip)]
    pub lookup_with: Option<Lookup>,
}

impl PumpConfig {
    /// The defaults, for a producer name and token; for tests and embedding.
    pub fn new(producer: &str, producer_token: &str) -> Self {
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            pump: PumpConfig,
        }
        Only::parse_from([
            "watchpump",
            "--producer",
            producer,
            "--producer-token",
            producer_token,
        ])
        .pump
    }

    pub fn sweep_interval(&self) -> Duration {
        Duration::from_millis(self.sweep_interval_ms)
    }
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }
    pub fn flush_interval(&self) -> Duration {
        Duration::from_millis(self.flush_interval_ms)
    }
    /// `WATCHPUMP_HOLD_AFTER_NO_ANSWER_MS`, or its default (see there).
    pub fn hold_after_no_answer(&self) -> Duration {
        Duration::from_millis(self.hold_after_no_answer_ms.unwrap_or_else(|| {
            let left = self.lease_ms.saturating_sub(self.request_timeout_ms);
            self.request_timeout_ms.min(left / 4)
        }))
    }
    pub fn retry_initial(&self) -> Duration {
        Duration::from_millis(self.retry_initial_ms)
    }
    pub fn retry_max(&self) -> Duration {
        Duration::from_millis(self.retry_max_ms)
    }
    pub fn linger(&self) -> Duration {
        Duration::from_millis(self.linger_ms)
    }
    pub fn poll_interval(&self) -> Duration {
        Duration::from_micros(self.poll_us.max(100))
    }
    pub fn probe_interval(&self) -> Duration {
        Duration::from_millis(self.probe_interval_ms)
    }
    /// The retry delays' and probe pauses' bounds ([`crate::retry`]).
    pub fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            initial: self.retry_initial(),
            max: self.retry_max(),
            probe_max: self.probe_interval(),
        }
    }
    /// Where deliveries may go ([`crate::destinations`]).
    pub fn destinations(&self) -> Destinations {
        self.allowed_destinations.clone().unwrap_or_default()
    }
    /// How host names are looked up ([`crate::destinations::Resolver`]).
    pub fn lookup(&self) -> Lookup {
        self.lookup_with.clone().unwrap_or_else(Lookup::system)
    }

    /// A pump name unique enough for leases: host, process id, and a random tag.
    pub fn pump_name(&self) -> String {
        self.pump_name.clone().unwrap_or_else(|| {
            let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "pump".into());
            format!(
                "{host}-{}-{:04x}",
                std::process::id(),
                rand::random::<u16>()
            )
        })
    }

    /// Rejects settings that cannot work together.
    pub fn validate(&self) -> Result<(), String> {
        if self.producer.is_empty() {
            return Err(
                "the producer's name is required: set WATCHPUMP_PRODUCER (or --producer), e.g. git"
                    .into(),
            );
        }
        if self.producer_token.is_empty() {
            return Err("the producer's token is required: set WATCHPUMP_PRODUCER_TOKEN (or --producer-token)".into());
        }
        if !self
            .producer
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(format!(
                "producer name {:?} must be non-empty and use only letters, digits, '-' and '_'",
                self.producer
            ));
        }
        if self.lease_ms <= self.request_timeout_ms {
            return Err(format!(
                "the lease ({} ms) must be longer than the request timeout ({} ms)",
                self.lease_ms, self.request_timeout_ms
            ));
        }
        let hold = self.hold_after_no_answer().as_millis() as u64;
        if self.lease_ms <= self.request_timeout_ms.saturating_add(hold) {
            return Err(format!(
                "the lease ({} ms) must be longer than the request timeout ({} ms) plus the hold after no answer ({hold} ms): a pump sends only while its lease covers both",
                self.lease_ms, self.request_timeout_ms
            ));
        }
        if self.flush_interval_ms >= self.lease_ms.saturating_sub(self.request_timeout_ms) {
            return Err(format!(
                "WATCHPUMP_FLUSH_INTERVAL_MS ({} ms) must be well under the lease ({} ms) less the request timeout: an outcome must be written while its lease still holds",
                self.flush_interval_ms, self.lease_ms
            ));
        }
        if self.service_concurrency == 0 || self.sweep_interval_ms == 0 {
            return Err("service concurrency and sweep interval must be above zero".into());
        }
        if self.initial_concurrency == 0 {
            return Err("WATCHPUMP_INITIAL_CONCURRENCY must be above zero".into());
        }
        if self.max_in_flight == 0 || self.max_in_flight_bytes == 0 {
            return Err(
                "WATCHPUMP_MAX_IN_FLIGHT and WATCHPUMP_MAX_IN_FLIGHT_BYTES must be above zero"
                    .into(),
            );
        }
        if self.retry_initial_ms == 0 || self.retry_max_ms < self.retry_initial_ms {
            return Err("the retry delays must satisfy 0 < initial <= max".into());
        }
        Ok(())
    }
}

/// `WATCHPUMP_SOURCE_ADDRESS`: an address, and one of this host's (a socket
/// bound to it here, briefly), so that a mistyped one stops the pump at
/// start rather than failing every delivery with "address not available".
fn parse_source_address(value: &str) -> Result<IpAddr, String> {
    let ip: IpAddr = value
        .trim()
        .parse()
        .map_err(|_| format!("{value:?} is not an IP address"))?;
    if ip.is_unspecified() || ip.is_multicast() {
        return Err(format!(
            "{ip} is unspecified or multicast; name one of this host's addresses (or leave it unset)"
        ));
    }
    std::net::TcpListener::bind((ip, 0))
        .map_err(|e| format!("{ip} is not an address of this host: {e}"))?;
    Ok(ip)
}
