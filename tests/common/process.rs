//! The `watchpump` binary as a child process.

use std::process::{Command, Stdio};

/// The destinations the tests' pumps and CLI accept: loopback, where
/// every test consumer listens.
pub const LOOPBACK: &str = "127.0.0.0/8,::1";

/// The binary cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_watchpump");

/// The binary with a clean environment: no DATABASE_URL or WATCHPUMP_*
/// from the outside, quiet logs unless asked, stdin closed; DATABASE_URL
/// set to `database_url` when given; the tests' secret key.
pub fn watchpump_cli(database_url: Option<&str>) -> Command {
    let mut cmd = Command::new(BIN);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().to_string();
        if key == "DATABASE_URL" || key.starts_with("WATCHPUMP_") || key == "RUST_LOG" {
            cmd.env_remove(key);
        }
    }
    if let Some(url) = database_url {
        cmd.env("DATABASE_URL", url);
    }
    cmd.env("WATCHPUMP_SECRET_KEY", super::TEST_SECRET_KEY);
    // The tests' consumers listen on loopback, which production refuses by
    // default (src/destinations.rs); a test may set another list.
    cmd.env("WATCHPUMP_ALLOWED_DESTINATIONS", LOOPBACK);
    // A consumer's whole concurrency from the first request (production
    // starts at one and widens it answer by answer): tests that hold a
    // consumer count what is in flight.
    cmd.env("WATCHPUMP_INITIAL_CONCURRENCY", "64");
    cmd.stdin(Stdio::null());
    cmd
}

/// A child process killed when this is dropped, so that a failing test
/// leaves no pump running behind it.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
