//! Reads on a standby (issue 36, `WATCHPUMP_READ_DATABASE_URL`): with a
//! real streaming standby whose replay the test pauses, the listing pages
//! (admin API, consumer API, panel) and the backlog gauges show what the
//! standby has and say how far behind it is, while claims and sends go on
//! on the primary; once the standby catches up, with the primary idle, it
//! is 0 behind, not the time since the last commit.
//!
//! A primary and a standby of the test's own (`scripts/dev-postgres.sh
//! start` and `standby`: initdb, then pg_basebackup), on free ports,
//! removed when the test ends however it ends.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const PRIMARY: &str = "pg-replica-a";
const STANDBY: &str = "pg-replica-b";

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

/// Stops both clusters and deletes them when the test ends.
struct RemoveOnDrop;
impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        for name in [STANDBY, PRIMARY] {
            let _ = Command::new(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/scripts/dev-postgres.sh"
            ))
            .args(["remove", name])
            .output();
        }
    }
}

/// GETs `url` with a bearer token, as JSON.
async fn get(url: &str, token: &str) -> Value {
    let resp = reqwest::Client::new()
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{url}");
    resp.json().await.unwrap()
}

/// The value of `watchpump_backlog{service,state}` on /metrics.
async fn gauge(metrics: &str, service: &str, state: &str) -> Option<f64> {
    series(
        metrics,
        &format!("watchpump_backlog{{service=\"{service}\",state=\"{state}\"}}"),
    )
    .await
}

/// The value of one series on /metrics.
async fn series(metrics: &str, series: &str) -> Option<f64> {
    let text = reqwest::get(metrics).await.ok()?.text().await.ok()?;
    let series = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn listing_pages_and_gauges_read_the_standby_and_say_how_far_behind_it_is() {
    let _remove = RemoveOnDrop;
    dev_postgres(&["remove", STANDBY]);
    dev_postgres(&["remove", PRIMARY]);
    let (primary_port, standby_port) = (free_port().to_string(), free_port().to_string());
    let admin = dev_postgres(&["start", PRIMARY, &primary_port, "off"]);
    let primary = format!("{}/wp_replica", admin.rsplit_once('/').unwrap().0);
    let admin_pool = watchpump::server::connect(&admin, 1).await.unwrap();
    sqlx::query("create database wp_replica")
        .execute(&admin_pool)
        .await
        .unwrap();
    use_test_secret_key();
    let pool = watchpump::server::connect(&primary, 4).await.unwrap();
    watchpump::schema::migrate(&pool).await.unwrap();
    let consumer = Receiver::start().await;
    let loopback = watchpump::destinations::Destinations::loopback();
    let mut tokens = Vec::new();
    for name in ["live", "held"] {
        let s = watchpump::services::add_within(&pool, name, &consumer.base_url(), &loopback)
            .await
            .unwrap();
        let watch = watchpump::watches::NewWatch {
            resource: "web".into(),
            object: "acme/".into(),
            filters: all(),
            resync: false,
        };
        watchpump::watches::create(&pool, s.service.id, &watch)
            .await
            .unwrap();
        tokens.push((s.service.id, s.token));
    }
    // `held` is paused: its delivery stays pending, for the gauges to count.
    watchpump::watches::pause::set_service(&pool, tokens[1].0, true)
        .await
        .unwrap();
    let standby_admin = dev_postgres(&["standby", STANDBY, &standby_port, &primary_port]);
    let standby = format!("{}/wp_replica", standby_admin.rsplit_once('/').unwrap().0);
    let standby_pool = watchpump::server::connect(&standby, 1).await.unwrap();

    let (api, metrics_port) = (free_port(), free_port());
    let mut serve = KillOnDrop(
        watchpump_cli(Some(&primary))
            .arg("serve")
            .env("WATCHPUMP_READ_DATABASE_URL", &standby)
            .env("WATCHPUMP_LISTEN", format!("127.0.0.1:{api}"))
            .env(
                "WATCHPUMP_METRICS_LISTEN",
                format!("127.0.0.1:{metrics_port}"),
            )
            .env("WATCHPUMP_BACKLOG_INTERVAL_MS", "200")
            .env("WATCHPUMP_PRODUCER", PRODUCER)
            .env("WATCHPUMP_PRODUCER_TOKEN", PRODUCER_TOKEN)
            .env("WATCHPUMP_ADMIN_TOKEN", ADMIN_TOKEN)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let base = format!("http://127.0.0.1:{api}");
    let metrics = format!("http://127.0.0.1:{metrics_port}/metrics");
    let live_token = tokens[0].1.clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    while reqwest::get(format!("{base}/healthz")).await.is_err() {
        assert!(serve.0.try_wait().unwrap().is_none(), "serve exited");
        assert!(Instant::now() < deadline, "serve did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Caught up: 0 behind, and still 0 after a second and a half in which
    // the primary committed nothing of the producer's.
    until(
        Duration::from_secs(30),
        "the standby is 0 behind",
        || async {
            let page = get(&format!("{base}/api/v1/admin/backlog"), ADMIN_TOKEN).await;
            check(page["replica_lag_seconds"] == json!(0.0), format!("{page}"))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let page = get(&format!("{base}/api/v1/admin/backlog"), ADMIN_TOKEN).await;
    assert_eq!(page["replica_lag_seconds"], json!(0.0), "idle: {page}");

    // The standby stops replaying: the change is claimed and sent from the
    // primary, and the pages, read on the standby, do not have it yet.
    sqlx::query("select pg_wal_replay_pause()")
        .execute(&standby_pool)
        .await
        .unwrap();
    until(Duration::from_secs(10), "replay paused", || async {
        let state: String = sqlx::query_scalar("select pg_get_wal_replay_pause_state()")
            .fetch_one(&standby_pool)
            .await
            .unwrap();
        check(state == "paused", state)
    })
    .await;
    let mut tx = pool.begin().await.unwrap();
    watchpump::emit(&mut tx, "acme/x", "push", &json!({}))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    consumer.wait_for(1, Duration::from_secs(30)).await;
    let pending_on_primary: i64 =
        sqlx::query_scalar("select pending from watchpump.backlog where service = 'held'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(pending_on_primary, 1);
    tokio::time::sleep(Duration::from_millis(1000)).await;

    let admin_page = get(&format!("{base}/api/v1/admin/deliveries"), ADMIN_TOKEN).await;
    assert_eq!(admin_page["deliveries"], json!([]), "{admin_page}");
    assert!(admin_page["replica_lag_seconds"].as_f64().unwrap() > 0.0);
    let own = get(&format!("{base}/api/v1/deliveries"), &live_token).await;
    assert_eq!(own["deliveries"], json!([]), "{own}");
    assert!(own["replica_lag_seconds"].as_f64().unwrap() > 0.0);
    let watches = get(&format!("{base}/api/v1/watches"), &live_token).await;
    assert!(watches["replica_lag_seconds"].as_f64().unwrap() > 0.0);
    let backlog = get(&format!("{base}/api/v1/admin/backlog"), ADMIN_TOKEN).await;
    assert_eq!(backlog["services"][0]["service"], "held");
    assert_eq!(backlog["services"][0]["pending"], 0, "{backlog}");
    assert_eq!(gauge(&metrics, "held", "pending").await, Some(0.0));
    // The gauge is read with the backlog every 200 ms: it says so once a
    // step has seen the WAL the standby has not replayed.
    until(
        Duration::from_secs(10),
        "the lag gauge says how far behind",
        || async {
            let lag = series(&metrics, "watchpump_read_replica_lag_seconds").await;
            check(lag.is_some_and(|lag| lag > 0.0), format!("{lag:?}"))
        },
    )
    .await;
    let cookie = {
        let login = panel_client()
            .post(format!("{base}/panel/login"))
            .header("origin", &base)
            .form(&[("token", ADMIN_TOKEN)])
            .send()
            .await
            .unwrap();
        let set = login.headers()["set-cookie"].to_str().unwrap();
        set.split(';').next().unwrap().to_string()
    };
    let panel = panel_client()
        .get(format!("{base}/panel/deliveries"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(panel.contains("Read from a standby,") && panel.contains("s behind the primary"));
    assert!(!panel.contains("acme/x"), "not replayed yet");

    // Replay resumes: the pages catch up and the standby is 0 behind.
    sqlx::query("select pg_wal_replay_resume()")
        .execute(&standby_pool)
        .await
        .unwrap();
    until(Duration::from_secs(30), "the pages catch up", || async {
        let page = get(&format!("{base}/api/v1/admin/deliveries"), ADMIN_TOKEN).await;
        let listed = page["deliveries"].as_array().unwrap().len();
        let gauge = gauge(&metrics, "held", "pending").await;
        let lag = series(&metrics, "watchpump_read_replica_lag_seconds").await;
        check(
            listed == 2
                && page["replica_lag_seconds"] == json!(0.0)
                && gauge == Some(1.0)
                && lag == Some(0.0),
            format!("{listed} listed, gauge {gauge:?}, lag {lag:?}: {page}"),
        )
    })
    .await;
    let own = get(&format!("{base}/api/v1/deliveries"), &live_token).await;
    assert_eq!(own["deliveries"].as_array().unwrap().len(), 1, "{own}");
}

#[tokio::test]
async fn a_read_url_that_is_not_a_copy_of_the_database_is_refused_at_start() {
    let db = TestDb::new().await;
    let other = fresh_database().await;
    for (read, says) in [
        (
            "not a url",
            "WATCHPUMP_READ_DATABASE_URL \"not a url\" is not a PostgreSQL URL",
        ),
        (
            other.as_str(),
            "must be a standby of DATABASE_URL's primary, naming the same database",
        ),
    ] {
        let out = watchpump_cli(Some(&db.url))
            .arg("serve")
            .env("WATCHPUMP_READ_DATABASE_URL", read)
            .env("WATCHPUMP_LISTEN", format!("127.0.0.1:{}", free_port()))
            .env("WATCHPUMP_METRICS_LISTEN", "off")
            .env("WATCHPUMP_PRODUCER", PRODUCER)
            .env("WATCHPUMP_PRODUCER_TOKEN", PRODUCER_TOKEN)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{said}");
        assert!(said.contains(says) && !said.contains("panicked"), "{said}");
    }
}
