//! Reads on a standby (`WATCHPUMP_READ_DATABASE_URL`, issue 36): the
//! pages that only list (the panel's overview, deliveries, watches and
//! warnings; the admin API's backlog, deliveries, watches and warnings; the
//! consumer API's deliveries and watches) and the backlog gauges read a
//! streaming standby, and each page says how far behind it is
//! (`replica_lag_seconds`, [`Reads::lag`]).
//!
//! Everything that writes stays on the primary: claims, sweeps, write-backs,
//! retries, the lifecycle, the leaders' locks. So do the reads that must see
//! a write just made: a service's token, a panel session, one delivery's or
//! one watch's page (opened after a retry or a pause), a service's page
//! (its lifecycle forms). Unset, everything reads the primary, and no page
//! carries a lag.

use sqlx::PgPool;

use crate::db::connection as db;
use crate::error::{Error, Result};

/// The setting, for messages.
const SETTING: &str = "WATCHPUMP_READ_DATABASE_URL";

/// Where the listing pages read: the primary's pool, or a standby's.
#[derive(Clone, Debug)]
pub struct Reads {
    pool: PgPool,
    standby: bool,
}

impl Reads {
    /// Reads on the primary (no `WATCHPUMP_READ_DATABASE_URL`).
    pub fn primary(pool: PgPool) -> Reads {
        Reads {
            pool,
            standby: false,
        }
    }

    /// Reads on a standby's pool.
    pub fn standby(pool: PgPool) -> Reads {
        Reads {
            pool,
            standby: true,
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn is_standby(&self) -> bool {
        self.standby
    }

    /// How far behind the primary the standby's answers are, in seconds
    /// (to the millisecond); none when the pages read the primary.
    pub async fn lag(&self) -> Result<Lag> {
        if !self.standby {
            return Ok(Lag::default());
        }
        Ok(Lag {
            replica_lag_seconds: Some(standby_lag(&self.pool).await?),
        })
    }
}

/// How far behind the primary a page read on a standby is: one field of
/// every listing's answer (flattened into it), and a line of the panel's
/// pages ([`panel_line`]); absent when the page was read on the primary.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, utoipa::ToSchema)]
#[schema(as = ReplicaLag)]
pub struct Lag {
    /// Present when the page was read on a standby (WATCHPUMP_READ_DATABASE_URL): how many seconds behind the primary it is, 0 when it has replayed all it received; what changed since is not on the page yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    replica_lag_seconds: Option<f64>,
}

/// Where the listing pages read: the standby at `read_url`
/// (`WATCHPUMP_READ_DATABASE_URL`, up to `size` connections), checked as
/// DATABASE_URL is (no pooler that shares sessions: [`crate::pooler`]) and
/// for being a copy of `primary`'s database; without it, `primary`. A
/// standby down at start is waited for as the primary is.
pub async fn connect(read_url: Option<&str>, size: u32, primary: &PgPool) -> Result<Reads> {
    let Some(url) = read_url else {
        return Ok(Reads::primary(primary.clone()));
    };
    let shown = crate::redact::mask_database_url(url);
    let patience = crate::db::connection::START_UP_PATIENCE;
    let pool = crate::db::connection::connect_as(url, size.max(2), patience, SETTING).await?;
    crate::pooler::check_sessions(&pool.connect_options(), SETTING).await?;
    let (read, written) = (Identity::of(&pool).await?, Identity::of(primary).await?);
    let other_cluster =
        read.system.is_some() && written.system.is_some() && read.system != written.system;
    if read.database != written.database || other_cluster {
        return Err(Error::Config(format!(
            "{SETTING} ({shown}) must be a standby of DATABASE_URL's primary, naming the \
             same database: it is database {:?}{}, DATABASE_URL's is {:?}",
            read.database,
            if other_cluster {
                " of another cluster"
            } else {
                ""
            },
            written.database
        )));
    }
    if read.in_recovery {
        tracing::info!(database = %shown, "the listing pages and the backlog gauges read the standby");
    } else {
        tracing::warn!(database = %shown,
            "{SETTING} is not a standby (pg_is_in_recovery() is false): the listing pages read it, and show it 0 s behind");
    }
    Ok(Reads::standby(pool))
}

/// What tells a standby of the primary's database from another database.
struct Identity {
    in_recovery: bool,
    database: String,
    /// The cluster's system identifier, which a primary and its standbys
    /// share; None where the role may not read it.
    system: Option<i64>,
}

impl Identity {
    async fn of(pool: &PgPool) -> Result<Identity> {
        let (in_recovery, database) = db::recovery_and_database(pool).await?;
        let system = db::system_identifier(pool).await.ok();
        Ok(Identity {
            in_recovery,
            database,
            system,
        })
    }
}

/// The standby's lag. `now() - pg_last_xact_replay_timestamp()` alone is
/// the time since the primary's last commit the standby replayed, which
/// grows while the primary is idle though the standby has everything; so
/// a standby that has replayed all the WAL it received, with its WAL
/// receiver running (streaming, where the role may see its status: that
/// takes `pg_read_all_stats`), is 0 behind. One that has WAL it has not
/// replayed yet (replay paused, or slower than the primary), or whose
/// receiver is down, is behind by the time since the last commit it
/// replayed: an upper bound, exact while the primary commits steadily.
/// A server not in recovery (promoted, or the primary itself) is 0 behind.
/// What a page read there shows, and the backlog leader's gauge.
pub async fn standby_lag(pool: &PgPool) -> sqlx::Result<f64> {
    // No transaction replayed since the standby started: as far behind as
    // it can tell, which is "not known"; shown as the time since it started.
    match db::standby_lag(pool).await? {
        Some(lag) => Ok(lag.max(0.0)),
        None => Ok(db::seconds_since_start(pool).await?),
    }
}

/// The panel's line for a page read on a standby; empty on the primary.
pub fn panel_line(lag: Lag) -> String {
    match lag.replica_lag_seconds {
        Some(lag) => format!(
            r#"<p class="muted replica">Read from a standby, {lag:.1} s behind the primary: what changed since is not shown yet.</p>"#
        ),
        None => String::new(),
    }
}
