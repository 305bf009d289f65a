//! Connection poolers in front of PostgreSQL (docs/operator.md,
//! "Connection poolers"): what works through one, and the check `watchpump
//! serve` makes at start so that it refuses what it cannot work through.
//!
//! A producer's `watchpump.emit(...)` is one statement in the producer's
//! own transaction, so it works through transaction pooling (pgbouncer's
//! `pool_mode = transaction`), trace context included: `set_config(...,
//! true)` lasts as long as that transaction (tests/pooler.rs).
//!
//! `watchpump serve` cannot work through transaction pooling, whose server
//! sessions are shared between clients transaction by transaction:
//!
//! - sqlx, its driver, prepares each statement once per connection, by a
//!   name of its own (`sqlx_s_1`, ...), and executes it by that name
//!   afterwards; pgbouncer before 1.21 does not follow prepared statements
//!   from one server session to another, so a statement is executed where
//!   it was never prepared, or prepared where another client's statement
//!   already has its name;
//! - the leaders of the operator task and of the backlog gauges hold
//!   session advisory locks ([`crate::leader`]), which would stay with a
//!   server session another client gets next;
//! - the pump's listener waits for NOTIFY on a session of its own;
//! - the pump's connections carry startup settings (the `options` startup
//!   parameter: `pump::pump_pool`, [`crate::leader::lock_connection`]),
//!   which pgbouncer refuses in every pool mode ("unsupported startup
//!   parameter: options") or, listed in its `ignore_startup_parameters`,
//!   drops without a word.
//!
//! [`check`] finds both before `serve` migrates anything.

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};

use crate::db::connection as db;
use crate::error::{Error, Result};

/// Rounds of the sharing probe ([`sessions_shared`]). One is enough behind
/// an idle pgbouncer (it hands out the server session released last); the
/// others are for one whose sessions other clients take in between.
const ROUNDS: usize = 5;

/// How long the probe may take. A session pool with no server session to
/// spare makes the probe's second session wait; that is no transaction
/// pooling, and `serve` goes on (and meets the pool's limit later, as
/// without the check).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The placeholder setting the startup-settings probe sends and reads back.
const PROBE_SETTING: &str = "watchpump.startup_probe";

/// Refuses a database behind a pooler `serve` cannot work through: one that
/// shares server sessions between clients (transaction or statement
/// pooling), or one that does not pass the startup settings the pump's
/// connections carry. `setting` names where the URL came from
/// (`DATABASE_URL`), for the message.
pub async fn check(options: &PgConnectOptions, setting: &str) -> Result<()> {
    patiently(|| async {
        check_sessions_once(options, setting).await?;
        check_startup_settings(options, setting).await
    })
    .await
}

/// `probe`, tried again while the database is away (a restart or a
/// failover during start-up, as `serve`'s other start-up steps do, up to
/// [`crate::db::connection::START_UP_PATIENCE`]): a probe cut short by the
/// database going away, or refused while it shuts down or starts, is no
/// evidence of a pooler.
async fn patiently<F, Fut>(probe: F) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let started = tokio::time::Instant::now();
    loop {
        match probe().await {
            Err(Error::Database(e))
                if crate::db::connection::is_gone(&e)
                    && started.elapsed() < crate::db::connection::START_UP_PATIENCE =>
            {
                tracing::warn!(error = %e, "the database went away during the pooler check; trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            done => return done,
        }
    }
}

/// The sharing half of [`check`], for connections that need sessions of
/// their own but carry no startup settings: `migrate`'s, and the reads on
/// a standby ([`crate::replica`]). pgbouncer's statement pooling shows as
/// a refused transaction.
pub async fn check_sessions(options: &PgConnectOptions, setting: &str) -> Result<()> {
    patiently(|| check_sessions_once(options, setting)).await
}

async fn check_sessions_once(options: &PgConnectOptions, setting: &str) -> Result<()> {
    match sessions_shared(options).await? {
        Some(evidence) => Err(Error::Config(format!(
            "{setting} reaches PostgreSQL through a connection pooler that shares server \
             sessions between clients (transaction or statement pooling, such as pgbouncer's \
             pool_mode = transaction): {evidence}. watchpump needs sessions of its own (sqlx's \
             prepared statements, the leaders' session advisory locks, LISTEN, the pump's \
             startup settings): point {setting} at PostgreSQL itself, or at a pool with \
             pool_mode = session that passes the startup parameter `options` (pgbouncer passes \
             it in no mode). Producers' emit() works through transaction pooling \
             (docs/operator.md, \"Connection poolers\")."
        ))),
        None => Ok(()),
    }
}

/// Whether two sessions of watchpump's own share a server session, and the
/// evidence. Session `b` holds a transaction open while `a` runs a
/// statement: with a session (or no) pooler `a` keeps its server process and
/// `b` never gets it; with transaction pooling `b` takes the server session
/// `a` just released (pgbouncer reuses the last released first), or `a`
/// moves to another. The statements go by the simple query protocol: a
/// prepared statement would itself fail behind such a pooler.
async fn sessions_shared(options: &PgConnectOptions) -> Result<Option<String>> {
    let mut a = PgConnection::connect_with(options).await?;
    let mut b = PgConnection::connect_with(options).await?;
    let probe = tokio::time::timeout(PROBE_TIMEOUT, rounds(&mut a, &mut b)).await;
    let _ = a.close().await;
    let _ = b.close().await;
    match probe {
        Ok(found) => found,
        Err(_) => {
            tracing::warn!(
                "could not tell within {PROBE_TIMEOUT:?} whether a pooler shares sessions \
                 (a second session waited for a server connection); going on"
            );
            Ok(None)
        }
    }
}

async fn rounds(a: &mut PgConnection, b: &mut PgConnection) -> Result<Option<String>> {
    for _ in 0..ROUNDS {
        let first = backend(a).await?;
        let held = match holding(b).await {
            Ok(held) => held,
            // The database going away (a restart) is no evidence.
            Err(Error::Database(e)) if crate::db::connection::is_gone(&e) => {
                return Err(Error::Database(e))
            }
            // pgbouncer's statement pooling refuses transactions.
            Err(e) => return Ok(Some(format!("a transaction was refused: {e}"))),
        };
        let again = backend(a).await?;
        db::commit_simple(b).await?;
        if held == first {
            return Ok(Some(format!(
                "two of its sessions ran on one server process ({first})"
            )));
        }
        if again != first {
            return Ok(Some(format!(
                "one of its sessions moved from server process {first} to {again}"
            )));
        }
    }
    Ok(None)
}

/// Opens a transaction on `conn` and returns its server process.
async fn holding(conn: &mut PgConnection) -> Result<i32> {
    db::begin_simple(conn).await?;
    backend(conn).await
}

/// The server process the session's statement ran on.
async fn backend(conn: &mut PgConnection) -> Result<i32> {
    Ok(db::backend_pid_simple(conn).await?)
}

/// Refuses a pooler that refuses or drops the startup parameter `options`
/// (a probe setting, read back): the pump sets its commit and isolation
/// settings with it, and the lock connections their keepalives.
async fn check_startup_settings(options: &PgConnectOptions, setting: &str) -> Result<()> {
    let probe = options.clone().options([(PROBE_SETTING, "on")]);
    let fix = format!(
        "the pump's connections set their commit and isolation settings at connection \
         (the startup parameter `options`), which pgbouncer refuses in every pool mode: \
         point {setting} at PostgreSQL itself (docs/operator.md, \"Connection poolers\")"
    );
    let mut conn = match PgConnection::connect_with(&probe).await {
        Ok(conn) => conn,
        Err(sqlx::Error::Database(e)) if e.message().contains("startup parameter") => {
            return Err(Error::Config(format!(
                "{setting} refuses startup settings ({}): {fix}",
                e.message()
            )))
        }
        Err(e) => return Err(e.into()),
    };
    let read = db::setting(&mut conn, PROBE_SETTING).await?;
    let _ = conn.close().await;
    if read.as_deref() == Some("on") {
        return Ok(());
    }
    Err(Error::Config(format!(
        "{setting} drops startup settings on the way (a pooler that ignores the startup \
         parameter `options`, such as pgbouncer with it in ignore_startup_parameters): {fix}"
    )))
}
