//! The inbox's schema in the consumer's own database: `sql/kit/`, applied
//! by [`migrate`] with its own bookkeeping table
//! (`watchpump_inbox.schema_migrations`), so it clashes neither with the
//! consumer's migrations (sqlx's `_sqlx_migrations` or any other tool) nor
//! with a producer's `watchpump` schema in the same cluster.

use sqlx::PgPool;

use crate::kit::error::Result;
use crate::sql_files::{self, SqlFile};

/// `sql/kit/migrations/*.sql`, applied once each, then
/// `sql/kit/functions/*.sql`, re-applied when their text changes; listed by
/// `build.rs`, embedded at build time.
const FILES: &[SqlFile] = include!(concat!(env!("OUT_DIR"), "/kit_sql_files.rs"));

/// Brings the `watchpump_inbox` schema up to date; returns the files it
/// applied. Safe to run from several processes at once (they take turns on
/// an advisory lock) and on every start.
pub async fn migrate(pool: &PgPool) -> Result<Vec<String>> {
    Ok(sql_files::apply(pool, "watchpump_inbox", FILES).await?)
}
