//! Where deliveries may go (issues 9 and 17): `WATCHPUMP_ALLOWED_DESTINATIONS`.
//!
//! A consumer's base URL is chosen by whoever registers the service, and
//! the pump then sends the producer's token there. Two tiers of addresses
//! are refused:
//!
//! - `FORBIDDEN`: link-local and cloud metadata addresses (169.254.0.0/16,
//!   fe80::/10, 100.100.100.200, fd00:ec2::254) hand out the producer host's
//!   own credentials, so they are refused unless an entry names them
//!   explicitly: an address or a network inside one of those ranges
//!   (`0.0.0.0/0` does not count).
//! - `INTERNAL`: loopback, unspecified (`0.0.0.0` and `[::]` reach the
//!   pump's own host), private (10/8, 172.16/12, 192.168/16, fc00::/7) and
//!   shared (100.64/10, CGNAT) addresses, and the name `localhost`: refused
//!   by default, since a production pump's consumers are reached by public
//!   or listed names; accepted when the list covers them (a network that
//!   contains them, or a listed name that resolves to them). Development,
//!   the tests, the demo and the bench list loopback
//!   ([`Destinations::loopback`]).
//!
//! An IPv6 address that embeds an IPv4 one (NAT64 64:ff9b::/96 and
//! 64:ff9b:1::/48, 6to4 2002::/16, IPv4-compatible ::a.b.c.d, IPv4-mapped
//! ::ffff:a.b.c.d) is refused when the IPv4 address inside it would be:
//! a NAT64 gateway or a 6to4 relay forwards it there.
//!
//! When the list is set, only its hosts and networks are accepted at all.
//!
//! It is checked twice: at `services add` / `set-url` ([`Destinations::check_url`]),
//! and at send time, on what a name resolves to now (a resolver that drops
//! refused addresses, so DNS cannot point an accepted name at a metadata
//! address later) and on the address actually connected to (which covers
//! base URLs with an IP literal, stored before the rule or the list
//! changed). A refused destination is then a connect error, "destination
//! not allowed", recorded on the attempt.
//!
//! The pump's HTTP client uses no proxy (`HTTP(S)_PROXY` and `ALL_PROXY`
//! are ignored, `src/pump/send.rs`): a proxy would resolve and connect on
//! the pump's behalf, past both checks.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use hyper_util::client::legacy::connect::{Connection, HttpInfo};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Refused unless explicitly allowed: link-local (where the metadata
/// services of AWS, GCP and Azure answer), Alibaba's metadata address, and
/// AWS's IPv6 metadata address.
const FORBIDDEN: [Net; 4] = [
    Net {
        addr: IpAddr::V4(Ipv4Addr::new(169, 254, 0, 0)),
        prefix: 16,
    },
    Net {
        addr: IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0)),
        prefix: 10,
    },
    Net {
        addr: IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)),
        prefix: 32,
    },
    Net {
        addr: IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
        prefix: 128,
    },
];

const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Net {
    Net {
        addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
        prefix,
    }
}

const fn v6(segments: [u16; 8], prefix: u8) -> Net {
    let [a, b, c, d, e, f, g, h] = segments;
    Net {
        addr: IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)),
        prefix,
    }
}

/// Refused unless the list covers them (see the module's doc): addresses
/// of the pump's own host and of private networks.
const INTERNAL: [Net; 11] = [
    v4(0, 0, 0, 0, 8),      // "this network": 0.0.0.0 connects to the local host
    v4(127, 0, 0, 0, 8),    // loopback
    v4(10, 0, 0, 0, 8),     // private
    v4(172, 16, 0, 0, 12),  // private
    v4(192, 168, 0, 0, 16), // private
    v4(100, 64, 0, 0, 10),  // shared address space (CGNAT)
    v4(255, 255, 255, 255, 32),
    v6([0, 0, 0, 0, 0, 0, 0, 0], 128),     // unspecified
    v6([0, 0, 0, 0, 0, 0, 0, 1], 128),     // loopback
    v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),  // unique local
    v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10), // site-local (deprecated)
];

/// The host names refused like [`INTERNAL`] addresses, whatever they
/// resolve to here.
const INTERNAL_NAMES: [&str; 2] = ["localhost", "localhost.localdomain"];

/// An address and how many of its leading bits count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Net {
    addr: IpAddr,
    prefix: u8,
}

impl Net {
    fn contains(&self, ip: IpAddr) -> bool {
        // Both as 128 bits with the address at the top, so that the prefix
        // counts from the top for either family.
        let bits = |a: IpAddr| match a {
            IpAddr::V4(v4) => (u128::from(u32::from(v4)) << 96, true),
            IpAddr::V6(v6) => (u128::from(v6), false),
        };
        let ((net, net_v4), (ip, ip_v4)) = (bits(self.addr), bits(ip));
        let mask = u128::MAX
            .checked_shl(128 - u32::from(self.prefix))
            .unwrap_or(0);
        net_v4 == ip_v4 && net & mask == ip & mask
    }

    fn within(&self, outer: &Net) -> bool {
        self.prefix >= outer.prefix && outer.contains(self.addr)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Rule {
    /// A host name, lower case.
    Host(String),
    Net(Net),
}

/// The destinations deliveries may go to. The default allows every one
/// but link-local and metadata addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Destinations {
    /// None: no list, everything not forbidden is allowed.
    allowed: Option<Vec<Rule>>,
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The IPv4 address a NAT64 (64:ff9b::/96, 64:ff9b:1::/48), 6to4
/// (2002::/16) or IPv4-compatible (::a.b.c.d) IPv6 address carries, which
/// is where a gateway or relay would forward a connection to it.
fn embedded_v4(ip: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(v6) = ip else { return None };
    let s = v6.segments();
    let low = |hi: u16, lo: u16| Some(Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo)));
    match s {
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => low(hi, lo),
        [0x64, 0xff9b, 1, ..] => low(s[6], s[7]),
        [0x2002, hi, lo, ..] => low(hi, lo),
        // ::a.b.c.d, but not :: and ::1 (INTERNAL as they are).
        [0, 0, 0, 0, 0, 0, hi, lo] if hi != 0 => low(hi, lo),
        _ => None,
    }
}

fn parse_rule(entry: &str) -> Result<Rule, String> {
    let entry = entry.trim().to_ascii_lowercase();
    let bare = entry.trim_start_matches('[').trim_end_matches(']');
    let (addr, prefix) = match bare.split_once('/') {
        Some((addr, prefix)) => (addr, Some(prefix)),
        None => (bare, None),
    };
    if let Ok(parsed) = addr.parse::<IpAddr>() {
        let ip = canonical(parsed);
        // An IPv4-mapped network counts as the IPv4 network it maps.
        let mapped = if ip != parsed { 96 } else { 0 };
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .and_then(|p| p.checked_sub(mapped))
                .filter(|p| *p <= max)
                .ok_or_else(|| {
                    format!("{entry:?}: the prefix length must be 0 to {}", max + mapped)
                })?,
        };
        return Ok(Rule::Net(Net { addr: ip, prefix }));
    }
    let is_name = !entry.is_empty()
        && prefix.is_none()
        && entry
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    if is_name {
        Ok(Rule::Host(entry))
    } else {
        Err(format!(
            "{entry:?} is neither a host name, an IP address nor a network (CIDR)"
        ))
    }
}

impl std::str::FromStr for Destinations {
    type Err = String;

    /// Comma-separated hosts, addresses and networks (`deploy.internal,
    /// 10.0.0.0/8, ::1`); empty means no list.
    fn from_str(list: &str) -> Result<Self, String> {
        let entries: Vec<&str> = list.split(',').filter(|e| !e.trim().is_empty()).collect();
        if entries.is_empty() {
            return Ok(Destinations::default());
        }
        let rules = entries
            .into_iter()
            .map(parse_rule)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("WATCHPUMP_ALLOWED_DESTINATIONS: {e}"))?;
        Ok(Destinations {
            allowed: Some(rules),
        })
    }
}

impl Destinations {
    /// Parses a list; for clap's `value_parser`.
    pub fn parse(list: &str) -> Result<Self, String> {
        list.parse()
    }

    fn forbidden(ip: IpAddr) -> Option<&'static Net> {
        FORBIDDEN.iter().find(|net| net.contains(ip))
    }

    fn networks(&self) -> impl Iterator<Item = &Net> {
        self.allowed.iter().flatten().filter_map(|r| match r {
            Rule::Net(net) => Some(net),
            Rule::Host(_) => None,
        })
    }

    fn lists_host(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.allowed
            .iter()
            .flatten()
            .any(|r| matches!(r, Rule::Host(h) if *h == host))
    }

    /// Why connecting to `ip` is refused, if it is; `listed_name`: it was
    /// reached through a host name on the list. An address that embeds an
    /// IPv4 address is refused when either is.
    fn refusal(&self, ip: IpAddr, listed_name: bool) -> Option<String> {
        let ip = canonical(ip);
        self.refusal_of(ip, listed_name).or_else(|| {
            let inner = IpAddr::V4(embedded_v4(ip)?);
            self.refusal_of(inner, listed_name)
                .map(|why| format!("{why} (embedded in {ip})"))
        })
    }

    fn refusal_of(&self, ip: IpAddr, listed_name: bool) -> Option<String> {
        if let Some(range) = Self::forbidden(ip) {
            let explicit = self.networks().any(|n| n.contains(ip) && n.within(range));
            return (!explicit).then(|| {
                format!("destination not allowed: {ip} is link-local or a cloud metadata address (name it in WATCHPUMP_ALLOWED_DESTINATIONS to allow it)")
            });
        }
        let listed = listed_name || self.networks().any(|n| n.contains(ip));
        if INTERNAL.iter().any(|net| net.contains(ip)) {
            return (!listed).then(|| {
                format!("destination not allowed: {ip} is a loopback, unspecified or private address, not in WATCHPUMP_ALLOWED_DESTINATIONS (list it there to allow it)")
            });
        }
        let allowed = listed || self.allowed.is_none();
        (!allowed).then(|| {
            format!("destination not allowed: {ip} is not in WATCHPUMP_ALLOWED_DESTINATIONS")
        })
    }

    /// Loopback only (127.0.0.0/8 and ::1, and so `localhost` through
    /// them): for development, tests, the demo and the bench, whose
    /// consumers listen on this host.
    pub fn loopback() -> Destinations {
        "127.0.0.0/8, ::1".parse().expect("a valid list")
    }

    /// Checks a base URL at `services add` and `set-url`: its address, or
    /// with a list set, its host name (listed, or resolving only to listed
    /// networks). Nothing is sent to the destination.
    pub async fn check_url(&self, base_url: &str) -> Result<(), String> {
        let url = reqwest::Url::parse(base_url).map_err(|e| e.to_string())?;
        let host = url.host_str().unwrap_or_default();
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        let refused = if let Ok(ip) = literal.parse::<IpAddr>() {
            self.refusal(ip, false)
        } else if self.refuses_name(host) {
            Some(format!("destination not allowed: {host} names this host (list it, or a loopback network, in WATCHPUMP_ALLOWED_DESTINATIONS to allow it)"))
        } else if self.allowed.is_some() && !self.lists_host(host) {
            // A dead DNS must not hold `services add` or the admin API.
            let lookup =
                tokio::time::timeout(CHECK_LOOKUP_TIMEOUT, tokio::net::lookup_host((host, 0)));
            let addrs = match lookup.await {
                Ok(found) => found.map_err(|e| e.to_string()),
                Err(_) => Err(format!("no answer in {} s", CHECK_LOOKUP_TIMEOUT.as_secs())),
            }
            .map_err(|e| {
                format!("destination not allowed: {host} is not in WATCHPUMP_ALLOWED_DESTINATIONS and cannot be resolved to check its addresses: {e}")
            })?;
            addrs.map(|a| a.ip()).find_map(|ip| self.refusal(ip, false))
        } else {
            None
        };
        refused.map_or(Ok(()), Err)
    }

    /// `localhost` by name, unless the list names it or covers loopback
    /// (where it will be checked by its addresses).
    fn refuses_name(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        INTERNAL_NAMES.contains(&host.as_str())
            && !self.lists_host(&host)
            && !self.networks().any(|n| n.contains(loopback))
    }

    /// A resolver for the pump's HTTP client that drops refused addresses
    /// (and fails when none is left), waiting at most `timeout` for a name.
    pub fn resolver(&self, timeout: Duration, lookup: Lookup) -> Arc<Resolver> {
        Arc::new(Resolver::new(self, timeout, lookup))
    }

    /// A layer for the pump's HTTP client that drops a connection to a
    /// refused address (base URLs with an IP literal skip the resolver).
    pub fn connect_guard(&self) -> Guard<()> {
        Guard {
            inner: (),
            destinations: Arc::new(self.clone()),
            names: None,
        }
    }
}

/// How a host name is looked up: the system's resolver
/// (`tokio::net::lookup_host`, getaddrinfo on a blocking thread) unless a
/// test injects one whose answer it controls (one that never answers).
#[derive(Clone)]
pub struct Lookup(Arc<LookupFn>);

type Looking = Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>>;

/// Boxed inside the Arc, so that a `Lookup` is one pointer (it sits in
/// `PumpConfig`, which every command carries).
struct LookupFn(Box<dyn Fn(String) -> Looking + Send + Sync>);

impl Lookup {
    /// The system's resolver.
    pub fn system() -> Lookup {
        Lookup::new(|name: String| async move {
            Ok(tokio::net::lookup_host((name.as_str(), 0))
                .await?
                .map(|a| a.ip())
                .collect())
        })
    }

    pub fn new<F, Fut>(lookup: F) -> Lookup
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'static,
    {
        Lookup(Arc::new(LookupFn(Box::new(move |name| {
            Box::pin(lookup(name)) as Looking
        }))))
    }
}

impl std::fmt::Debug for Lookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Lookup")
    }
}

/// Lookups running at once at most (each holds one of tokio's 512 blocking
/// threads while getaddrinfo runs, and getaddrinfo cannot be cancelled: a
/// lookup that times out keeps its thread until the system gives up, after
/// resolv.conf's timeouts); half of them, so the rest of the process keeps
/// the other half. A
/// name whose lookup still runs starts no other, so this many dead names
/// can hang at once; past it, a name with no answer yet fails at once
/// ("too many host name lookups pending") and is retried like a connect
/// error. Names already resolved keep their last answer meanwhile.
/// Tested in `tests/dns.rs`.
pub const MAX_PENDING_LOOKUPS: usize = 256;

/// How long `services add` and `set-url` wait for a name's addresses.
const CHECK_LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an answer is used before the name is looked up again. Past it
/// the last good answer is still used while the new lookup runs (or hangs),
/// up to [`STALE_FOR`], so a healthy consumer never waits on DNS once its
/// name resolved.
const FRESH_FOR: Duration = Duration::from_secs(30);
const STALE_FOR: Duration = Duration::from_secs(600);
/// How long a failed lookup (timeout included) is remembered: meanwhile the
/// name's deliveries fail at once instead of each waiting.
const FAILED_FOR: Duration = Duration::from_secs(5);

type Answer = Result<Arc<[IpAddr]>, String>;

/// One lookup of one name, shared by every delivery that needs it while it
/// runs (single flight).
#[derive(Debug)]
struct Flight {
    answer: Arc<tokio::sync::OnceCell<Answer>>,
    started: Instant,
}

#[derive(Default, Debug)]
struct Names {
    /// The current lookup of each name (running or answered).
    flights: HashMap<String, Flight>,
    /// The last good answer of each name, and when it was got.
    good: HashMap<String, (Arc<[IpAddr]>, Instant)>,
    /// Names whose system lookup still runs (past its timeout, too).
    running: HashSet<String>,
    /// Addresses that listed names resolved to (and that are allowed
    /// through them): the connect guard, which sees only the address, lets
    /// them through ([`Resolver::connect_guard`]).
    via_listed_name: HashSet<IpAddr>,
}

/// See [`Destinations::resolver`]: asynchronous, cached, single-flight per
/// name, with a timeout and a cap on lookups running at once (issue 17:
/// one consumer's dead DNS held tokio's 512 blocking threads, so that a
/// healthy consumer's name could not be resolved and it was marked down).
#[derive(Clone)]
pub struct Resolver {
    destinations: Arc<Destinations>,
    lookup: Lookup,
    timeout: Duration,
    names: Arc<Mutex<Names>>,
    permits: Arc<Semaphore>,
}

impl Resolver {
    /// `timeout`: how long one delivery waits for a name (the pump passes
    /// its connect timeout).
    pub fn new(destinations: &Destinations, timeout: Duration, lookup: Lookup) -> Resolver {
        for result in ["ok", "error", "timeout", "refused"] {
            ::metrics::counter!(crate::metrics::DNS_LOOKUPS, "result" => result).increment(0);
        }
        Resolver {
            destinations: Arc::new(destinations.clone()),
            lookup,
            timeout,
            names: Arc::default(),
            permits: Arc::new(Semaphore::new(MAX_PENDING_LOOKUPS)),
        }
    }

    /// The addresses of `name` that deliveries may go to.
    pub async fn resolve_name(&self, name: &str) -> Result<Vec<IpAddr>, String> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let (flight, stale) = self.flight(&name);
        let answer = match stale {
            // A good answer while the new lookup runs (or hangs).
            Some(addrs) if flight.get().is_none() => {
                let (resolver, name) = (self.clone(), name.clone());
                tokio::spawn(async move {
                    flight.get_or_init(|| resolver.look_up(&name)).await;
                });
                Ok(addrs)
            }
            _ => {
                let answer =
                    tokio::time::timeout(self.timeout, flight.get_or_init(|| self.look_up(&name)))
                        .await
                        .map_err(|_| format!("looking up {name} timed out"))?
                        .clone();
                answer.or_else(|e| stale.ok_or(e))
            }
        };
        let listed = self.destinations.lists_host(&name);
        let mut refused = None;
        let addrs: Vec<IpAddr> = answer?
            .iter()
            .copied()
            .filter(|ip| match self.destinations.refusal(*ip, listed) {
                Some(why) => {
                    refused = Some(why);
                    false
                }
                None => true,
            })
            .collect();
        if listed {
            let mut names = self.names.lock().unwrap();
            if names.via_listed_name.len() > 4096 {
                names.via_listed_name.clear();
            }
            names.via_listed_name.extend(addrs.iter().copied());
        }
        match (addrs.is_empty(), refused) {
            (true, Some(why)) => Err(format!("{why} ({name})")),
            (true, None) => Err(format!("{name} has no address")),
            _ => Ok(addrs),
        }
    }

    /// The connect guard that goes with this resolver: it also lets through
    /// the addresses this resolver found for listed names (with a list of
    /// names only, the guard alone would refuse every address).
    pub fn connect_guard(&self) -> Guard<()> {
        Guard {
            inner: (),
            destinations: self.destinations.clone(),
            names: Some(self.names.clone()),
        }
    }

    /// The name's current flight (a new one when the last is too old), and
    /// its last good answer if that may still be used.
    fn flight(&self, name: &str) -> (Arc<tokio::sync::OnceCell<Answer>>, Option<Arc<[IpAddr]>>) {
        let mut names = self.names.lock().unwrap();
        let now = Instant::now();
        let stale = names
            .good
            .get(name)
            .filter(|(_, at)| now.duration_since(*at) < STALE_FOR)
            .map(|(addrs, _)| addrs.clone());
        let expired = match names.flights.get(name) {
            None => true,
            Some(f) => match f.answer.get() {
                None => false,
                Some(Ok(_)) => now.duration_since(f.started) >= FRESH_FOR,
                Some(Err(_)) => now.duration_since(f.started) >= FAILED_FOR,
            },
        };
        if expired {
            if names.flights.len() > 4 * MAX_PENDING_LOOKUPS {
                // Forget answered flights of names no longer asked for.
                names.flights.retain(|_, f| {
                    f.answer.get().is_none() || now.duration_since(f.started) < FRESH_FOR
                });
                names
                    .good
                    .retain(|_, (_, at)| now.duration_since(*at) < STALE_FOR);
            }
            names.flights.insert(
                name.to_string(),
                Flight {
                    answer: Arc::default(),
                    started: now,
                },
            );
        }
        (names.flights[name].answer.clone(), stale)
    }

    /// Runs the system lookup on a task of its own, which holds a permit
    /// until the lookup really ends, and waits for it at most the timeout.
    async fn look_up(&self, name: &str) -> Answer {
        {
            let mut names = self.names.lock().unwrap();
            if !names.running.insert(name.to_string()) {
                return Err(format!("the previous lookup of {name} has not ended"));
            }
        }
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            self.names.lock().unwrap().running.remove(name);
            ::metrics::counter!(crate::metrics::DNS_LOOKUPS, "result" => "refused").increment(1);
            return Err(format!(
                "too many host name lookups pending ({MAX_PENDING_LOOKUPS}); {name} is tried again later"
            ));
        };
        let lookup = (self.lookup.0 .0)(name.to_string());
        let names = self.names.clone();
        let owned = name.to_string();
        let task = tokio::spawn(async move {
            let answer = lookup.await;
            let mut names = names.lock().unwrap();
            names.running.remove(&owned);
            if let Ok(addrs) = &answer {
                if !addrs.is_empty() {
                    names
                        .good
                        .insert(owned, (addrs.clone().into(), Instant::now()));
                }
            }
            drop(permit);
            answer
        });
        let result = match tokio::time::timeout(self.timeout, task).await {
            Ok(Ok(Ok(addrs))) => Ok(addrs.into()),
            Ok(Ok(Err(e))) => Err(format!("looking up {name}: {e}")),
            Ok(Err(e)) => Err(format!("looking up {name}: {e}")),
            Err(_) => Err(format!("looking up {name} timed out")),
        };
        let label = match &result {
            Ok(_) => "ok",
            Err(e) if e.ends_with("timed out") => "timeout",
            Err(_) => "error",
        };
        ::metrics::counter!(crate::metrics::DNS_LOOKUPS, "result" => label).increment(1);
        result
    }
}

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let resolver = self.clone();
        let name = name.as_str().to_string();
        Box::pin(async move {
            let addrs = resolver.resolve_name(&name).await?;
            Ok(Box::new(addrs.into_iter().map(|ip| SocketAddr::new(ip, 0))) as reqwest::dns::Addrs)
        })
    }
}

/// See [`Destinations::connect_guard`]: a tower layer (`inner: ()`) and
/// the service it makes around the connector.
#[derive(Debug, Clone)]
pub struct Guard<S> {
    inner: S,
    destinations: Arc<Destinations>,
    names: Option<Arc<Mutex<Names>>>,
}

impl<S> tower::Layer<S> for Guard<()> {
    type Service = Guard<S>;

    fn layer(&self, inner: S) -> Guard<S> {
        Guard {
            inner,
            destinations: self.destinations.clone(),
            names: self.names.clone(),
        }
    }
}

impl<S, R> tower::Service<R> for Guard<S>
where
    S: tower::Service<R>,
    S::Response: Connection + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let connecting = self.inner.call(request);
        let destinations = self.destinations.clone();
        let names = self.names.clone();
        Box::pin(async move {
            let conn = connecting.await.map_err(Into::into)?;
            let mut extras = axum::http::Extensions::new();
            conn.connected().get_extras(&mut extras);
            let peer = extras.get::<HttpInfo>().map(|i| i.remote_addr().ip());
            let via_listed_name = |ip: IpAddr| {
                names
                    .as_ref()
                    .is_some_and(|n| n.lock().unwrap().via_listed_name.contains(&ip))
            };
            match peer.and_then(|ip| destinations.refusal(ip, via_listed_name(ip))) {
                Some(why) => Err(why.into()),
                None => Ok(conn),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(list: &str) -> Destinations {
        list.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn without_a_list_internal_link_local_and_metadata_addresses_are_refused() {
        let any = Destinations::default();
        for refused in [
            "169.254.169.254",
            "169.254.1.2",
            "fe80::1",
            "100.100.100.200",
            "fd00:ec2::254",
            "::ffff:169.254.169.254",
            // The embedded forms of the metadata address.
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a9fe:a9fe",
            "2002:a9fe:a9fe::1",
            "::a9fe:a9fe",
            // This host, private networks, CGNAT.
            "127.0.0.1",
            "127.9.9.9",
            "::1",
            "0.0.0.0",
            "::",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "fc00::1",
            "fd12:3456::1",
            "::ffff:127.0.0.1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
            "::10.0.0.1",
        ] {
            assert!(any.refusal(ip(refused), false).is_some(), "{refused}");
        }
        for allowed in [
            "93.184.216.34",
            "100.128.0.1",
            "172.32.0.1",
            "2606:4700::1",
            "64:ff9b::5db8:d822",
            "2002:5db8:d822::1",
        ] {
            assert!(any.refusal(ip(allowed), false).is_none(), "{allowed}");
        }
    }

    #[test]
    fn internal_addresses_are_accepted_only_when_listed() {
        let loopback = Destinations::loopback();
        for allowed in ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1"] {
            assert!(loopback.refusal(ip(allowed), false).is_none(), "{allowed}");
        }
        for refused in [
            "10.0.0.1",
            "0.0.0.0",
            "::",
            "169.254.169.254",
            "93.184.216.34",
        ] {
            assert!(loopback.refusal(ip(refused), false).is_some(), "{refused}");
        }
        // Through a listed name, a private address is fine; metadata never.
        let named = d("hooks.internal");
        assert!(named.refusal(ip("10.0.0.5"), true).is_none());
        assert!(named.refusal(ip("10.0.0.5"), false).is_some());
        assert!(named.refusal(ip("64:ff9b::a9fe:a9fe"), true).is_some());
    }

    #[test]
    fn a_list_allows_its_networks_and_metadata_only_when_named() {
        let list = d("10.0.0.0/8, deploy.internal, 0.0.0.0/0");
        assert!(list.refusal(ip("10.9.9.9"), false).is_none());
        // A catch-all is not an explicit permission for metadata.
        assert!(list.refusal(ip("169.254.169.254"), false).is_some());
        assert!(list.lists_host("Deploy.Internal."));
        let named = d("169.254.169.254, fe80::/10");
        assert!(named.refusal(ip("169.254.169.254"), false).is_none());
        assert!(named.refusal(ip("169.254.169.253"), false).is_some());
        assert!(named.refusal(ip("fe80::9"), false).is_none());
        assert!(d("127.0.0.2").refusal(ip("127.0.0.1"), false).is_some());
        // A listed name may go to addresses outside the networks, but never
        // to metadata.
        assert!(d("x.internal").refusal(ip("10.0.0.1"), true).is_none());
        assert!(d("x.internal")
            .refusal(ip("169.254.169.254"), true)
            .is_some());
    }

    #[test]
    fn lists_parse_or_say_what_is_wrong() {
        assert_eq!(d(""), Destinations::default());
        assert_eq!(d(" , "), Destinations::default());
        assert!(Destinations::parse("10.0.0.0/33").is_err());
        assert!(Destinations::parse("http://x").is_err());
        assert!(Destinations::parse("[::1], ::ffff:10.0.0.1/128").is_ok());
    }

    #[tokio::test]
    async fn base_urls_are_checked_without_contacting_them() {
        let any = Destinations::default();
        assert!(any
            .check_url("http://169.254.169.254/latest")
            .await
            .is_err());
        assert!(any.check_url("http://[fd00:ec2::254]").await.is_err());
        assert!(any.check_url("http://127.0.0.1:9").await.is_err());
        for name in ["localhost", "LocalHost"] {
            let url = format!("http://{name}:9");
            let err = any.check_url(&url).await.unwrap_err();
            assert!(err.contains("names this host"), "{url}: {err}");
            assert!(
                Destinations::loopback().check_url(&url).await.is_ok(),
                "{url}"
            );
        }
        assert!(d("localhost").check_url("http://localhost:9").await.is_ok());
        assert!(any.check_url("http://localhost.:9").await.is_err());
        assert!(any.check_url("http://[::]:9").await.is_err());
        assert!(any.check_url("http://0.0.0.0:9").await.is_err());
        assert!(any.check_url("http://[64:ff9b::a9fe:a9fe]").await.is_err());
        assert!(any.check_url("http://unresolvable.invalid").await.is_ok());
        let list = d("127.0.0.2, hooks.internal");
        assert!(list.check_url("http://127.0.0.1:9").await.is_err());
        assert!(list.check_url("http://127.0.0.2:9").await.is_ok());
        assert!(list.check_url("http://hooks.internal:8080/x").await.is_ok());
        assert!(list.check_url("http://localhost:9").await.is_err());
    }
}
