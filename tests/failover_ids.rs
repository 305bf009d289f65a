//! No id or sequence handed out twice after a failover (issue 36), against
//! two real PostgreSQL clusters: a primary, and a standby made from it that
//! misses the primary's last commits (it is stopped before them, as an
//! asynchronous standby that had not received them), then is promoted onto
//! a new timeline. What the new primary emits must not reuse a change id,
//! a delivery id (the consumer's `webhook-id`) or an object's sequence that
//! the lost commits used, for objects it knows and objects it never saw.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;
use serde_json::json;

const BIN: &str = "/usr/lib/postgresql/15/bin";

fn as_postgres(program: &str, args: &[&str]) {
    let out = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(format!("{BIN}/{program}"))
        .args(args)
        .current_dir("/")
        .output()
        .expect("runuser");
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A cluster of the test's own, in `root/data`, stopped (immediately) and
/// removed when dropped.
struct Node {
    root: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl Node {
    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/watchpump", self.port)
    }

    fn start(&self) {
        as_postgres(
            "pg_ctl",
            &[
                "-D",
                self.dir.to_str().unwrap(),
                "-l",
                self.dir.join("log").to_str().unwrap(),
                "-w",
                "-o",
                &format!(
                    "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''",
                    self.port
                ),
                "start",
            ],
        );
    }

    fn stop(&self, mode: &str) {
        as_postgres(
            "pg_ctl",
            &["-D", self.dir.to_str().unwrap(), "-m", mode, "-w", "stop"],
        );
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(format!("{BIN}/pg_ctl"))
            .args(["-D", self.dir.to_str().unwrap(), "-m", "immediate", "stop"])
            .current_dir("/")
            .output();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A node on a free port, its directory made (not its cluster).
fn node(name: &str) -> Node {
    let root = node_dir(name);
    Node {
        dir: root.join("data"),
        root,
        port: free_port(),
    }
}

/// A fresh directory under target/ the postgres user owns.
fn node_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join(format!("failover-ids-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Command::new("chown")
        .args(["postgres", dir.to_str().unwrap()])
        .status()
        .unwrap();
    Command::new("chmod")
        .args(["700", dir.to_str().unwrap()])
        .status()
        .unwrap();
    dir
}

async fn pool(url: &str) -> sqlx::PgPool {
    watchpump::server::connect(url, 4).await.unwrap()
}

async fn emit(pool: &sqlx::PgPool, object: &str) -> (i64, i64, i64) {
    let mut tx = pool.begin().await.unwrap();
    let change = watchpump::emit(&mut tx, object, "push", &json!({}))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    sqlx::query_as(
        "select c.id, c.sequence, q.id from watchpump.changes c
         join watchpump.queue q on q.change_id = c.id where c.id = $1",
    )
    .bind(change)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_promoted_standby_hands_out_no_id_or_sequence_the_lost_primary_used() {
    if !runs_as_root() {
        eprintln!("skipped: the clusters run as the postgres user, which needs root");
        return;
    }
    use_test_secret_key();
    let primary = node("primary");
    let data = primary.dir.clone();
    as_postgres(
        "initdb",
        &[
            "-D",
            data.to_str().unwrap(),
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
        ],
    );
    std::fs::OpenOptions::new()
        .append(true)
        .open(data.join("pg_hba.conf"))
        .map(|mut f| {
            std::io::Write::write_all(&mut f, b"host replication all 127.0.0.1/32 trust\n")
        })
        .unwrap()
        .unwrap();
    primary.start();
    let admin = pool(&primary.url().replace("/watchpump", "/postgres")).await;
    sqlx::query("create database watchpump")
        .execute(&admin)
        .await
        .unwrap();
    let db = pool(&primary.url()).await;
    watchpump::schema::migrate(&db).await.unwrap();
    let svc = watchpump::services::add_within(
        &db,
        "deploy",
        "http://127.0.0.1:9",
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap();
    let new = watchpump::watches::NewWatch {
        resource: "r".into(),
        object: "acme/".into(),
        filters: Default::default(),
        resync: false,
    };
    watchpump::watches::create(&db, svc.service.id, &new)
        .await
        .unwrap();
    for _ in 0..3 {
        emit(&db, "acme/web/main").await;
    }

    // The standby, made now and stopped: it will not see what follows.
    let standby = node("standby");
    as_postgres(
        "pg_basebackup",
        &[
            "-h",
            "127.0.0.1",
            "-p",
            &primary.port.to_string(),
            "-U",
            "postgres",
            "-D",
            standby.dir.to_str().unwrap(),
            "-R",
            "-X",
            "stream",
            "--checkpoint=fast",
        ],
    );
    // The commits the failover loses: the old primary sent them.
    let mut lost = Vec::new();
    for object in ["acme/web/main", "acme/web/main", "acme/api/new"] {
        lost.push(emit(&db, object).await);
    }
    db.close().await;
    admin.close().await;
    primary.stop("immediate");

    standby.start();
    as_postgres(
        "pg_ctl",
        &["-D", standby.dir.to_str().unwrap(), "-w", "promote"],
    );
    let promoted = pool(&standby.url()).await;
    let mut after = Vec::new();
    for object in ["acme/web/main", "acme/api/new", "acme/docs/other"] {
        after.push(emit(&promoted, object).await);
    }
    let timeline: i32 = sqlx::query_scalar("select watchpump.timeline()")
        .fetch_one(&promoted)
        .await
        .unwrap();
    assert_eq!(timeline, 2, "the standby was promoted onto a new timeline");
    let max_lost = |f: fn(&(i64, i64, i64)) -> i64| lost.iter().map(f).max().unwrap();
    for (change, sequence, delivery) in &after {
        assert!(
            *change > max_lost(|l| l.0),
            "change id {change} handed out again"
        );
        assert!(
            *delivery > max_lost(|l| l.2),
            "delivery id (webhook-id) {delivery} handed out again"
        );
        assert!(
            *sequence > max_lost(|l| l.1),
            "sequence {sequence} is not above what the lost primary sent"
        );
    }
    // A ping's delivery, queued by the pump's own code, too.
    let ping: i64 = sqlx::query_scalar(
        "select watchpump.ping($1, (select id from watchpump.watches limit 1), '1 second')",
    )
    .bind(svc.service.id)
    .fetch_one(&promoted)
    .await
    .unwrap();
    assert!(
        ping > max_lost(|l| l.2),
        "a ping's delivery id {ping} handed out again"
    );
    promoted.close().await;
}

fn runs_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}
