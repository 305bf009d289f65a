//! The send-time half of [`super`]: how the pump looks host names up
//! (asynchronous, cached, single-flight per name, with a timeout and a cap
//! on lookups running at once) and drops refused addresses, and the
//! connect guard that checks the address actually connected to.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper_util::client::legacy::connect::{Connection, HttpInfo};
use tokio::sync::Semaphore;

use super::Destinations;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

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
pub(super) struct Names {
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
        Guard::new(self.destinations.clone(), Some(self.names.clone()))
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

impl Guard<()> {
    /// `names`: the addresses a resolver found for listed names, which the
    /// guard lets through; none for [`Destinations::connect_guard`].
    pub(super) fn new(destinations: Arc<Destinations>, names: Option<Arc<Mutex<Names>>>) -> Self {
        Guard {
            inner: (),
            destinations,
            names,
        }
    }
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
