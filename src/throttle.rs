//! Failed authentications, counted per client address, so that guessing a
//! token costs a window per few tries instead of thousands of tries a
//! second (issue 9).
//!
//! The rule: an address (IPv4, or IPv6 /64, as [`crate::edge::client_key`]
//! counts it) may fail `WATCHPUMP_AUTH_FAILURES` times per
//! `WATCHPUMP_AUTH_WINDOW_SECS`, the window starting at its first failure.
//! Once it has used them, every request of that address through the same
//! [`Door`] is answered 429 with `Retry-After` until the window ends,
//! **the right token included**: checking it during the lock-out would tell
//! a guesser which try was right, and the lock-out would slow nothing.
//! Successes neither count nor reset the count (a service that holds one
//! valid token could otherwise keep guessing others').
//!
//! A failure is a request that presents credentials that do not open the
//! door (a request without any is merely unauthenticated). Each failure is
//! logged with the client's address; a lock-out is logged when it starts,
//! the requests refused during it only at debug level. The success path
//! costs one lookup in memory: no database access is added to it.
//!
//! Memory is bounded: at most [`MAX_ADDRESSES`] addresses are tracked;
//! beyond that, after dropping finished windows, new addresses share one
//! count (a flood from many addresses then locks out only newcomers).
//!
//! The address comes from [`crate::edge::serve`]. Served without it (plain
//! `axum::serve`, as an embedding may do), addresses are unknown and
//! failures are logged but not counted. Behind a reverse proxy every client
//! has the proxy's address: the throttle then counts them together (so
//! does the edge's per-address connection cap).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use clap::Args;

use crate::edge::client_key;

/// Addresses tracked at most (about 5 MB).
pub const MAX_ADDRESSES: usize = 65_536;

/// What the failures are counted against: each door has its own count per
/// address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Door {
    /// The admin token: panel logins and the admin API (one secret, one
    /// count).
    Admin,
    /// Consumer service tokens on the watches API.
    Service,
}

/// The throttle's settings, part of `watchpump serve`.
#[derive(Debug, Clone, Args)]
pub struct ThrottleConfig {
    /// Failed authentications (panel log-ins, admin tokens, service tokens)
    /// one client address may make per window; then it is answered 429,
    /// even with the right token, until the window ends.
    #[arg(long, env = "WATCHPUMP_AUTH_FAILURES", default_value_t = 10)]
    pub auth_failures: u32,

    /// The window, in seconds, starting at an address's first failure.
    #[arg(long, env = "WATCHPUMP_AUTH_WINDOW_SECS", default_value_t = 60)]
    pub auth_window_secs: u64,
}

impl ThrottleConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.auth_failures == 0 || self.auth_window_secs == 0 {
            return Err(
                "WATCHPUMP_AUTH_FAILURES and WATCHPUMP_AUTH_WINDOW_SECS must be above zero".into(),
            );
        }
        Ok(())
    }

    pub fn throttle(&self) -> Throttle {
        Throttle::new(
            self.auth_failures,
            Duration::from_secs(self.auth_window_secs),
        )
    }
}

/// One address's failures at one door.
#[derive(Debug, Clone, Copy)]
struct Count {
    since: Instant,
    failures: u32,
}

/// Failed authentications per door and client address.
#[derive(Debug)]
pub struct Throttle {
    failures: u32,
    window: Duration,
    counts: Mutex<HashMap<(Door, IpAddr), Count>>,
}

/// The address a request came from, from the `ConnectInfo` that
/// [`crate::edge::serve`] gives every request; None when served without it
/// (`axum::serve` without connect info, as an embedding or a test may do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub Option<IpAddr>);

impl ClientAddr {
    pub fn of(parts: &Parts) -> ClientAddr {
        ClientAddr(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0.ip()),
        )
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ClientAddr {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(ClientAddr::of(parts))
    }
}

impl Default for Throttle {
    /// 10 failures per minute, `watchpump serve`'s default.
    fn default() -> Self {
        Throttle::new(10, Duration::from_secs(60))
    }
}

impl Throttle {
    pub fn new(failures: u32, window: Duration) -> Throttle {
        Throttle {
            failures: failures.max(1),
            window,
            counts: Mutex::new(HashMap::new()),
        }
    }

    /// `Err(how long until the window ends)` while `client` may not try
    /// `door`. A client whose address is unknown is never held back.
    pub fn check(&self, door: Door, client: Option<IpAddr>) -> Result<(), Duration> {
        match client {
            Some(client) => self.check_at(door, client, Instant::now()),
            None => Ok(()),
        }
    }

    /// Counts a failure of `client` at `door` and logs it with the
    /// client's address; returns the failures in its window so far.
    ///
    /// A failure whose address is unknown is logged and not counted:
    /// counted together, one client's failures would lock every client out.
    pub fn fail(&self, door: Door, client: Option<IpAddr>, what: &str) -> u32 {
        let Some(client) = client else {
            tracing::warn!(client = "unknown", ?door,
                "{what}; not counted: the client's address is unknown (serve through watchpump::edge::serve)");
            return 0;
        };
        let failures = self.fail_at(door, client, Instant::now());
        if failures >= self.failures {
            tracing::warn!(%client, ?door, failures, window = ?self.window,
                "{what}; this address is locked out until its window ends");
        } else {
            tracing::warn!(%client, ?door, failures, "{what}");
        }
        failures
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(Door, IpAddr), Count>> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check_at(&self, door: Door, client: IpAddr, now: Instant) -> Result<(), Duration> {
        let counts = self.lock();
        let Some(count) = counts.get(&(door, client_key(client))) else {
            return Ok(());
        };
        let ends = count.since + self.window;
        if count.failures >= self.failures && now < ends {
            Err(ends - now)
        } else {
            Ok(())
        }
    }

    fn fail_at(&self, door: Door, client: IpAddr, now: Instant) -> u32 {
        let mut counts = self.lock();
        let mut key = (door, client_key(client));
        if !counts.contains_key(&key) && counts.len() >= MAX_ADDRESSES {
            counts.retain(|_, c| now < c.since + self.window);
            if counts.len() >= MAX_ADDRESSES {
                key = (door, IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            }
        }
        let count = counts.entry(key).or_insert(Count {
            since: now,
            failures: 0,
        });
        if now >= count.since + self.window {
            *count = Count {
                since: now,
                failures: 0,
            };
        }
        count.failures += 1;
        count.failures
    }
}

/// `Retry-After` in whole seconds, never 0 (a client would retry at once).
pub fn retry_after_secs(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

/// The `Retry-After` header's value for `wait`.
pub fn retry_after(wait: Duration) -> axum::http::HeaderValue {
    axum::http::HeaderValue::from(retry_after_secs(wait))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

    #[test]
    fn an_address_is_locked_out_after_its_failures_until_the_window_ends() {
        let t = Throttle::new(3, Duration::from_secs(60));
        let t0 = Instant::now();
        for n in 1..=3 {
            assert!(t.check_at(Door::Admin, A, t0).is_ok());
            assert_eq!(t.fail_at(Door::Admin, A, t0), n);
        }
        let later = t0 + Duration::from_secs(20);
        assert_eq!(
            t.check_at(Door::Admin, A, later),
            Err(Duration::from_secs(40))
        );
        // Another address, and another door, are not affected.
        assert!(t.check_at(Door::Admin, B, later).is_ok());
        assert!(t.check_at(Door::Service, A, later).is_ok());
        // The window ends: a fresh start.
        let after = t0 + Duration::from_secs(60);
        assert!(t.check_at(Door::Admin, A, after).is_ok());
        assert_eq!(t.fail_at(Door::Admin, A, after), 1);
    }

    #[test]
    fn ipv6_addresses_count_by_64() {
        let t = Throttle::new(1, Duration::from_secs(60));
        let now = Instant::now();
        t.fail_at(Door::Service, "2001:db8::1".parse().unwrap(), now);
        assert!(t
            .check_at(Door::Service, "2001:db8::ffff".parse().unwrap(), now)
            .is_err());
        assert!(t
            .check_at(Door::Service, "2001:db8:0:1::1".parse().unwrap(), now)
            .is_ok());
    }

    #[test]
    fn an_unknown_address_is_neither_counted_nor_held_back() {
        let t = Throttle::new(1, Duration::from_secs(60));
        for _ in 0..3 {
            assert_eq!(t.fail(Door::Service, None, "test"), 0);
        }
        assert!(t.check(Door::Service, None).is_ok());
        assert!(t.check(Door::Service, Some(A)).is_ok());
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(40)), 40);
        assert_eq!(retry_after_secs(Duration::from_millis(40_001)), 41);
    }
}
