//! The one seam between Rust and SQL: every statement the code sends is a
//! named `async fn` here, in the file of the SQL room it calls
//! (`sql/functions/NNNN_room.sql`), so that a reader finds a function's
//! callers by its room and a DBA finds every statement that touches a
//! table in one directory.
//!
//! The statements are sqlx's compile-checked macros (`query!`,
//! `query_as!`, `query_scalar!`): a build checks each one's text, its
//! parameters' types and its columns' types against `.sqlx/`, a checked-in
//! description made from `sql/` by `scripts/sqlx-prepare.sh` (`make lint`
//! fails when it is stale). Builds need no database (`SQLX_OFFLINE`,
//! `.cargo/config.toml`).
//!
//! Each function returns `sqlx::Result`: this layer's one error type; the
//! callers' layers turn it into theirs. Rows that cross the seam are plain
//! structs declared next to the statement that fills them.
//!
//! `tests/db_seam.rs` fails when a file outside `src/db/` names a sqlx
//! query function. The only statements not checked at build time are in
//! [`schema`], which applies the SQL files themselves, to a schema named
//! at run time (the producer's `watchpump` or the kit's
//! `watchpump_inbox`), and in [`connection`], whose pooler probe must use
//! the simple query protocol (a prepared statement would itself fail
//! behind the pooler it looks for).

with_feature! { "kit":
    pub mod inbox;
    pub mod schema;
}

with_feature! { "producer":
    pub mod connection;
    pub mod consumer;
    pub mod delivery;
    pub mod emit;
    pub mod history;
    pub mod kinds;
    pub mod operator;
    pub mod panel;
    pub mod pause;
    pub mod rate;
    pub mod registry;
}
