//! The database schema: numbered migrations in `sql/migrations/`, applied
//! once each, and the functions in `sql/functions/`, re-applied whenever
//! their text changes. Both are embedded in the binary.
//!
//! watchpump keeps its own bookkeeping (`watchpump.schema_migrations`) rather
//! than sqlx's `_sqlx_migrations`, which the producer's own migrations
//! already use in the same database.

use sha2::{Digest, Sha256};
use sqlx::{Connection, PgConnection, PgPool};

use crate::error::Result;

/// One SQL file, embedded at build time.
struct SqlFile {
    name: &'static str,
    sql: &'static str,
}

macro_rules! sql_file {
    ($dir:literal, $name:literal) => {
        SqlFile {
            name: $name,
            sql: include_str!(concat!("../sql/", $dir, "/", $name, ".sql")),
        }
    };
}

/// Applied in order, once each. Never edit one that has shipped: add a file.
const MIGRATIONS: &[SqlFile] = &[
    sql_file!("migrations", "0001_core"),
    sql_file!("migrations", "0002_operator"),
    sql_file!("migrations", "0003_service_lifecycle"),
    sql_file!("migrations", "0004_storage_v2"),
];

/// `create or replace` definitions, re-applied when their text changes.
const FUNCTIONS: &[SqlFile] = &[
    sql_file!("functions", "0050_registry"),
    sql_file!("functions", "0100_emit"),
    sql_file!("functions", "0200_pump"),
    sql_file!("functions", "0300_operator"),
    sql_file!("functions", "0400_metrics"),
];

const BOOKKEEPING: &str = "
    create schema if not exists watchpump;
    create table if not exists watchpump.schema_migrations (
        name        text primary key,
        checksum    bytea not null,
        applied_at  timestamptz not null default now()
    );";

/// Brings the `watchpump` schema up to date. Safe to run from several
/// processes at once: they take turns on an advisory lock.
pub async fn migrate(pool: &PgPool) -> Result<Vec<String>> {
    let mut conn = pool.acquire().await?;
    sqlx::query("select pg_advisory_lock(hashtext('watchpump.migrate'))")
        .execute(&mut *conn)
        .await?;
    let applied = apply_all(&mut conn).await;
    sqlx::query("select pg_advisory_unlock(hashtext('watchpump.migrate'))")
        .execute(&mut *conn)
        .await?;
    let applied = applied?;
    // Data that needs Rust: signing secrets for services registered before
    // signing existed (0003_service_lifecycle.sql).
    let given = crate::services::ensure_signing_secrets(pool).await?;
    if !given.is_empty() {
        tracing::info!(services = ?given, "gave services their signing secret; `watchpump services rotate-secret NAME` shows a new one to hand to each team");
    }
    Ok(applied)
}

async fn apply_all(conn: &mut PgConnection) -> Result<Vec<String>> {
    sqlx::raw_sql(BOOKKEEPING).execute(&mut *conn).await?;
    let mut applied = Vec::new();
    for file in MIGRATIONS {
        if apply(conn, file, false).await? {
            applied.push(file.name.to_string());
        }
    }
    for file in FUNCTIONS {
        if apply(conn, file, true).await? {
            applied.push(file.name.to_string());
        }
    }
    Ok(applied)
}

/// Applies one file in its own transaction unless it was applied before
/// (for re-appliable files: unless it was applied with the same text).
async fn apply(conn: &mut PgConnection, file: &SqlFile, reapply_on_change: bool) -> Result<bool> {
    let checksum = Sha256::digest(file.sql.as_bytes()).to_vec();
    let previous: Option<Vec<u8>> =
        sqlx::query_scalar("select checksum from watchpump.schema_migrations where name = $1")
            .bind(file.name)
            .fetch_optional(&mut *conn)
            .await?;
    match previous {
        Some(_) if !reapply_on_change => return Ok(false),
        Some(ref old) if *old == checksum => return Ok(false),
        _ => {}
    }
    let mut tx = conn.begin().await?;
    sqlx::raw_sql(file.sql).execute(&mut *tx).await?;
    sqlx::query(
        "insert into watchpump.schema_migrations (name, checksum) values ($1, $2)
         on conflict (name) do update set checksum = excluded.checksum, applied_at = now()",
    )
    .bind(file.name)
    .bind(&checksum)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}
