//! Jobs that run once per database, whatever the number of pumps, and how
//! one pump is chosen for each (a leader with failover, as River does it):
//!
//! | job | where | how one at a time |
//! |---|---|---|
//! | warnings (fold, send) and pruning | [`crate::operator::worker`] | session advisory lock `watchpump.operator` on a connection of its own |
//! | backlog gauges | [`crate::metrics::backlog`] | session advisory lock `watchpump.backlog` on a connection of its own |
//! | deadline check | `watchpump.sweep()` | `prune_position.deadlines_checked_at`, row locked `for update skip locked`: one pump per interval |
//!
//! Every pump runs the rest on its own: claims, sends and write-backs, and
//! the sweep's sleeper row (each pump says it is alive and asleep).
//!
//! A session lock goes with its connection: when the leader dies, its
//! connection closes and another pump takes the lock at its next tick.
//! A leader cut off from the database is the hard case: the server keeps
//! the session (and the lock) until it notices the client is gone, which
//! with the operating system's TCP defaults takes two hours. The lock
//! connections therefore ask the server to probe them ([`lock_connection`]):
//! a partitioned leader's session ends within about 15 s and another pump
//! leads; the cut-off leader's own checks time out and it stops leading.

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

/// How long a leader's check of its lock connection may take before it
/// gives the connection (and the lock) up.
pub const LOCK_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// `options` for a connection that holds a session advisory lock: the
/// server sends a keepalive after 5 s idle, every 2 s, and drops the
/// session after 3 unanswered (about 11 s), or when data it sent stays
/// unacknowledged for 10 s (`tcp_user_timeout`), so that the lock of a
/// leader cut off from the database is released for another pump.
pub fn lock_connection(options: &PgConnectOptions) -> PgConnectOptions {
    options.clone().options([
        ("tcp_keepalives_idle", "5"),
        ("tcp_keepalives_interval", "2"),
        ("tcp_keepalives_count", "3"),
        ("tcp_user_timeout", "10000"),
    ])
}
