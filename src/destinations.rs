//! Where deliveries may go (issue 9): `WATCHPUMP_ALLOWED_DESTINATIONS`.
//!
//! A consumer's base URL is chosen by whoever registers the service, and
//! the pump then sends the producer's token there. Link-local and cloud
//! metadata addresses (169.254.0.0/16, fe80::/10, 100.100.100.200,
//! fd00:ec2::254) hand out the producer host's own credentials, so they are
//! refused unless an entry names them explicitly: an address or a network
//! inside one of those ranges (`0.0.0.0/0` does not count). When the list
//! is set, only its hosts and networks are accepted at all.
//!
//! It is checked twice: at `services add` / `set-url` ([`Destinations::check_url`]),
//! and at send time, on what a name resolves to now (a resolver that drops
//! refused addresses, so DNS cannot point an accepted name at a metadata
//! address later) and on the address actually connected to (which covers
//! base URLs with an IP literal, stored before the rule or the list
//! changed). A refused destination is then a connect error, "destination
//! not allowed", recorded on the attempt.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

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
    /// reached through a host name on the list.
    fn refusal(&self, ip: IpAddr, listed_name: bool) -> Option<String> {
        let ip = canonical(ip);
        if let Some(range) = Self::forbidden(ip) {
            let explicit = self.networks().any(|n| n.contains(ip) && n.within(range));
            return (!explicit).then(|| {
                format!("destination not allowed: {ip} is link-local or a cloud metadata address (name it in WATCHPUMP_ALLOWED_DESTINATIONS to allow it)")
            });
        }
        let allowed =
            listed_name || self.allowed.is_none() || self.networks().any(|n| n.contains(ip));
        (!allowed).then(|| {
            format!("destination not allowed: {ip} is not in WATCHPUMP_ALLOWED_DESTINATIONS")
        })
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
        } else if self.allowed.is_some() && !self.lists_host(host) {
            let addrs = tokio::net::lookup_host((host, 0)).await.map_err(|e| {
                format!("destination not allowed: {host} is not in WATCHPUMP_ALLOWED_DESTINATIONS and cannot be resolved to check its addresses: {e}")
            })?;
            addrs.map(|a| a.ip()).find_map(|ip| self.refusal(ip, false))
        } else {
            None
        };
        refused.map_or(Ok(()), Err)
    }

    /// A resolver for the pump's HTTP client that drops refused addresses
    /// (and fails when none is left).
    pub fn resolver(&self) -> Arc<Resolver> {
        Arc::new(Resolver(Arc::new(self.clone())))
    }

    /// A layer for the pump's HTTP client that drops a connection to a
    /// refused address (base URLs with an IP literal skip the resolver).
    pub fn connect_guard(&self) -> Guard<()> {
        Guard {
            inner: (),
            destinations: Arc::new(self.clone()),
        }
    }
}

/// See [`Destinations::resolver`].
pub struct Resolver(Arc<Destinations>);

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let destinations = self.0.clone();
        let name = name.as_str().to_string();
        Box::pin(async move {
            let listed = destinations.lists_host(&name);
            let mut refused = None;
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), 0))
                .await?
                .filter(|a| match destinations.refusal(a.ip(), listed) {
                    Some(why) => {
                        refused = Some(why);
                        false
                    }
                    None => true,
                })
                .collect();
            match (addrs.is_empty(), refused) {
                (true, Some(why)) => Err(format!("{why} ({name})").into()),
                _ => Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs),
            }
        })
    }
}

/// See [`Destinations::connect_guard`]: a tower layer (`inner: ()`) and
/// the service it makes around the connector.
#[derive(Debug, Clone)]
pub struct Guard<S> {
    inner: S,
    destinations: Arc<Destinations>,
}

impl<S> tower::Layer<S> for Guard<()> {
    type Service = Guard<S>;

    fn layer(&self, inner: S) -> Guard<S> {
        Guard {
            inner,
            destinations: self.destinations.clone(),
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
        Box::pin(async move {
            let conn = connecting.await.map_err(Into::into)?;
            let mut extras = axum::http::Extensions::new();
            conn.connected().get_extras(&mut extras);
            let peer = extras.get::<HttpInfo>().map(|i| i.remote_addr().ip());
            match peer.and_then(|ip| destinations.refusal(ip, false)) {
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
    fn without_a_list_only_link_local_and_metadata_are_refused() {
        let any = Destinations::default();
        for refused in [
            "169.254.169.254",
            "169.254.1.2",
            "fe80::1",
            "100.100.100.200",
            "fd00:ec2::254",
            "::ffff:169.254.169.254",
        ] {
            assert!(any.refusal(ip(refused), false).is_some(), "{refused}");
        }
        for allowed in ["127.0.0.1", "10.1.2.3", "100.100.100.201", "::1"] {
            assert!(any.refusal(ip(allowed), false).is_none(), "{allowed}");
        }
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
        assert!(any.check_url("http://127.0.0.1:9").await.is_ok());
        assert!(any.check_url("http://unresolvable.invalid").await.is_ok());
        let list = d("127.0.0.2, hooks.internal");
        assert!(list.check_url("http://127.0.0.1:9").await.is_err());
        assert!(list.check_url("http://127.0.0.2:9").await.is_ok());
        assert!(list.check_url("http://hooks.internal:8080/x").await.is_ok());
        assert!(list.check_url("http://localhost:9").await.is_err());
    }
}
