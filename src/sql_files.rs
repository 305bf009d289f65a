//! Embedded SQL files applied to a schema of their own, with bookkeeping of
//! their own (`<schema>.schema_migrations`) rather than sqlx's
//! `_sqlx_migrations`, which the service's own migrations may already use in
//! the same database. The producer's `watchpump` schema ([`crate::schema`])
//! and the kit's `watchpump_inbox` ([`crate::kit::schema`]) are both applied
//! here.

use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool, Postgres, Transaction};

use crate::db::schema as db;

/// One SQL file, embedded at build time.
pub struct SqlFile {
    pub name: &'static str,
    pub sql: &'static str,
    /// `create or replace` files are applied again when their text changes;
    /// the others (migrations) once.
    pub reapply_on_change: bool,
}

/// Brings `schema` up to date with `files`, in order, in one transaction
/// ([`begin`], [`apply_pending`]); returns the names of the files it
/// applied. Safe to run from several processes at once (they take turns on
/// an advisory lock) and on every start.
pub async fn apply(
    pool: &PgPool,
    schema: &'static str,
    files: &[SqlFile],
) -> sqlx::Result<Vec<String>> {
    let mut tx = begin(pool, schema).await?;
    let applied = apply_pending(&mut tx, schema, files).await?;
    tx.commit().await?;
    Ok(applied)
}

/// A run's transaction: `schema`'s migration lock held until it ends, its
/// notices quiet, its bookkeeping made if missing.
///
/// Every pending file of a run is applied in this one transaction, so that
/// nothing sees a run half done: a function that a migration drops and a
/// later file creates again (with other arguments) stays callable all
/// through (with a transaction per file it was missing until the later
/// file ran, and for good had the run stopped in between); a run that fails
/// anywhere leaves the schema as it found it, and the next applies it all.
/// The price is that the run's locks are held until its end, as Flyway's
/// `group` does. What must be seen with the files goes in the same
/// transaction (the producer's grants, which a function made again needs
/// again: `crate::schema::migrate`).
pub async fn begin(pool: &PgPool, schema: &str) -> sqlx::Result<Transaction<'static, Postgres>> {
    let mut tx = pool.begin().await?;
    db::lock_migrations_xact(&mut tx, schema).await?;
    // Quietly: `if not exists` raises notices on every start.
    db::quiet_until_commit(&mut tx).await?;
    // Only when missing: `create schema if not exists` needs CREATE on the
    // database even when the schema is there, which a role that runs the
    // pump (watchpump_pump) does not have.
    if !db::has_bookkeeping(&mut tx, schema).await? {
        db::create_bookkeeping(&mut tx, schema).await?;
    }
    Ok(tx)
}

/// Applies the files of `files` not applied before (or, for a re-appliable
/// file, whose text changed), in order, in the run's transaction
/// ([`begin`]); returns their names.
pub async fn apply_pending(
    conn: &mut PgConnection,
    schema: &str,
    files: &[SqlFile],
) -> sqlx::Result<Vec<String>> {
    let mut applied = Vec::new();
    for file in files {
        if apply_one(conn, schema, file).await? {
            applied.push(file.name.to_string());
        }
    }
    Ok(applied)
}

/// Applies one file in the run's transaction, unless it was applied before
/// (with the same text, for a re-appliable file).
async fn apply_one(conn: &mut PgConnection, schema: &str, file: &SqlFile) -> sqlx::Result<bool> {
    let checksum = Sha256::digest(file.sql.as_bytes()).to_vec();
    let previous = db::applied_checksum(conn, schema, file.name).await?;
    match previous {
        Some(_) if !file.reapply_on_change => return Ok(false),
        Some(ref old) if *old == checksum => return Ok(false),
        _ => {}
    }
    db::run_file(conn, file.sql).await?;
    db::record_applied(conn, schema, file.name, &checksum).await?;
    Ok(true)
}
