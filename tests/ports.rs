//! The project-local clusters' ports (`scripts/dev-postgres.sh`, which the
//! Makefile's test, bench and chaos targets use): a free port chosen once
//! per checkout and remembered in its target/, a port in use named with the
//! setting that moves it, and `stop` quiet when nothing runs. Each test
//! runs the script from a checkout of its own in a temporary directory.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Output};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/dev-postgres.sh");

/// A directory with `scripts/dev-postgres.sh` in it: the script finds
/// target/ from its own place, as in a clone.
struct Checkout(PathBuf);

impl Checkout {
    fn new() -> Checkout {
        let root = std::env::temp_dir().join(format!("wp-ports-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(root.join("scripts")).unwrap();
        std::fs::copy(SCRIPT, root.join("scripts/dev-postgres.sh")).unwrap();
        Checkout(root)
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(self.0.join("scripts/dev-postgres.sh"))
            .args(args)
            .output()
            .expect("run dev-postgres.sh")
    }

    fn port(&self, cluster: &str) -> u16 {
        let out = self.run(&["port", cluster]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).trim().parse().expect("a port number")
    }

    fn remembered(&self, cluster: &str) -> Option<String> {
        std::fs::read_to_string(self.target().join(format!("{cluster}.port"))).ok()
    }

    fn target(&self) -> PathBuf {
        self.0.join("target")
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn each_checkout_chooses_a_free_port_once_and_remembers_it_in_target() {
    let one = Checkout::new();
    let two = Checkout::new();
    let port = one.port("pg-test");
    assert!((20000..=32767).contains(&port), "{port}");
    assert_eq!(
        one.remembered("pg-test").as_deref().map(str::trim),
        Some(port.to_string().as_str()),
        "remembered in target/pg-test.port"
    );
    TcpListener::bind(("127.0.0.1", port)).expect("the port chosen was free");
    // The same port every time after, whatever else changes.
    for _ in 0..3 {
        assert_eq!(one.port("pg-test"), port);
    }
    // Each cluster and each checkout has its own, decided by neither the
    // path nor the other's choice.
    let bench = one.port("pg-bench");
    assert!(one.remembered("pg-bench").is_some());
    let other = two.port("pg-test");
    assert!(two.remembered("pg-test").is_some());
    assert!((20000..=32767).contains(&bench) && (20000..=32767).contains(&other));
}

#[test]
fn a_port_in_use_is_refused_naming_the_setting_that_moves_it() {
    let checkout = Checkout::new();
    let port = checkout.port("pg-test");
    let _taken = TcpListener::bind(("127.0.0.1", port)).expect("take the chosen port");
    let out = checkout.run(&["start", "pg-test", "auto", "off"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains(&format!("port {port}")), "{err}");
    assert!(err.contains("PG_TEST_PORT=<port>"), "{err}");
    assert!(err.contains("delete target/pg-test.port"), "{err}");
    assert!(
        !checkout.target().join("pg-test/PG_VERSION").exists(),
        "nothing set up"
    );
}

#[test]
fn stop_is_quiet_when_nothing_runs() {
    let checkout = Checkout::new();
    for cluster in ["pg", "pg-test", "pg-bench", "pg-chaos"] {
        let out = checkout.run(&["stop", cluster]);
        assert!(out.status.success(), "{cluster}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "", "{cluster}");
        assert_eq!(text(&out.stderr), "", "{cluster}");
    }
}
