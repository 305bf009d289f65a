//! Shared test parts, one file a concept:
//!
//! - [`db`]: a fresh database per test on the real PostgreSQL that
//!   `make test` starts, and what tests read from it and stage in it;
//! - [`pump`]: the pump running in-process with quick test settings;
//! - [`consumer`]: a real HTTP consumer on loopback that records what it
//!   receives;
//! - [`servers`]: servers on loopback: any router, and the API with the
//!   panel and the admin API as `watchpump serve` serves them;
//! - [`process`]: the `watchpump` binary as a child process;
//! - [`ports`]: free loopback ports;
//! - [`wait`]: polling until a condition holds;
//! - [`prometheus`]: the Prometheus text format, and a real Prometheus
//!   (and promtool) from target/tools.
//!
//! Every test binary compiles all of it and uses a part, hence
//! `allow(dead_code)`.
#![allow(dead_code)]

pub mod consumer;
pub mod db;
pub mod ports;
pub mod process;
pub mod prometheus;
pub mod pump;
pub mod servers;
pub mod wait;

// What `use common::*` brings; a binary that uses none of a module's items
// would otherwise warn of an unused import.
#[allow(unused_imports)]
pub use self::{consumer::*, db::*, ports::*, process::*, pump::*, servers::*, wait::*};

/// The producer the tests' pumps and consumers speak for.
pub const PRODUCER: &str = "git";
pub const PRODUCER_TOKEN: &str = "producer-secret-token";
/// The operator's token for the admin API and the panel.
pub const ADMIN_TOKEN: &str = "admin-token-for-the-tests";
/// The key signing secrets are sealed with in the tests
/// (`WATCHPUMP_SECRET_KEY`): fixed, so that a child process opens what the
/// test process sealed. Set by [`use_test_secret_key`].
pub const TEST_SECRET_KEY: &str = "dGVzdHMtb25seTogd2F0Y2hwdW1wIHNlY3JldCBrZXk=";

/// Puts [`TEST_SECRET_KEY`] into this process's environment, once, before
/// the first database is made (every test starts with one): the library
/// reads the key from there, as `serve` does, and child processes inherit it.
pub fn use_test_secret_key() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::env::set_var("WATCHPUMP_SECRET_KEY", TEST_SECRET_KEY));
}
