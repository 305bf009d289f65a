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
//!
//! This file is the policy (which addresses and names are refused, and
//! the check at registration); `resolver.rs` is the send-time half: the
//! pump's cached, bounded host name lookups and the connect guard.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

mod resolver;
#[cfg(test)]
mod tests;

pub use resolver::{Guard, Lookup, Resolver, MAX_PENDING_LOOKUPS};

/// How long `services add` and `set-url` wait for a name's addresses.
const CHECK_LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Refused unless explicitly allowed: link-local (where the metadata
/// services of AWS, GCP and Azure answer), Alibaba's metadata address, and
/// AWS's IPv6 metadata address.
const FORBIDDEN: [Net; 4] = [
    v4(169, 254, 0, 0, 16),
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10),
    v4(100, 100, 100, 200, 32),
    v6([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254], 128),
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
        Guard::new(Arc::new(self.clone()), None)
    }
}
