//! The backlog gauges, `watchpump_backlog{service,state}` and
//! `watchpump_oldest_due_age_seconds{service}`, read from PostgreSQL by one
//! pump at a time.
//!
//! Every pump runs a [`Collector`] on a connection of its own. The one that
//! holds the session advisory lock `watchpump.backlog` is the leader: each
//! interval it calls `watchpump.backlog_counts()`
//! (`sql/functions/0600_operator.sql`) on that connection and exports the
//! result, so however many pumps run, the database answers one such query
//! per interval. A query that succeeds on the lock's own connection proves
//! the lock is still held; when the leader's process or connection dies, the
//! lock goes with it and another pump takes over at its next step.
//!
//! The others only list the services, so that every pump creates each new
//! service's counters at zero ([`super::register_service`]) before its first
//! failure has to show as an increase.
//!
//! With `WATCHPUMP_READ_DATABASE_URL` set, the leader reads the backlog
//! and the consumers' gauges on the standby ([`Collector::reading`],
//! [`crate::replica`]), off the primary; the lock stays on the primary, and
//! each step still reads something on the lock's connection, which proves
//! the lock is held. The leader also exports how far behind the primary
//! the standby is (`watchpump_read_replica_lag_seconds`), what every page
//! read there says of itself.
//!
//! The exporter cannot remove a series: a pump that stops leading sets its
//! backlog gauges to NaN ("not measured here"), which `max by (service)`
//! ignores, and `watchpump_backlog_leader` to 0.

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, PgPool};

use crate::db::operator as db;
use crate::metrics as m;

/// Longest a step may take before its connection is given up (and with it
/// the lock, so that a stuck leader does not keep the gauges frozen).
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// How the connection shows in `pg_stat_activity`.
pub const APPLICATION_NAME: &str = "watchpump-backlog";

/// What a step found this pump to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Holds the lock and exported fresh gauges.
    Leader,
    /// Another pump holds the lock.
    Follower,
    /// The database could not be reached; the next step tries again.
    Disconnected,
}

/// One service's backlog, as `watchpump.backlog_counts()` returns it.
pub use crate::db::operator::BacklogCount as Backlog;

/// Reads every service's backlog.
pub async fn backlog(conn: &mut PgConnection) -> sqlx::Result<Vec<Backlog>> {
    db::backlog_counts(conn).await
}

/// One pump's share of the backlog gauges; see the module documentation.
pub struct Collector {
    options: PgConnectOptions,
    conn: Option<PgConnection>,
    leading: bool,
    /// Services whose counters this process has created.
    registered: HashSet<String>,
    /// Services whose backlog gauges this process has set while leading.
    exported: HashSet<String>,
    /// Whether the last step failed, so that an outage is logged once.
    failing: bool,
    /// Where the leader reads the gauges when not on its own connection: a
    /// standby's pool.
    reads: Option<PgPool>,
}

impl Collector {
    /// A collector connecting like `pool` does, on a connection of its own:
    /// a session lock must not go back to the pool with its connection.
    pub fn new(pool: &PgPool) -> Self {
        Collector {
            options: crate::leader::lock_connection(&pool.connect_options())
                .application_name(APPLICATION_NAME),
            conn: None,
            leading: false,
            registered: HashSet::new(),
            exported: HashSet::new(),
            failing: false,
            reads: None,
        }
    }

    /// The collector, reading the gauges on `standby` rather than on its
    /// lock's connection to the primary.
    pub fn reading(mut self, standby: PgPool) -> Self {
        self.reads = Some(standby);
        self
    }

    /// One round: connect if need be, try to lead, then export the backlog
    /// (leader) or look for new services (follower). Never fails: an error
    /// drops the connection, and with it the lead, until the next step.
    pub async fn step(&mut self) -> Role {
        let outcome = match tokio::time::timeout(STEP_TIMEOUT, self.try_step()).await {
            Ok(Ok(role)) => Ok(role),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {STEP_TIMEOUT:?}")),
        };
        match outcome {
            Ok(role) => {
                if self.failing {
                    tracing::info!("backlog gauges: database reachable again");
                }
                self.failing = false;
                role
            }
            Err(error) => {
                self.disconnect(&error);
                Role::Disconnected
            }
        }
    }

    async fn try_step(&mut self) -> sqlx::Result<Role> {
        let conn = match &mut self.conn {
            Some(conn) => conn,
            None => self
                .conn
                .insert(PgConnection::connect_with(&self.options).await?),
        };
        if !self.leading {
            self.leading = db::try_backlog_lock(conn).await?;
            if self.leading {
                tracing::info!("this pump now computes the backlog gauges");
            }
        }
        if !self.leading {
            let services = db::service_names(conn).await?;
            for service in &services {
                self.register(service);
            }
            return Ok(Role::Follower);
        }
        // Trace contexts emit() ignored as malformed: a sequence
        // (0009_trace_context.sql), read without a lock, and on the
        // primary even with a standby to read (a standby's sequence may be
        // up to 32 ahead: sequences are logged in advance). Read on the
        // lock's connection, it also proves the lock is held.
        let malformed = db::trace_context_malformed(conn).await?;
        metrics::counter!(m::TRACE_CONTEXT_MALFORMED).absolute(malformed.max(0) as u64);
        let (rows, consumers) = match &self.reads {
            Some(standby) => {
                let lag = crate::replica::standby_lag(standby).await?;
                metrics::gauge!(m::READ_REPLICA_LAG).set(lag);
                gauges(&mut *standby.acquire().await?).await?
            }
            None => gauges(conn).await?,
        };
        for (service, watches, rate) in consumers {
            metrics::gauge!(m::PAUSED_WATCHES, "service" => service.clone()).set(watches as f64);
            metrics::gauge!(m::RATE_LIMIT, "service" => service).set(rate.unwrap_or(0) as f64);
        }
        for row in &rows {
            self.register(&row.service);
            export(row);
            if !self.exported.contains(&row.service) {
                self.exported.insert(row.service.clone());
            }
        }
        // Set on every step, not only on taking the lead: it also says the
        // gauges are fresh.
        metrics::gauge!(m::BACKLOG_LEADER).set(1.0);
        Ok(Role::Leader)
    }

    fn register(&mut self, service: &str) {
        if !self.registered.contains(service) {
            m::register_service(service);
            self.registered.insert(service.to_string());
        }
    }

    fn disconnect(&mut self, error: &str) {
        let had_connection = self.conn.take().is_some();
        if self.leading {
            tracing::warn!(error, "backlog gauges: lost the connection and the lead");
            self.stop_leading();
        } else if had_connection || !self.failing {
            tracing::warn!(error, "backlog gauges: cannot reach the database; retrying");
        } else {
            tracing::debug!(error, "backlog gauges: still cannot reach the database");
        }
        self.failing = true;
    }

    fn stop_leading(&mut self) {
        self.leading = false;
        for service in &self.exported {
            for state in m::BACKLOG_STATES {
                metrics::gauge!(m::BACKLOG, "service" => service.clone(), "state" => *state)
                    .set(f64::NAN);
            }
            metrics::gauge!(m::OLDEST_DUE_AGE, "service" => service.clone()).set(f64::NAN);
            metrics::gauge!(m::PAUSED_WATCHES, "service" => service.clone()).set(f64::NAN);
            metrics::gauge!(m::RATE_LIMIT, "service" => service.clone()).set(f64::NAN);
        }
        metrics::gauge!(m::BACKLOG_LEADER).set(0.0);
        metrics::gauge!(m::READ_REPLICA_LAG).set(f64::NAN);
    }

    /// Closes the connection, which releases the lock at once for another
    /// pump to take at its next step.
    pub async fn close(mut self) {
        if let Some(conn) = self.conn.take() {
            let _ = conn.close().await;
        }
        if self.leading {
            self.stop_leading();
        }
    }
}

/// What the leader exports from the tables: the backlog, and each
/// consumer's paused watches and rate.
type Gauges = (Vec<Backlog>, Vec<(String, i64, Option<i32>)>);

async fn gauges(conn: &mut PgConnection) -> sqlx::Result<Gauges> {
    let rows = backlog(&mut *conn).await?;
    let consumers = db::consumer_gauges(conn).await?;
    Ok((rows, consumers))
}

fn export(row: &Backlog) {
    let counts = [row.pending, row.in_flight, row.due_now, row.failed_24h];
    for (state, count) in m::BACKLOG_STATES.iter().zip(counts) {
        metrics::gauge!(m::BACKLOG, "service" => row.service.clone(), "state" => *state)
            .set(count as f64);
    }
    metrics::gauge!(m::OLDEST_DUE_AGE, "service" => row.service.clone()).set(row.oldest_due_age);
}

/// Runs a collector every `interval` until `shutdown` resolves.
pub async fn run(pool: PgPool, interval: Duration, shutdown: impl Future<Output = ()>) {
    run_collector(Collector::new(&pool), interval, shutdown).await
}

/// [`run`] with a collector made beforehand ([`Collector::reading`]).
pub async fn run_collector(
    mut collector: Collector,
    interval: Duration,
    shutdown: impl Future<Output = ()>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tick.tick() => {}
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = collector.step() => {}
        }
    }
    collector.close().await;
}
