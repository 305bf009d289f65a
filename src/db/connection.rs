//! Statements about the session itself, of no SQL room: the pooler check's
//! probes (`crate::pooler`) and a standby's identity and lag
//! (`crate::replica`); and which errors mean the database went away for a
//! moment ([`is_gone`]), as start-up, the pooler check and the replica
//! check wait for it ([`START_UP_PATIENCE`]); and connecting, at once for
//! the CLI ([`connect`]) or waiting for a database that is coming back
//! ([`connect_waiting`]).
//!
//! Besides [`super::schema`], the one file with statements not checked at
//! build time: the pooler probe's, sent by the simple query protocol.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool, Row};

use crate::error::{Error, Result};

/// How long start-up waits for the database: to answer at all
/// ([`connect_waiting`]), and again if it goes away during the migration.
/// Long enough for a fast restart or a failover (the chaos suite's take
/// 1–10 s), short enough that a database that is really gone is reported.
pub const START_UP_PATIENCE: Duration = Duration::from_secs(30);

/// The connection broke or the server is shutting down or starting up: the
/// same statement can succeed once it is back.
pub fn is_gone(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => true,
        // 57P01-57P03: admin or crash shutdown, cannot connect now; class
        // 08: connection exceptions, but for 08P01 (a protocol violation,
        // which waiting does not cure).
        sqlx::Error::Database(d) => d.code().is_some_and(|c| {
            matches!(&*c, "57P01" | "57P02" | "57P03") || (c.starts_with("08") && c != "08P01")
        }),
        _ => false,
    }
}

// The pooler's sharing probe sends its statements by the simple query
// protocol (`raw_sql`, not checked at build time): a prepared statement,
// which every `query!` is, would itself fail behind the very pooler the
// probe looks for. Their text is fixed.

/// `begin`, by the simple query protocol.
pub async fn begin_simple(conn: &mut PgConnection) -> sqlx::Result<()> {
    sqlx::raw_sql("begin").execute(conn).await?;
    Ok(())
}

/// `commit`, by the simple query protocol.
pub async fn commit_simple(conn: &mut PgConnection) -> sqlx::Result<()> {
    sqlx::raw_sql("commit").execute(conn).await?;
    Ok(())
}

/// The server process the session's statement ran on, by the simple
/// query protocol.
pub async fn backend_pid_simple(conn: &mut PgConnection) -> sqlx::Result<i32> {
    sqlx::raw_sql("select pg_backend_pid()")
        .fetch_one(conn)
        .await?
        .try_get(0)
}

/// The session's value of the placeholder setting `name`, None if unset.
pub async fn setting(conn: &mut PgConnection, name: &str) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!("select current_setting($1, true)", name)
        .fetch_one(conn)
        .await
}

/// Whether the server is a standby (in recovery), and its database's name.
pub async fn recovery_and_database(pool: &PgPool) -> sqlx::Result<(bool, String)> {
    let row = sqlx::query!(
        r#"select pg_is_in_recovery() as "in_recovery!", current_database()::text as "database!""#
    )
    .fetch_one(pool)
    .await?;
    Ok((row.in_recovery, row.database))
}

/// The cluster's system identifier, which a primary and its standbys
/// share (`pg_control_system()`, which a role may be refused).
pub async fn system_identifier(pool: &PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"select system_identifier as "system_identifier!" from pg_control_system()"#
    )
    .fetch_one(pool)
    .await
}

/// A standby's lag in seconds, to the millisecond, by what it has
/// replayed (`crate::replica` says why it reads so); None when it has
/// replayed no transaction since it started. 0 for a server not in
/// recovery.
pub async fn standby_lag(pool: &PgPool) -> sqlx::Result<Option<f64>> {
    sqlx::query_scalar!(
        r#"select case
               when not pg_is_in_recovery() then 0
               when pg_last_wal_receive_lsn() is not distinct from pg_last_wal_replay_lsn()
                    and exists (select 1 from pg_stat_wal_receiver
                                where coalesce(status, 'streaming') = 'streaming')
                   then 0
               else round(extract(epoch from now() - pg_last_xact_replay_timestamp()), 3)
           end::float8 as "lag?""#
    )
    .fetch_one(pool)
    .await
}

/// Seconds since the server started, to the millisecond.
pub async fn seconds_since_start(pool: &PgPool) -> sqlx::Result<f64> {
    sqlx::query_scalar!(
        r#"select round(extract(epoch from now() - pg_postmaster_start_time()), 3)::float8 as "seconds!""#
    )
    .fetch_one(pool)
    .await
}

/// Opens a pool on `database_url` with `size` connections. One connection
/// is made first, so that a bad URL or a refused connection says why at
/// once (a pool only reports that it timed out waiting, after 10 s).
///
/// For the CLI's one-shot commands: they fail at once. `serve` waits for a
/// database that is not there yet ([`connect_waiting`]).
pub async fn connect(database_url: &str, size: u32) -> Result<PgPool> {
    connect_waiting(database_url, size, Duration::ZERO).await
}

/// [`connect`], but a database that is down, restarting or failing over
/// (connection refused or reset, "the database system is starting up") is
/// tried again every half second for up to `patience`, with a warning
/// that says why each time. A pump started during a PostgreSQL restart or
/// a failover (by a supervisor, or by hand) then starts when the database
/// is back instead of exiting. A bad URL, a wrong password or a missing
/// database fail at once: waiting does not cure them.
pub async fn connect_waiting(database_url: &str, size: u32, patience: Duration) -> Result<PgPool> {
    connect_as(database_url, size, patience, "DATABASE_URL").await
}

/// [`connect_waiting`] for the URL of `setting`, which its errors name.
pub(crate) async fn connect_as(
    database_url: &str,
    size: u32,
    patience: Duration,
    setting: &str,
) -> Result<PgPool> {
    let shown = crate::redact::mask_database_url(database_url);
    let options = parse_database_url(database_url, &shown, setting)?;
    let started = tokio::time::Instant::now();
    loop {
        match open_pool(&options, size).await {
            Ok(pool) => return Ok(pool),
            Err(e) if is_gone(&e) && started.elapsed() < patience => {
                tracing::warn!(
                    error = %cause(&e),
                    database = %shown,
                    waited_s = started.elapsed().as_secs(),
                    patience_s = patience.as_secs(),
                    "cannot connect to the database yet; trying again"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => {
                return Err(Error::Connect(format!(
                    "cannot connect to the database at {shown} ({setting}): {}",
                    cause(&e)
                )))
            }
        }
    }
}

fn parse_database_url(database_url: &str, shown: &str, setting: &str) -> Result<PgConnectOptions> {
    database_url
        .strip_prefix("postgres://")
        .or_else(|| database_url.strip_prefix("postgresql://"))
        .ok_or_else(|| {
            Error::Config(format!(
                "{setting} {shown:?} is not a PostgreSQL URL: it must start with postgres:// \
                 (e.g. postgres://user@127.0.0.1:5432/dbname)"
            ))
        })
        .and_then(|_| {
            database_url
                .parse::<PgConnectOptions>()
                .map_err(|e| Error::Config(format!("{setting} {shown:?} is not a valid URL: {e}")))
                // sqlx asks for extra_float_digits = 2 at connection, which
                // pgbouncer refuses unless told to ignore it: without it
                // `serve` reaches its own check (crate::pooler) and says
                // what to change. Floats are read in binary, and
                // PostgreSQL 12+ prints them exactly by default.
                .map(|options| options.extra_float_digits(None))
        })
}

/// One connection first (its error says why), then the pool.
async fn open_pool(
    options: &PgConnectOptions,
    size: u32,
) -> std::result::Result<PgPool, sqlx::Error> {
    let first = PgConnection::connect_with(options).await?;
    let _ = first.close().await;
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options.clone())
        .await
}

/// The error with its causes ("Connection refused (os error 111)").
fn cause(e: &sqlx::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}
