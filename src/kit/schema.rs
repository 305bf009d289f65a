//! The inbox's schema in the consumer's own database: `sql/kit/`, applied
//! by [`migrate`] with its own bookkeeping table
//! (`watchpump_inbox.schema_migrations`), so it clashes neither with the
//! consumer's migrations (sqlx's `_sqlx_migrations` or any other tool) nor
//! with a producer's `watchpump` schema in the same cluster.

use sha2::{Digest, Sha256};
use sqlx::{Connection, PgConnection, PgPool};

use crate::kit::error::Result;

/// One SQL file, embedded at build time.
struct SqlFile {
    name: &'static str,
    sql: &'static str,
    /// `create or replace` files are applied again when their text changes;
    /// the others once.
    reapply_on_change: bool,
}

const FILES: &[SqlFile] = &[
    SqlFile {
        name: "0001_inbox",
        sql: include_str!("../../sql/kit/0001_inbox.sql"),
        reapply_on_change: false,
    },
    SqlFile {
        name: "0100_inbox_functions",
        sql: include_str!("../../sql/kit/0100_inbox_functions.sql"),
        reapply_on_change: true,
    },
];

const BOOKKEEPING: &str = "
    create schema if not exists watchpump_inbox;
    create table if not exists watchpump_inbox.schema_migrations (
        name        text primary key,
        checksum    bytea not null,
        applied_at  timestamptz not null default now()
    );";

/// Brings the `watchpump_inbox` schema up to date; returns the files it
/// applied. Safe to run from several processes at once (they take turns on
/// an advisory lock) and on every start.
pub async fn migrate(pool: &PgPool) -> Result<Vec<String>> {
    let mut conn = pool.acquire().await?;
    sqlx::query("select pg_advisory_lock(hashtext('watchpump_inbox.migrate'))")
        .execute(&mut *conn)
        .await?;
    let applied = apply_all(&mut conn).await;
    sqlx::query("select pg_advisory_unlock(hashtext('watchpump_inbox.migrate'))")
        .execute(&mut *conn)
        .await?;
    applied
}

async fn apply_all(conn: &mut PgConnection) -> Result<Vec<String>> {
    // Quietly: `if not exists` raises notices on every start.
    sqlx::raw_sql("set client_min_messages = warning")
        .execute(&mut *conn)
        .await?;
    sqlx::raw_sql(BOOKKEEPING).execute(&mut *conn).await?;
    let mut applied = Vec::new();
    for file in FILES {
        if apply(conn, file).await? {
            applied.push(file.name.to_string());
        }
    }
    sqlx::raw_sql("reset client_min_messages")
        .execute(&mut *conn)
        .await?;
    Ok(applied)
}

/// Applies one file in its own transaction, unless it was applied before
/// (with the same text, for a re-appliable file).
async fn apply(conn: &mut PgConnection, file: &SqlFile) -> Result<bool> {
    let checksum = Sha256::digest(file.sql.as_bytes()).to_vec();
    let previous: Option<Vec<u8>> = sqlx::query_scalar(
        "select checksum from watchpump_inbox.schema_migrations where name = $1",
    )
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
    sqlx::query(
        "insert into watchpump_inbox.schema_migrations (name, checksum) values ($1, $2)
         on conflict (name) do update set checksum = excluded.checksum, applied_at = now()",
    )
    .bind(file.name)
    .bind(&checksum)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}
