//! The registry's statements (`sql/functions/0400_registry.sql` and the
//! tables it keeps: `services`, `watches`, `fanout_budgets`): services and
//! their credentials, watches, and what the fan-out budget and the filter
//! cap read. The rules around them live in [`crate::services`] and
//! [`crate::watches`].
//!
//! One file per concept, each re-exported here so that callers name
//! `db::registry::*` whichever holds a statement: `registry/services.rs`
//! (a service's row, its tokens and signing secrets), `registry/watches.rs`
//! (a watch's row, and the audit of stored filters) and
//! `registry/fanout.rs` (what the bounds on a new watch read, and the
//! fan-out budgets the operator sets).

mod fanout;
mod services;
mod watches;

pub use fanout::*;
pub use services::*;
pub use watches::*;
