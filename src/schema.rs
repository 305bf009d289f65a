//! The database schema: numbered migrations in `sql/migrations/`, applied
//! once each, and the functions in `sql/functions/`, re-applied whenever
//! their text changes. Both are embedded in the binary.
//!
//! watchpump keeps its own bookkeeping (`watchpump.schema_migrations`) rather
//! than sqlx's `_sqlx_migrations`, which the producer's own migrations
//! already use in the same database ([`crate::sql_files`] applies them).

use sqlx::PgPool;

use crate::error::{Error, Result};
use crate::sql_files::{self, SqlFile};

macro_rules! sql_file {
    ($dir:literal, $name:literal, $reapply:literal) => {
        SqlFile {
            name: $name,
            sql: include_str!(concat!("../sql/", $dir, "/", $name, ".sql")),
            reapply_on_change: $reapply,
        }
    };
}

/// In order: the migrations, applied once each (never edit one that has
/// shipped: add a file); then the `create or replace` definitions,
/// re-applied when their text changes.
const FILES: &[SqlFile] = &[
    sql_file!("migrations", "0001_core", false),
    sql_file!("migrations", "0002_operator", false),
    sql_file!("migrations", "0003_service_lifecycle", false),
    sql_file!("migrations", "0004_storage_v2", false),
    sql_file!("migrations", "0005_bounds", false),
    sql_file!("migrations", "0006_encrypted_secrets", false),
    sql_file!("migrations", "0007_kinds", false),
    sql_file!("migrations", "0008_storage_v3", false),
    sql_file!("migrations", "0009_trace_context", false),
    sql_file!("migrations", "0010_consumer", false),
    sql_file!("migrations", "0012_resync", false),
    sql_file!("migrations", "0013_history_indexes", false),
    sql_file!("migrations", "0014_kept_partitions", false),
    sql_file!("migrations", "0015_settle_held", false),
    sql_file!("migrations", "0016_window_index", false),
    sql_file!("migrations", "0017_staged_failures", false),
    sql_file!("migrations", "0018_service_pause_lock", false),
    sql_file!("migrations", "0019_make_partition_table", false),
    sql_file!("migrations", "0020_delivery_engine_v4", false),
    sql_file!("migrations", "0021_owner_code", false),
    sql_file!("migrations", "0022_consumer_shares", false),
    sql_file!("migrations", "0023_timeline_floors", false),
    sql_file!("functions", "0050_registry", true),
    sql_file!("functions", "0100_emit", true),
    sql_file!("functions", "0150_kinds", true),
    sql_file!("functions", "0200_pump", true),
    sql_file!("functions", "0300_operator", true),
    sql_file!("functions", "0400_metrics", true),
    sql_file!("functions", "0500_consumer", true),
];

/// Brings the `watchpump` schema up to date. Safe to run from several
/// processes at once: they take turns on an advisory lock.
pub async fn migrate(pool: &PgPool) -> Result<Vec<String>> {
    let applied = sql_files::apply(pool, "watchpump", FILES).await?;
    add_partitions_ahead(pool).await?;
    // Data that needs Rust: signing secrets for services registered before
    // signing existed (0003_service_lifecycle.sql), sealed with the key
    // (0006_encrypted_secrets.sql).
    apply_roles(pool).await?;
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
    let owner: bool = sqlx::query_scalar(
        "select pg_has_role(nspowner, 'USAGE') from pg_namespace where nspname = 'watchpump'",
    )
    .fetch_one(&mut *tx)
    .await?;
    if owner {
        sqlx::query("select pg_advisory_xact_lock(hashtext('watchpump.migrate'))")
            .execute(&mut *tx)
            .await?;
        sqlx::query("select watchpump.add_partitions_ahead()")
            .execute(&mut *tx)
            .await?;
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

/// Applies `sql/roles.sql` on every run, not once: the functions it makes
/// SECURITY DEFINER may have just been replaced, and a run that lacked
/// CREATEROLE left the roles to a later one. Only the schema's owner (or a
/// superuser) can grant on its objects; a `serve` running as a role granted
/// `watchpump_pump` skips this. The advisory lock is `sql_files::apply`'s:
/// two migrates granting at once would fail with "tuple concurrently
/// updated".
async fn apply_roles(pool: &PgPool) -> Result<()> {
    let mut tx = pool.begin().await?;
    let owner: bool = sqlx::query_scalar(
        "select pg_has_role(nspowner, 'USAGE') from pg_namespace where nspname = 'watchpump'",
    )
    .fetch_one(&mut *tx)
    .await?;
    if !owner {
        return Ok(());
    }
    sqlx::query("select pg_advisory_xact_lock(hashtext('watchpump.migrate'))")
        .execute(&mut *tx)
        .await?;
    sqlx::raw_sql("set local client_min_messages = error")
        .execute(&mut *tx)
        .await?;
    sqlx::raw_sql(include_str!("../sql/roles.sql"))
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
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
    Ok(sqlx::query_scalar(
        "select r from unnest($1::text[]) r where not exists (select from pg_roles where rolname = r)",
    )
    .bind(ROLES)
    .fetch_all(pool)
    .await?)
}

/// Refuses a database without the `watchpump` schema, saying what to run:
/// the CLI's commands other than `migrate` must not create it as a side
/// effect in a database the user may have named by mistake.
pub async fn require(pool: &PgPool) -> Result<()> {
    let present: bool =
        sqlx::query_scalar("select to_regclass('watchpump.schema_migrations') is not null")
            .fetch_one(pool)
            .await?;
    if present {
        Ok(())
    } else {
        Err(Error::NotFound(
            "this database has no watchpump schema: run `watchpump migrate` first \
             (`watchpump serve` and `make run` do it too)"
                .into(),
        ))
    }
}
