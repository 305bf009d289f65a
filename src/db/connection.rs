//! Statements about the session itself, of no SQL room: the pooler check's
//! probes (`crate::pooler`) and a standby's identity and lag
//! (`crate::replica`).

use sqlx::{PgConnection, PgPool, Row};

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
