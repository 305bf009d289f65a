//! `serve` started while its database is down (a restart, a failover, a
//! host booting in the wrong order) waits for it and starts when it is
//! back; so does one whose start-up meets another transaction's lock past
//! its `lock_timeout`, and so does `watchpump migrate`; a database that
//! waiting cannot cure is reported at once.
//!
//! A project-local cluster of its own (`target/pg-late`), because this
//! test stops and starts it.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn dev_postgres(args: &[&str]) -> String {
    let out = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/dev-postgres.sh"
    ))
    .args(args)
    .output()
    .expect("run scripts/dev-postgres.sh");
    assert!(
        out.status.success(),
        "dev-postgres.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Stops the cluster when the test ends, however it ends.
struct StopOnDrop;
impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let _ = Command::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/dev-postgres.sh"
        ))
        .args(["stop", "pg-late"])
        .output();
    }
}

/// `watchpump serve` on `url`, its API on a free port, no metrics, its
/// log (stderr) kept for [`stop_and_read_logs`].
fn serve(url: &str) -> Command {
    let mut command = watchpump_cli(Some(url));
    command
        .arg("serve")
        .env("WATCHPUMP_LISTEN", "127.0.0.1:0")
        .env("WATCHPUMP_METRICS_LISTEN", "off")
        .env("WATCHPUMP_PRODUCER", PRODUCER)
        .env("WATCHPUMP_PRODUCER_TOKEN", PRODUCER_TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// Waits until `check` (a boolean query) is true, failing if `serve`
/// exits meanwhile or `limit` passes.
async fn wait_while_serving(
    child: &mut KillOnDrop,
    pool: &sqlx::PgPool,
    check: &str,
    limit: Duration,
    waited_for: &str,
) {
    let deadline = Instant::now() + limit;
    loop {
        let done: bool = sqlx::query_scalar(check).fetch_one(pool).await.unwrap();
        if done {
            return;
        }
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "serve exited while waiting for {waited_for}"
        );
        assert!(
            Instant::now() < deadline,
            "waited {limit:?} for {waited_for}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Kills a running `serve` and returns what it logged.
fn stop_and_read_logs(mut child: KillOnDrop) -> String {
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let mut logs = String::new();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut logs)
        .unwrap();
    logs
}

#[tokio::test]
async fn serve_started_before_its_database_waits_for_it_and_then_runs() {
    let port = free_port().to_string();
    let _stop = StopOnDrop;
    // Created once (initdb), then stopped: the database is "down".
    let url = dev_postgres(&["start", "pg-late", &port, "off"]);
    dev_postgres(&["stop", "pg-late"]);

    let mut child = KillOnDrop(serve(&url).spawn().unwrap());
    // Down for a while: serve keeps trying and does not exit.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "serve exited while its database was down instead of waiting for it"
    );

    dev_postgres(&["start", "pg-late", &port, "off"]);
    let pool = watchpump::server::connect(&url, 1).await.unwrap();
    // Up again: serve connects, migrates and runs.
    wait_while_serving(
        &mut child,
        &pool,
        "select to_regclass('watchpump.settings') is not null",
        Duration::from_secs(60),
        "serve, its database back, to migrate it",
    )
    .await;
    assert!(child.0.try_wait().unwrap().is_none(), "serve is running");
    pool.close().await;
    let logs = stop_and_read_logs(child);
    assert!(
        logs.contains("cannot connect to the database yet; trying again")
            && logs.contains("Connection refused"),
        "each wait is logged with its cause:\n{logs}"
    );
}

#[tokio::test]
async fn serve_with_a_database_that_does_not_exist_exits_at_once_saying_so() {
    let admin = cluster_url();
    let missing = format!(
        "{}/wp_t_never_created_{:08x}",
        admin.rsplit_once('/').unwrap().0,
        rand::random::<u32>()
    );
    let out = serve(&missing).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "serve must fail: {stderr}");
    assert!(
        stderr.contains("does not exist"),
        "the error names the cause: {stderr}"
    );
    assert!(
        !stderr.contains("trying again"),
        "a missing database is not waited for, waiting cannot cure it: {stderr}"
    );
}

/// The database's own `lock_timeout` set to 100 ms (as a DBA's safeguard
/// would), and a session holding what `migrate` waits for: its advisory
/// lock, as another pump's or a deploy's migrate holds it.
async fn hold_the_migration_lock_past_lock_timeout(
    db: &TestDb,
) -> sqlx::pool::PoolConnection<sqlx::Postgres> {
    sqlx::query(&format!(
        "alter database {} set lock_timeout = '100ms'",
        db.name
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let mut holder = db.pool.acquire().await.unwrap();
    sqlx::query("select pg_advisory_lock(hashtext('watchpump.migrate'))")
        .execute(&mut *holder)
        .await
        .unwrap();
    holder
}

async fn release(mut holder: sqlx::pool::PoolConnection<sqlx::Postgres>) {
    sqlx::query("select pg_advisory_unlock(hashtext('watchpump.migrate'))")
        .execute(&mut *holder)
        .await
        .unwrap();
}

/// A DBA's `lock_timeout` (here the database's own, 100 ms) and a
/// transaction holding what `migrate` waits for (its advisory lock, as
/// another pump's or a deploy's migrate holds it) for 3 s: start-up's
/// first try fails with 55P03, and `serve` tries again rather than exiting,
/// then runs once the lock is released.
#[tokio::test]
async fn serve_whose_start_up_meets_a_lock_past_lock_timeout_tries_again_and_runs() {
    let db = TestDb::new().await;
    let holder = hold_the_migration_lock_past_lock_timeout(&db).await;

    let mut child = KillOnDrop(
        serve(&db.url)
            .env("WATCHPUMP_PUMP_NAME", "behind-a-lock")
            .spawn()
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "serve exited when its migrate met a lock past lock_timeout"
    );
    release(holder).await;

    // Its pump runs: idle, it registers as asleep.
    wait_while_serving(
        &mut child,
        &db.pool,
        "select exists (select 1 from watchpump.sleepers where pump = 'behind-a-lock')",
        Duration::from_secs(30),
        "serve's pump, the lock released, to run",
    )
    .await;
    let logs = stop_and_read_logs(child);
    assert!(
        logs.contains("start-up met another transaction's lock; trying again")
            && logs.contains("lock timeout"),
        "each try is logged with its cause:\n{logs}"
    );
}

/// `watchpump migrate` meets the same: a run holds its locks to its end,
/// so it may meet another transaction's lock past `lock_timeout` (or a
/// deadlock with a reader of a view it replaces, which PostgreSQL breaks).
/// It tries the whole run again, saying why, and succeeds once the lock is
/// gone, where it failed at the first 55P03.
#[tokio::test]
async fn watchpump_migrate_meeting_a_lock_past_lock_timeout_tries_again_and_succeeds() {
    let db = TestDb::new().await;
    let holder = hold_the_migration_lock_past_lock_timeout(&db).await;

    let mut child = watchpump_cli(Some(&db.url))
        .arg("migrate")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "watchpump migrate gave up at the lock"
    );
    release(holder).await;

    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "migrate failed:\n{stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("schema is up to date"),
        "{out:?}"
    );
    assert!(
        stderr.contains("migrate met another transaction's lock; trying again"),
        "each try is said with its cause:\n{stderr}"
    );
}
