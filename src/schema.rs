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
    sql_file!("migrations", "0007_kinds", false),
    sql_file!("functions", "0050_registry", true),
    sql_file!("functions", "0100_emit", true),
    sql_file!("functions", "0150_kinds", true),
    sql_file!("functions", "0200_pump", true),
    sql_file!("functions", "0300_operator", true),
    sql_file!("functions", "0400_metrics", true),
];

/// Brings the `watchpump` schema up to date. Safe to run from several
/// processes at once: they take turns on an advisory lock.
pub async fn migrate(pool: &PgPool) -> Result<Vec<String>> {
    let applied = sql_files::apply(pool, "watchpump", FILES).await?;
    // Data that needs Rust: signing secrets for services registered before
    // signing existed (0003_service_lifecycle.sql).
    let given = crate::services::ensure_signing_secrets(pool).await?;
    if !given.is_empty() {
        tracing::info!(services = ?given, "gave services their signing secret; `watchpump services rotate-secret NAME` shows a new one to hand to each team");
    }
    Ok(applied)
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
