//! File descriptors: every connection, inbound or outbound, and every
//! database connection needs one, and at the open-file limit `accept` and
//! `connect` both fail. [`raise_open_file_limit`] takes what the system
//! allows; [`connection_budget`] sizes the listeners so that, all full at
//! once, they still leave a reserve for the pump and the database.

use std::io;

use super::refuse::REFUSAL_SLOTS;

/// File descriptors kept aside in [`connection_budget`] for what is not a
/// connection: stdio, the epoll and eventfd of the runtime, log files, the
/// executable's own files, DNS lookups (resolv.conf, sockets) and slack.
pub const FD_BASE_OVERHEAD: u64 = 64;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns
/// `(soft, hard)` as in force afterwards; logs both at info level.
///
/// Most systems start services with a soft limit of 1024 and a far higher
/// hard limit; every connection (inbound or outbound) and every database
/// connection needs a descriptor, so run this first thing in `main`, then
/// size the listeners with [`connection_budget`]. When the hard limit is
/// unlimited (`RLIM_INFINITY`, which Linux does not accept as a soft
/// limit), the soft limit is raised to `/proc/sys/fs/nr_open` (or 1 048 576).
pub fn raise_open_file_limit() -> io::Result<(u64, u64)> {
    let (soft, hard) = get_nofile()?;
    let target = if hard == libc::RLIM_INFINITY {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse::<libc::rlim_t>().ok())
            .unwrap_or(1 << 20)
    } else {
        hard
    };
    if soft < target {
        let wanted = libc::rlimit {
            rlim_cur: target,
            rlim_max: hard,
        };
        // SAFETY: setrlimit reads the struct we pass and has no other effect on memory.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) } != 0 {
            let e = io::Error::last_os_error();
            tracing::warn!(soft, hard, error = %e, "cannot raise the open-file limit");
            return Err(e);
        }
    }
    let (soft, hard) = get_nofile()?;
    tracing::info!(soft, hard, "open-file limit (RLIMIT_NOFILE)");
    // rlim_t is u64 on 64-bit targets but u32 on 32-bit Linux.
    #[allow(clippy::useless_conversion)]
    Ok((u64::from(soft), u64::from(hard)))
}

/// The soft open-file limit in force.
pub fn current_open_file_limit() -> io::Result<u64> {
    // rlim_t is u64 on 64-bit targets but u32 on 32-bit Linux.
    #[allow(clippy::useless_conversion)]
    get_nofile().map(|(soft, _)| u64::from(soft))
}

fn get_nofile() -> io::Result<(libc::rlim_t, libc::rlim_t)> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((rl.rlim_cur, rl.rlim_max))
}

/// `max_connections` for each of `listeners` listeners sharing an open-file
/// soft limit of `soft_limit`, keeping `reserve` descriptors for everything
/// else that needs them at peak (the pump's outbound connections at full
/// concurrency, the database pool, the `PgListener` connection).
///
/// Formula, with L = `listeners` (at least 1):
///
/// ```text
/// per_listener = (soft_limit - reserve - FD_BASE_OVERHEAD - L * (1 + REFUSAL_SLOTS)) / L
/// ```
///
/// Each listener also holds its own socket and, while it is full, up to
/// [`REFUSAL_SLOTS`] connections being refused; those are subtracted before
/// the even split, so all listeners full at once never eat into `reserve`.
/// Returns at least 1 (a listener with no connection at all would be
/// useless), so with a tiny limit the sum can exceed the budget: check that
/// `soft_limit` is comfortably above `reserve` at start-up. An uneven split
/// (say, fewer for /metrics) is fine as long as the sum stays the same.
///
/// Example: soft 65 536, reserve 2 048, 3 listeners:
/// `(65536 - 2048 - 64 - 3 * 33) / 3 = 21 108` connections each.
pub fn connection_budget(soft_limit: u64, reserve: u64, listeners: usize) -> usize {
    let listeners = listeners.max(1) as u64;
    let fixed = reserve
        .saturating_add(FD_BASE_OVERHEAD)
        .saturating_add(listeners * (1 + REFUSAL_SLOTS as u64));
    let per = soft_limit.saturating_sub(fixed) / listeners;
    usize::try_from(per).unwrap_or(usize::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_formula() {
        // (65536 - 2048 - 64 - 3 * 33) / 3
        assert_eq!(connection_budget(65_536, 2_048, 3), 21_108);
        assert_eq!(connection_budget(1_024, 256, 1), 1_024 - 256 - 64 - 33);
        // Never zero, never panics.
        assert_eq!(connection_budget(100, 1_000, 3), 1);
        assert!(connection_budget(u64::MAX, u64::MAX, 0) == 1);
        assert!(connection_budget(u64::MAX, 0, 0) > 1 << 40);
    }
}
