//! Connections per client address, so that one host cannot fill a
//! listener for everyone else.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// The address a client is counted under, here and by the authentication
/// throttle: IPv4 addresses one by one (an IPv4-mapped IPv6 address as its
/// IPv4 address), IPv6 by /64, the block one host usually gets (so it
/// cannot dodge a limit by rotating addresses).
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut octets = v6.octets();
                octets[8..].fill(0);
                IpAddr::V6(octets.into())
            }
        },
    }
}

/// Per-address connection counts for `max_connections_per_ip`. Holds at most
/// one entry per open connection.
pub(super) struct PerIp {
    limit: usize,
    counts: Mutex<HashMap<IpAddr, usize>>,
}

impl PerIp {
    pub(super) fn new(limit: usize) -> Arc<Self> {
        Arc::new(PerIp {
            limit,
            counts: Mutex::new(HashMap::new()),
        })
    }

    pub(super) fn try_take(self: &Arc<Self>, ip: IpAddr) -> Option<IpSlot> {
        let key = client_key(ip);
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(key).or_insert(0);
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(IpSlot {
            per_ip: self.clone(),
            key,
        })
    }
}

/// One connection's share of its address's count; released on drop.
pub(super) struct IpSlot {
    per_ip: Arc<PerIp>,
    key: IpAddr,
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut counts = self.per_ip.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_ip_counts_and_keys() {
        let per_ip = PerIp::new(2);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        let s1 = per_ip.try_take(a).unwrap();
        let _s2 = per_ip.try_take(mapped).unwrap();
        assert!(per_ip.try_take(a).is_none());
        drop(s1);
        assert!(per_ip.try_take(a).is_some());
        // Same /64, different hosts: one budget.
        let v6a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let v6b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let v6c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        let _x = per_ip.try_take(v6a).unwrap();
        let _y = per_ip.try_take(v6b).unwrap();
        assert!(per_ip.try_take(v6a).is_none());
        assert!(per_ip.try_take(v6c).is_some());
    }
}
