//! Embedded SQL files applied to a schema of their own, with bookkeeping of
//! their own (`<schema>.schema_migrations`) rather than sqlx's
//! `_sqlx_migrations`, which the service's own migrations may already use in
//! the same database. The producer's `watchpump` schema ([`crate::schema`])
//! and the kit's `watchpump_inbox` ([`crate::kit::schema`]) are both applied
//! here.

use sha2::{Digest, Sha256};
use sqlx::{Connection, PgConnection, PgPool};

use crate::db::schema as db;

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
    db::lock_migrations(&mut conn, schema).await?;
    let applied = apply_all(&mut conn, schema, files).await;
    db::unlock_migrations(&mut conn, schema).await?;
    applied
}

async fn apply_all(
    conn: &mut PgConnection,
    schema: &str,
    files: &[SqlFile],
) -> sqlx::Result<Vec<String>> {
    // Quietly: `if not exists` raises notices on every start.
    db::set_quiet(conn, true).await?;
    // Only when missing: `create schema if not exists` needs CREATE on the
    // database even when the schema is there, which a role that runs the
    // pump (watchpump_pump) does not have.
    if !db::has_bookkeeping(conn, schema).await? {
        db::create_bookkeeping(conn, schema).await?;
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
    db::set_quiet(conn, false).await?;
    outcome.map(|()| applied)
}

/// Applies one file in its own transaction, unless it was applied before
/// (with the same text, for a re-appliable file).
async fn apply_one(conn: &mut PgConnection, schema: &str, file: &SqlFile) -> sqlx::Result<bool> {
    let checksum = Sha256::digest(file.sql.as_bytes()).to_vec();
    let previous = db::applied_checksum(conn, schema, file.name).await?;
    match previous {
        Some(_) if !file.reapply_on_change => return Ok(false),
        Some(ref old) if *old == checksum => return Ok(false),
        _ => {}
    }
    let mut tx = conn.begin().await?;
    db::run_file(&mut tx, file.sql).await?;
    db::record_applied(&mut tx, schema, file.name, &checksum).await?;
    tx.commit().await?;
    Ok(true)
}
