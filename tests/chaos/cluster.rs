//! The chaos suite's own project-local PostgreSQL (`target/pg-chaos`), started
//! and restarted through `scripts/dev-postgres.sh`, fsync on: a restart must
//! not lose what producers were told was committed.

use std::process::Command;

const NAME: &str = "pg-chaos";

#[derive(Debug, Clone)]
pub struct Cluster {
    admin_url: String,
}

fn script() -> Command {
    Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/dev-postgres.sh"
    ))
}

impl Cluster {
    /// Starts the cluster unless it runs already.
    pub fn start() -> Cluster {
        // Unset (cargo test alone): the port remembered for this checkout.
        let port = std::env::var("WATCHPUMP_CHAOS_PG_PORT").unwrap_or_else(|_| "auto".into());
        let out = script()
            .args(["start", NAME, &port, "on"])
            .output()
            .expect("run scripts/dev-postgres.sh");
        assert!(
            out.status.success(),
            "cannot start the chaos cluster: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let admin_url = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .expect("the script prints the URL last")
            .trim()
            .to_string();
        Cluster { admin_url }
    }

    /// A cluster already running at `admin_url` (the failover pair's front).
    pub fn at(admin_url: &str) -> Cluster {
        Cluster {
            admin_url: admin_url.to_string(),
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        let after = self.admin_url.rsplit_once(':').unwrap().1;
        after.split('/').next().unwrap().parse().unwrap()
    }

    /// A fast restart: every connection is cut, the server comes back.
    pub fn restart(&self) {
        let out = script()
            .args(["restart", NAME])
            .output()
            .expect("run scripts/dev-postgres.sh");
        assert!(
            out.status.success(),
            "cannot restart the chaos cluster: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub async fn drop_database(&self, name: &str) {
        let admin = watchpump::server::connect(&self.admin_url, 1)
            .await
            .expect("connect to the chaos cluster");
        let _ = sqlx::query(&format!("drop database if exists {name} with (force)"))
            .execute(&admin)
            .await;
        admin.close().await;
    }

    /// Drops and creates database `name`; returns its URL.
    pub async fn fresh_database(&self, name: &str) -> String {
        let admin = watchpump::server::connect(&self.admin_url, 1)
            .await
            .expect("connect to the chaos cluster");
        sqlx::query(&format!("drop database if exists {name} with (force)"))
            .execute(&admin)
            .await
            .unwrap();
        sqlx::query(&format!("create database {name}"))
            .execute(&admin)
            .await
            .unwrap();
        admin.close().await;
        format!("{}/{name}", self.admin_url.rsplit_once('/').unwrap().0)
    }
}
