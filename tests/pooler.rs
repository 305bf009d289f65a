//! pgbouncer in transaction mode between the producers and PostgreSQL
//! (issue 36; docs/operator.md, "Connection poolers"): a producer's
//! `emit()` and `emit_many()` with their trace context work through it,
//! from psql and from sqlx with statements not kept across transactions,
//! while the pooler hands one server session to several clients; sqlx's
//! kept statements (as `watchpump::emit()` and `serve` use them) break
//! there; and `watchpump serve` and `migrate` refuse it at start, naming
//! what to change, before they write anything.
//!
//! pgbouncer is Debian's 1.18, unpacked into target/tools by
//! `scripts/test-deps.sh`, run per test as a child process on a free
//! loopback port with a config of its own under target/.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};

/// A pgbouncer of the test's own, stopped and its directory removed when
/// dropped.
struct Pgbouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Pgbouncer {
    /// pgbouncer in front of the cluster of `database_url`, each of
    /// `databases` an alias `(name, pool_mode)` of that database, ignoring
    /// the startup parameters `ignore` (docs/operator.md's recipe:
    /// `extra_float_digits`, which sqlx sends), with two server sessions per
    /// pool at most, so that clients share them.
    fn start(database_url: &str, databases: &[(&str, &str)], ignore: &str) -> Pgbouncer {
        let target: PgConnectOptions = database_url.parse().unwrap();
        let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target"))
            .join(format!("pgbouncer-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let mut ini = String::from("[databases]\n");
        for (alias, mode) in databases {
            ini.push_str(&format!(
                "{alias} = host={} port={} dbname={} pool_mode={mode}\n",
                target.get_host(),
                target.get_port(),
                target.get_database().unwrap(),
            ));
        }
        ini.push_str(&format!(
            "[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {}/users.txt\ndefault_pool_size = 2\n\
             ignore_startup_parameters = {ignore}\n",
            dir.display()
        ));
        std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
        std::fs::write(
            dir.join("users.txt"),
            format!("\"{}\" \"\"\n", target.get_username()),
        )
        .unwrap();
        let mut command = Command::new(pgbouncer_binary());
        // pgbouncer refuses to run as root; -u drops to the postgres user
        // in the same process, which the drop kills.
        if is_root() {
            command.args(["-u", "postgres"]);
        }
        let log = std::fs::File::create(dir.join("pgbouncer.log")).unwrap();
        let child = command
            .arg(dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start pgbouncer");
        let bouncer = Pgbouncer { child, dir, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "pgbouncer did not listen: {}",
                bouncer.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        bouncer
    }

    /// The URL of database alias `name` through this pgbouncer.
    fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for Pgbouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What docs/operator.md's pgbouncer ignores: sqlx sends it.
const RECIPE: &str = "extra_float_digits";

/// target/tools/bin/pgbouncer (or an installed one); runs
/// `scripts/test-deps.sh` when neither is there, and fails saying why.
fn pgbouncer_binary() -> PathBuf {
    let find = || {
        [
            concat!(env!("CARGO_MANIFEST_DIR"), "/target/tools/bin/pgbouncer"),
            "/usr/sbin/pgbouncer",
        ]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
    };
    if let Some(path) = find() {
        return path;
    }
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/test-deps.sh")).output();
    find().unwrap_or_else(|| {
        panic!(
            "pgbouncer is not in target/tools and scripts/test-deps.sh could not unpack it: {}",
            out.map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                .unwrap_or_else(|e| e.to_string())
        )
    })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// psql runs each `-c` as a statement of its own, as an application
/// would, stopping at the first error.
fn psql(url: &str, statements: &[&str]) -> Output {
    let mut command = Command::new("psql");
    command.args([url, "-X", "-q", "-v", "ON_ERROR_STOP=1"]);
    for statement in statements {
        command.args(["-c", statement]);
    }
    command.output().expect("run psql")
}

/// `watchpump serve` on `url`, the API and panel on a free port, until
/// dropped; returns once /healthz answers.
async fn serve(url: &str) -> (KillOnDrop, String) {
    let port = free_port();
    let child = watchpump_cli(Some(url))
        .arg("serve")
        .env("WATCHPUMP_LISTEN", format!("127.0.0.1:{port}"))
        .env("WATCHPUMP_METRICS_LISTEN", "off")
        .env("WATCHPUMP_PRODUCER", PRODUCER)
        .env("WATCHPUMP_PRODUCER_TOKEN", PRODUCER_TOKEN)
        .env("WATCHPUMP_ADMIN_TOKEN", ADMIN_TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(child.0.try_wait().unwrap().is_none(), "serve exited");
        if let Ok(r) = reqwest::get(format!("{base}/healthz")).await {
            if r.status() == 200 {
                return (child, base);
            }
        }
        assert!(Instant::now() < deadline, "serve did not answer /healthz");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A W3C traceparent whose trace id is `n`.
fn traceparent(n: u64) -> String {
    format!("00-{n:032x}-{n:016x}-01")
}

#[tokio::test]
async fn producers_emit_with_their_trace_context_through_transaction_pooling() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (_, token) = db.add_service("deploy", &consumer.base_url()).await;
    let bouncer = Pgbouncer::start(&db.url, &[("producer", "transaction")], RECIPE);
    // The recipe: watchpump serve connects to PostgreSQL itself.
    let (_serve, base) = serve(&db.url).await;
    let http = reqwest::Client::new();
    let created = http
        .post(format!("{base}/api/v1/watches"))
        .bearer_auth(&token)
        .json(&json!({"resource": "web", "object": "acme/"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201, "the watch, through the watches API");

    // psql: each statement a message of its own, in two transactions,
    // emit() and then emit_many(), each with its own trace context.
    let set = |n| {
        format!(
            "select set_config('watchpump.traceparent', '{}', true)",
            traceparent(n)
        )
    };
    let out = psql(
        &bouncer.url("producer"),
        &[
            "begin",
            &set(1),
            "select watchpump.emit('acme/psql', 'push', '{\"n\": 1}')",
            "commit",
            "begin",
            &set(6),
            "select watchpump.emit_many(array['acme/many'], array['push'], array['{\"n\": 6}'::jsonb])",
            "commit",
        ],
    );
    assert!(
        out.status.success(),
        "psql: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // sqlx, as a producer's pool connects (extra_float_digits and all),
    // with statements that are not kept past their transaction: two
    // clients take turns, and the pooler gives them the same server
    // sessions.
    let mut clients = Vec::new();
    for _ in 0..2 {
        clients.push(
            PgConnection::connect(&bouncer.url("producer"))
                .await
                .unwrap(),
        );
    }
    let mut ran_on = Vec::new();
    for n in 2..6u64 {
        let conn = &mut clients[n as usize % 2];
        let mut tx = conn.begin().await.unwrap();
        let backend: i32 = sqlx::query_scalar("select pg_backend_pid()")
            .persistent(false)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        sqlx::query("select set_config('watchpump.traceparent', $1, true)")
            .bind(traceparent(n))
            .persistent(false)
            .execute(&mut *tx)
            .await
            .unwrap();
        let change: i64 = sqlx::query_scalar("select watchpump.emit($1, 'push', $2)")
            .bind(format!("acme/sqlx-{n}"))
            .bind(json!({ "n": n }))
            .persistent(false)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert!(change > 0);
        tx.commit().await.unwrap();
        ran_on.push((n % 2, backend));
    }
    assert!(
        ran_on
            .iter()
            .any(|(c, b)| ran_on.iter().any(|(d, e)| c != d && b == e)),
        "the two clients shared a server session: {ran_on:?}"
    );

    // Each change reaches the consumer with the trace context its
    // producer's transaction set (the pump forwards it as is, traces off).
    let received = consumer.wait_for(6, Duration::from_secs(30)).await;
    for r in &received {
        let n = r.body["payload"]["n"].as_u64().unwrap();
        assert_eq!(
            r.headers["traceparent"].to_str().unwrap(),
            traceparent(n),
            "{}",
            r.body["object"]
        );
    }

    // The consumer API and the panel, of the serve connected directly.
    until(
        Duration::from_secs(30),
        "the consumer API lists 6 delivered",
        || async {
            let page: serde_json::Value = http
                .get(format!("{base}/api/v1/deliveries?state=delivered"))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let n = page["deliveries"].as_array().map_or(0, Vec::len);
            check(n == 6, format!("{n} listed"))
        },
    )
    .await;
    let panel = panel_client();
    let login = panel
        .post(format!("{base}/panel/login"))
        .header("origin", &base)
        .form(&[("token", ADMIN_TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 303);
    let cookie = login.headers()["set-cookie"].to_str().unwrap();
    let page = panel
        .get(format!("{base}/panel/deliveries?service=deploy"))
        .header("cookie", cookie.split(';').next().unwrap())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(["acme/psql", "acme/many", "acme/sqlx-5"]
        .iter()
        .all(|o| page.contains(o)));
}

#[tokio::test]
async fn statements_sqlx_keeps_break_under_transaction_pooling() {
    let db = TestDb::new().await;
    let bouncer = Pgbouncer::start(&db.url, &[("producer", "transaction")], RECIPE);
    let mut first = PgConnection::connect(&bouncer.url("producer"))
        .await
        .unwrap();
    let mut second = PgConnection::connect(&bouncer.url("producer"))
        .await
        .unwrap();
    // watchpump::emit() runs a statement sqlx prepares under a name of its
    // own (sqlx_s_1) and keeps; the server session keeps it too, and the
    // next client given that session prepares its own under the same name.
    let mut tx = first.begin().await.unwrap();
    watchpump::emit(&mut tx, "acme/a", "push", &json!({}))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut tx = second.begin().await.unwrap();
    let refused = watchpump::emit(&mut tx, "acme/b", "push", &json!({}))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("prepared statement \"sqlx_s_1\" already exists"),
        "{refused}"
    );
}

#[tokio::test]
async fn serve_and_migrate_refuse_a_pooler_they_cannot_work_through() {
    let (url, pool) = blank_database().await;
    // Ignoring no startup parameter: watchpump's own connections do not
    // send extra_float_digits.
    let bouncer = Pgbouncer::start(&url, &[("tx", "transaction"), ("session", "session")], "");
    let dropping = Pgbouncer::start(
        &url,
        &[("session", "session")],
        "extra_float_digits, options",
    );
    let run = |url: String, args: &'static [&'static str]| {
        watchpump_cli(Some(&url))
            .args(args)
            .env("WATCHPUMP_LISTEN", format!("127.0.0.1:{}", free_port()))
            .env("WATCHPUMP_METRICS_LISTEN", "off")
            .env("WATCHPUMP_PRODUCER", PRODUCER)
            .env("WATCHPUMP_PRODUCER_TOKEN", PRODUCER_TOKEN)
            .output()
            .unwrap()
    };
    for args in [&["serve"][..], &["migrate"][..]] {
        let out = run(bouncer.url("tx"), args);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {said}");
        assert!(
            said.contains("DATABASE_URL reaches PostgreSQL through a connection pooler")
                && said.contains("pool_mode = transaction")
                && said.contains("pool_mode = session")
                && !said.contains("panicked"),
            "{args:?}: {said}"
        );
    }
    // A session pool: pgbouncer refuses the startup parameter the pump's
    // connections carry.
    let out = run(bouncer.url("session"), &["serve"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("unsupported startup parameter: options")
            && said.contains("point DATABASE_URL at PostgreSQL itself"),
        "{said}"
    );
    // One told to ignore it drops it: the pump would run without its
    // settings.
    let out = run(dropping.url("session"), &["serve"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("DATABASE_URL drops startup settings on the way"),
        "{said}"
    );
    // Refused before anything was written.
    let schema: Option<String> =
        sqlx::query_scalar("select to_regclass('watchpump.settings')::text")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(schema, None, "nothing was migrated");
}
