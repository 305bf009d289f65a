//! Embedded SQL files applied to a schema of their own, with bookkeeping of
//! their own (`<schema>.schema_migrations`) rather than sqlx's
//! `_sqlx_migrations`, which the service's own migrations may already use in
//! the same database. The producer's `watchpump` schema ([`crate::schema`])
//! and the kit's `watchpump_inbox` ([`crate::kit::schema`]) are both applied
//! here.

use sha2::{Digest, Sha256};
use sqlx::{Connection, PgConnection, PgPool};

/// One SQL file, embedded at build time.
pub struct SqlFile {
    pub name: &'static str,
    pub sql: &'static str,
    /// `create or replace` files are applied again when their text changes;
    /// the others (migrations) once.
    pub reapply_on_change: bool,
}

/// Brings `schema` up to date with `files`, in order; returns the names of
/// the files it applied. Safe to run from several processes at once (they
/// take turns on an advisory lock) and on every start.
pub async fn apply(
    pool: &PgPool,
    schema: &'static str,
    files: &[SqlFile],
) -> sqlx::Result<Vec<String>> {
    let mut conn = pool.acquire().await?;
    let lock = format!("hashtext('{schema}.migrate')");
    sqlx::query(&format!("select pg_advisory_lock({lock})"))
        .execute(&mut *conn)
        .await?;
    let applied = apply_all(&mut conn, schema, files).await;
    sqlx::query(&format!("select pg_advisory_unlock({lock})"))
        .execute(&mut *conn)
        .await?;
    applied
}

async fn apply_all(
    conn: &mut PgConnection,
    schema: &str,
    files: &[SqlFile],
) -> sqlx::Result<Vec<String>> {
    // Quietly: `if not exists` raises notices on every start.
    sqlx::raw_sql("set client_min_messages = warning")
        .execute(&mut *conn)
        .await?;
    // Only when missing: `create schema if not exists` needs CREATE on the
    // database even when the schema is there, which a role that runs the
    // pump (watchpump_pump) does not have.
    let exists: bool = sqlx::query_scalar(&format!(
        "select to_regclass('{schema}.schema_migrations') is not null"
    ))
    .fetch_one(&mut *conn)
    .await?;
    if !exists {
        create_bookkeeping(conn, schema).await?;
    }
    let mut applied = Vec::new();
    let mut outcome = Ok(());
    for file in files {
        match apply_one(conn, schema, file).await {
            Ok(true) => applied.push(file.name.to_string()),
            Ok(false) => {}
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    // Reset even after a failure: the connection goes back to the pool.
    sqlx::raw_sql("reset client_min_messages")
        .execute(&mut *conn)
        .await?;
    outcome.map(|()| applied)
}

async fn create_bookkeeping(conn: &mut PgConnection, schema: &str) -> sqlx::Result<()> {
    sqlx::raw_sql(&format!(
        "create schema if not exists {schema};
         create table if not exists {schema}.schema_migrations (
             name        text primary key,
             checksum    bytea not null,
             applied_at  timestamptz not null default now()
         );"
    ))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Applies one file in its own transaction, unless it was applied before
/// (with the same text, for a re-appliable file).
async fn apply_one(conn: &mut PgConnection, schema: &str, file: &SqlFile) -> sqlx::Result<bool> {
    let checksum = Sha256::digest(file.sql.as_bytes()).to_vec();
    let previous: Option<Vec<u8>> = sqlx::query_scalar(&format!(
        "select checksum from {schema}.schema_migrations where name = $1"
    ))
    .bind(file.name)
    .fetch_optional(&mut *conn)
    .await?;
    match previous {
        Some(_) if !file.reapply_on_change => return Ok(false),
        Some(ref old) if *old == checksum => return Ok(false),
        _ => {}
    }
    let mut tx = conn.begin().await?;
    sqlx::raw_sql(file.sql).execute(&mut *tx).await?;
    sqlx::query(&format!(
        "insert into {schema}.schema_migrations (name, checksum) values ($1, $2)
         on conflict (name) do update set checksum = excluded.checksum, applied_at = now()"
    ))
    .bind(file.name)
    .bind(&checksum)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}
