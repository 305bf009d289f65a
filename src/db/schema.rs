//! The schemas' own statements: whether the producer's schema is there,
//! who owns it, which of its roles exist, and what applies the SQL files
//! ([`crate::sql_files`]) to a schema named at run time (the producer's
//! `watchpump` or the kit's `watchpump_inbox`).

use sqlx::PgConnection;

/// Whether this database has the `watchpump` schema (its bookkeeping
/// table): the CLI's commands other than `migrate` refuse one without it.
#[cfg(feature = "producer")]
pub async fn watchpump_schema_exists(pool: &sqlx::PgPool) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"select to_regclass('watchpump.schema_migrations') is not null as "exists!""#
    )
    .fetch_one(pool)
    .await
}

/// Whether this connection's role owns the `watchpump` schema (or is a
/// member of its owner): only the owner may create partitions and grant.
#[cfg(feature = "producer")]
pub async fn owns_watchpump_schema(conn: &mut PgConnection) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"select pg_has_role(nspowner, 'USAGE') as "owner!"
           from pg_namespace where nspname = 'watchpump'"#
    )
    .fetch_one(conn)
    .await
}

/// Waits, until the transaction ends, for the lock that every maker and
/// dropper of days of history takes (`prune()`, `add_partition()`) and
/// `sql/roles.sql` takes too; nothing to wait for in a database that has
/// no `watchpump.lock_class()` yet.
#[cfg(feature = "producer")]
pub async fn lock_history_if_made(conn: &mut PgConnection) -> sqlx::Result<()> {
    let made = sqlx::query_scalar!(
        r#"select to_regprocedure('watchpump.lock_class()') is not null as "made!""#
    )
    .fetch_one(&mut *conn)
    .await?;
    if made {
        sqlx::query!(
            "select from pg_advisory_xact_lock(watchpump.lock_class(), hashtext('watchpump.prune'))"
        )
        .execute(conn)
        .await?;
    }
    Ok(())
}

/// Runs `sql/roles.sql` in the caller's transaction, without its notices.
/// Not checked at build time: a file of several statements (DDL, `do`
/// blocks), which only the simple protocol runs.
#[cfg(feature = "producer")]
pub async fn apply_roles(conn: &mut PgConnection) -> sqlx::Result<()> {
    sqlx::query!("set local client_min_messages = error")
        .execute(&mut *conn)
        .await?;
    sqlx::raw_sql(include_str!("../../sql/roles.sql"))
        .execute(conn)
        .await?;
    Ok(())
}

/// Which of `roles` do not exist in the cluster.
#[cfg(feature = "producer")]
pub async fn missing_roles(pool: &sqlx::PgPool, roles: &[String]) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        r#"select r as "role!" from unnest($1::text[]) r
           where not exists (select from pg_roles where rolname = r)"#,
        roles
    )
    .fetch_all(pool)
    .await
}

// What `crate::sql_files` sends to apply SQL files to a schema named at run
// time: the producer's `watchpump` or the kit's `watchpump_inbox`.

/// Waits for `schema`'s migration lock until the transaction ends: one
/// migrate at a time applies its files (the key is the one older versions
/// took as a session lock, so that they take turns with this one too).
pub async fn lock_migrations_xact(conn: &mut PgConnection, schema: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "select from pg_advisory_xact_lock(hashtext($1::text || '.migrate'))",
        schema
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Quiet until the transaction ends: `if not exists` raises notices on
/// every start.
pub async fn quiet_until_commit(conn: &mut PgConnection) -> sqlx::Result<()> {
    sqlx::query!("set local client_min_messages = warning")
        .execute(conn)
        .await?;
    Ok(())
}

/// Whether `schema` has its bookkeeping table.
pub async fn has_bookkeeping(conn: &mut PgConnection, schema: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"select to_regclass($1::text || '.schema_migrations') is not null as "exists!""#,
        schema
    )
    .fetch_one(conn)
    .await
}

// The statements below name the schema in their text, which is chosen at
// run time: they cannot be checked at build time.

/// Creates `schema` and its bookkeeping table, if missing.
pub async fn create_bookkeeping(conn: &mut PgConnection, schema: &str) -> sqlx::Result<()> {
    sqlx::raw_sql(&format!(
        "create schema if not exists {schema};
         create table if not exists {schema}.schema_migrations (
             name        text primary key,
             checksum    bytea not null,
             applied_at  timestamptz not null default now()
         );"
    ))
    .execute(conn)
    .await?;
    Ok(())
}

/// The checksum the file `name` had when it was last applied to `schema`.
pub async fn applied_checksum(
    conn: &mut PgConnection,
    schema: &str,
    name: &str,
) -> sqlx::Result<Option<Vec<u8>>> {
    sqlx::query_scalar(&format!(
        "select checksum from {schema}.schema_migrations where name = $1"
    ))
    .bind(name)
    .fetch_optional(conn)
    .await
}

/// Runs one SQL file, in the caller's transaction: a file of statements
/// that only the simple protocol runs.
pub async fn run_file(conn: &mut PgConnection, sql: &'static str) -> sqlx::Result<()> {
    sqlx::raw_sql(sql).execute(conn).await?;
    Ok(())
}

/// Notes the file `name` as applied to `schema` with this checksum.
pub async fn record_applied(
    conn: &mut PgConnection,
    schema: &str,
    name: &str,
    checksum: &[u8],
) -> sqlx::Result<()> {
    sqlx::query(&format!(
        "insert into {schema}.schema_migrations (name, checksum) values ($1, $2)
         on conflict (name) do update set checksum = excluded.checksum, applied_at = now()"
    ))
    .bind(name)
    .bind(checksum)
    .execute(conn)
    .await?;
    Ok(())
}
