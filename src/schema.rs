//! The database schema: numbered migrations in `sql/migrations/`, applied
//! once each, and the functions in `sql/functions/`, re-applied whenever
//! their text changes. Both are embedded in the binary, in name order
//! (`build.rs` lists them: a new migration is a new file, nothing else).
//! Each file of functions is a room on a floor and calls only the floors
//! below it (the map: the top of `sql/functions/0000_vocabulary.sql`;
//! `tests/sql_floors.rs` checks it).
//!
//! Renaming or re-cutting the files of functions is safe for a database
//! made by an older version: the bookkeeping knows a file by its name, a
//! name no longer listed is never read again (its row stays, unused), and
//! the new files' `create or replace` definitions replace the functions
//! and views they define, wherever they were defined before. A function
//! that goes, or changes its arguments, leaves the old one behind: a
//! migration drops it (`0015_settle_held.sql` did for `settle()`), and as
//! a run applies everything pending in one transaction ([`migrate`]), no
//! caller ever meets it dropped and not yet made again.
//!
//! watchpump keeps its own bookkeeping (`watchpump.schema_migrations`) rather
//! than sqlx's `_sqlx_migrations`, which the producer's own migrations
//! already use in the same database ([`crate::sql_files`] applies them).

use sqlx::PgPool;

use crate::db::schema as db;
use crate::error::{Error, Result};
use crate::sql_files::{self, SqlFile};

/// In order: the migrations (`sql/migrations/*.sql`), applied once each
/// (never edit one that has shipped: add a file); then the rooms of
/// `sql/functions/*.sql`, `create or replace` definitions re-applied when
/// their text changes; each directory in name order. `build.rs` lists the
/// directories, so a new file needs no line here; the text is embedded at
/// build time.
const FILES: &[SqlFile] = include!(concat!(env!("OUT_DIR"), "/watchpump_sql_files.rs"));

/// Brings the `watchpump` schema up to date. Safe to run from several
/// processes at once: they take turns on an advisory lock. The pending
/// files and the grants of `sql/roles.sql` are applied in one transaction
/// ([`sql_files::begin`]): a pump never meets a function half
/// replaced, nor one it may not call yet.
pub async fn migrate(pool: &PgPool) -> Result<Vec<String>> {
    let mut tx = sql_files::begin(pool, "watchpump").await?;
    let owner = db::owns_watchpump_schema(&mut tx).await?;
    if owner {
        // roles.sql's lock, before any table a file locks: a pump's
        // prune() takes it before the tables it works on.
        db::lock_history_if_made(&mut tx).await?;
    }
    let applied = sql_files::apply_pending(&mut tx, "watchpump", FILES).await?;
    if owner {
        db::apply_roles(&mut tx).await?;
    }
    tx.commit().await?;
    if owner {
        warn_of_missing_roles(pool).await?;
    }
    add_partitions_ahead(pool).await?;
    // Data that needs Rust: signing secrets for services registered before
    // signing existed (0003_service_lifecycle.sql), sealed with the key
    // (0006_encrypted_secrets.sql).
    let sealed = crate::services::seal_signing_secrets(pool).await?;
    if !sealed.given.is_empty() {
        tracing::info!(services = ?sealed.given, "gave services their signing secret; `watchpump services rotate-secret NAME` shows a new one to hand to each team");
    }
    if sealed.sealed > 0 {
        tracing::info!(
            secrets = sealed.sealed,
            "encrypted signing secrets with the current WATCHPUMP_SECRET_KEY"
        );
    }
    Ok(applied)
}

/// Today's partitions of the history and the next days'
/// (`watchpump.add_partitions_ahead()`), so that a new database starts
/// with them rather than in the DEFAULT partitions until the first prune.
/// Only the schema's owner may create them; a pump's `prune()` does later.
async fn add_partitions_ahead(pool: &PgPool) -> Result<()> {
    let mut tx = pool.begin().await?;
    if db::owns_watchpump_schema(&mut tx).await? {
        db::lock_migrations_xact(&mut tx, "watchpump").await?;
        crate::db::history::add_partitions_ahead(&mut tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// The group roles of `sql/roles.sql`.
pub const ROLES: [&str; 4] = [
    "watchpump_inspector",
    "watchpump_operator",
    "watchpump_emitter",
    "watchpump_pump",
];

/// Says which roles of `sql/roles.sql` it could not grant to. The file is
/// applied on every run, not once (in [`migrate`]'s transaction): the
/// functions it makes SECURITY DEFINER may have just been replaced, and a
/// run that lacked CREATEROLE left the roles to a later one. Only the
/// schema's owner (or a superuser) can grant on its objects; a `serve`
/// running as a role granted `watchpump_pump` skips it.
async fn warn_of_missing_roles(pool: &PgPool) -> Result<()> {
    let missing = missing_roles(pool).await?;
    if !missing.is_empty() {
        tracing::warn!(
            "the roles {} do not exist and this database role may not create them (it lacks CREATEROLE): \
             nothing was granted to them; run `watchpump migrate` once as a role with CREATEROLE, \
             or have a DBA run sql/roles.sql (docs/operator.md, Roles)",
            missing.join(", ")
        );
    }
    Ok(())
}

/// The roles of [`ROLES`] that do not exist in the cluster.
pub async fn missing_roles(pool: &PgPool) -> Result<Vec<String>> {
    Ok(db::missing_roles(pool, &ROLES.map(String::from)).await?)
}

/// Refuses a database without the `watchpump` schema, saying what to run:
/// the CLI's commands other than `migrate` must not create it as a side
/// effect in a database the user may have named by mistake.
pub async fn require(pool: &PgPool) -> Result<()> {
    if crate::db::schema::watchpump_schema_exists(pool).await? {
        Ok(())
    } else {
        Err(Error::NotFound(
            "this database has no watchpump schema: run `watchpump migrate` first \
             (`watchpump serve` and `make run` do it too)"
                .into(),
        ))
    }
}
