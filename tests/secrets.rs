//! Signing secrets at rest (issue 17 item 8): stored encrypted with
//! `WATCHPUMP_SECRET_KEY`, never in clear; deliveries still signed with the
//! secret the service was given; a database from before encryption
//! encrypted in place by `migrate`; a key rotation; and a missing or wrong
//! key refused with a message, never a panic. Real PostgreSQL, the real
//! pump, a real consumer on loopback, and the binary as a child process.

mod common;

use std::process::Output;
use std::time::Duration;

use common::*;
use serde_json::json;
use watchpump::services::at_rest::{SecretKeys, KEY_VAR, PREVIOUS_KEY_VAR};
use watchpump::signing::{self, SigningSecret};

const LIMIT: Duration = Duration::from_secs(20);
/// A key that is not the tests' one.
const OTHER_KEY: &str = "b3RoZXIga2V5OiBub3QgdGhlIHRlc3RzJyBvbmUhISE=";

async fn stored(db: &TestDb, name: &str) -> (String, Option<String>) {
    sqlx::query_as(
        "select signing_secret, previous_signing_secret from watchpump.services where name = $1",
    )
    .bind(name)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// Delivers one change to `consumer` through the real pump and checks its
/// signature with `secret`, as the consumer would.
async fn delivered_and_verified(db: &TestDb, consumer: &Receiver, object: &str, secret: &str) {
    let before = consumer.count();
    db.emit(object, "push", json!({ "n": 1 })).await;
    let received = consumer.wait_for(before + 1, LIMIT).await;
    let last = received.last().unwrap();
    let header = |name: &str| last.headers[name].to_str().unwrap().to_string();
    let secret = SigningSecret::parse(secret).unwrap();
    signing::verify(
        &[&secret],
        &header("webhook-id"),
        &header("webhook-timestamp"),
        &header("webhook-signature"),
        &last.raw,
        chrono::Utc::now().timestamp(),
        signing::DEFAULT_TOLERANCE_SECS,
    )
    .expect("the delivery is signed with the service's secret");
}

#[tokio::test]
async fn a_signing_secret_is_stored_encrypted_and_deliveries_are_signed_with_it() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let added = watchpump::services::add_within(
        &db.pool,
        "deploy",
        &consumer.base_url(),
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap();
    db.add_watch(added.service.id, "web", "acme/", all()).await;

    let (current, _) = stored(&db, "deploy").await;
    assert!(current.starts_with("wpenc:v1:"), "{current}");
    let clear_part = added.signing_secret.trim_start_matches("whsec_");
    assert!(
        !current.contains("whsec_") && !current.contains(clear_part),
        "the secret is readable from the table: {current}"
    );
    // Nor by a query for it in the whole schema's text columns.
    let anywhere: i64 = sqlx::query_scalar(
        "select count(*) from watchpump.services s where s::text like '%' || $1 || '%'",
    )
    .bind(clear_part)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(anywhere, 0);
    // A clear secret can no longer be written.
    let refused = sqlx::query("update watchpump.services set signing_secret = $1")
        .bind(&added.signing_secret)
        .execute(&db.pool)
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("services_signing_secret_sealed"),
        "{refused}"
    );

    let pump = RunningPump::start(&db.pool, pump_config());
    delivered_and_verified(&db, &consumer, "acme/1", &added.signing_secret).await;

    // A rotation seals the new secret and the previous one; both sign.
    let new =
        watchpump::services::rotate_secret(&db.pool, "deploy", Duration::from_secs(3600), false)
            .await
            .unwrap()
            .new;
    let (current, previous) = stored(&db, "deploy").await;
    assert!(current.starts_with("wpenc:v1:") && !current.contains(&new));
    assert!(previous.unwrap().starts_with("wpenc:v1:"));
    delivered_and_verified(&db, &consumer, "acme/2", &new).await;
    delivered_and_verified(&db, &consumer, "acme/3", &added.signing_secret).await;
    pump.stop().await.unwrap();
}

/// Puts `db` back as it was before 0006_encrypted_secrets.sql: the old
/// checks, the secrets in clear, the migration not applied.
async fn as_before_encryption(db: &TestDb, clear: &[(&str, &str)]) {
    sqlx::raw_sql(
        "alter table watchpump.services
             drop constraint services_signing_secret_sealed,
             drop constraint services_previous_signing_secret_sealed;",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    for (name, secret) in clear {
        sqlx::query("update watchpump.services set signing_secret = $2 where name = $1")
            .bind(name)
            .bind(secret)
            .execute(&db.pool)
            .await
            .unwrap();
    }
    sqlx::raw_sql(
        "alter table watchpump.services
             add constraint services_signing_secret_check check (signing_secret ~ '^whsec_'),
             add constraint services_previous_signing_secret_check
                 check (previous_signing_secret ~ '^whsec_');
         delete from watchpump.schema_migrations where name = '0006_encrypted_secrets';",
    )
    .execute(&db.pool)
    .await
    .unwrap();
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[track_caller]
fn assert_fails_saying(out: &Output, says: &[&str]) {
    let err = stderr(out);
    assert!(
        !out.status.success() && out.status.code().is_some(),
        "expected a non-zero exit (no signal, no panic): {} {err}",
        out.status
    );
    assert!(!err.contains("panicked"), "{err}");
    for s in says {
        assert!(err.contains(s), "stderr should mention {s:?}: {err}");
    }
}

#[tokio::test]
async fn migrate_encrypts_the_secrets_of_a_database_from_before_in_place() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let deploy = watchpump::services::add_within(
        &db.pool,
        "deploy",
        &consumer.base_url(),
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap();
    let docs = watchpump::services::add_within(
        &db.pool,
        "docs",
        "http://127.0.0.1:9",
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap();
    db.add_watch(deploy.service.id, "web", "acme/", all()).await;
    let clear = [
        ("deploy", deploy.signing_secret.as_str()),
        ("docs", docs.signing_secret.as_str()),
    ];
    as_before_encryption(&db, &clear).await;
    assert_eq!(stored(&db, "deploy").await.0, deploy.signing_secret);

    // Without the key, migrate refuses (there are secrets to encrypt),
    // names the variable and how to make a key, and leaves them as they are.
    let out = watchpump_cli(Some(&db.url))
        .env_remove(KEY_VAR)
        .arg("migrate")
        .output()
        .unwrap();
    assert_fails_saying(&out, &[KEY_VAR, "openssl rand -base64 32"]);
    assert_eq!(stored(&db, "deploy").await.0, deploy.signing_secret);

    let out = watchpump_cli(Some(&db.url))
        .arg("migrate")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let keys = SecretKeys::from_env().unwrap();
    for (name, secret) in clear {
        let (sealed, _) = stored(&db, name).await;
        assert!(sealed.starts_with("wpenc:v1:"), "{name}: {sealed}");
        assert_eq!(keys.open(&sealed, name).unwrap(), secret, "{name}");
    }
    // The secret the team was given still verifies deliveries.
    let pump = RunningPump::start(&db.pool, pump_config());
    delivered_and_verified(&db, &consumer, "acme/1", &deploy.signing_secret).await;
    pump.stop().await.unwrap();
}

#[tokio::test]
async fn a_key_rotation_re_encrypts_with_the_new_key_and_a_wrong_key_is_a_clear_error() {
    let db = TestDb::new().await;
    let added = watchpump::services::add_within(
        &db.pool,
        "deploy",
        "http://127.0.0.1:9",
        &watchpump::destinations::Destinations::loopback(),
    )
    .await
    .unwrap();
    let old_key_id = SecretKeys::from_env().unwrap().current_id().to_string();

    // The wrong key: every command that opens or re-encrypts the secret
    // says which key the secret needs, and changes nothing.
    let before = stored(&db, "deploy").await;
    for args in [
        &["migrate"][..],
        &["secrets", "rekey"],
        &["services", "rotate-secret", "deploy"],
    ] {
        let out = watchpump_cli(Some(&db.url))
            .env(KEY_VAR, OTHER_KEY)
            .args(args)
            .output()
            .unwrap();
        assert_fails_saying(&out, &[KEY_VAR, &old_key_id]);
        assert_eq!(stored(&db, "deploy").await, before, "{args:?}");
    }
    let out = watchpump_cli(Some(&db.url))
        .env(KEY_VAR, "not a key")
        .args(["secrets", "rekey"])
        .output()
        .unwrap();
    assert_fails_saying(&out, &[KEY_VAR, "openssl rand -base64 32"]);

    // The rotation: the new key, the old one as the previous.
    let out = watchpump_cli(Some(&db.url))
        .env(KEY_VAR, OTHER_KEY)
        .env(PREVIOUS_KEY_VAR, TEST_SECRET_KEY)
        .args(["secrets", "rekey"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let new_keys = SecretKeys::new(OTHER_KEY, None).unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!(
            "every signing secret (1) is encrypted with key {}",
            new_keys.current_id()
        )),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let (sealed, _) = stored(&db, "deploy").await;
    assert!(new_keys.is_current(&sealed), "{sealed}");
    assert_eq!(new_keys.open(&sealed, "it").unwrap(), added.signing_secret);
    // The old key alone no longer opens it.
    assert!(SecretKeys::from_env().unwrap().open(&sealed, "it").is_err());
}

#[tokio::test]
async fn serve_and_services_add_without_the_key_say_how_to_make_one() {
    let db = TestDb::new().await;
    let out = watchpump_cli(Some(&db.url))
        .env_remove(KEY_VAR)
        .args([
            "services",
            "add",
            "deploy",
            "--base-url",
            "http://127.0.0.1:9",
        ])
        .output()
        .unwrap();
    assert_fails_saying(&out, &[KEY_VAR, "openssl rand -base64 32"]);
    let services: i64 = sqlx::query_scalar("select count(*) from watchpump.services")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(services, 0, "nothing registered");

    let out = watchpump_cli(Some(&db.url))
        .env_remove(KEY_VAR)
        .arg("serve")
        .env("WATCHPUMP_PRODUCER", "git")
        .env("WATCHPUMP_PRODUCER_TOKEN", "x")
        .env("WATCHPUMP_METRICS_LISTEN", "off")
        .env("WATCHPUMP_LISTEN", format!("127.0.0.1:{}", free_port()))
        .output()
        .unwrap();
    assert_fails_saying(&out, &[KEY_VAR, "openssl rand -base64 32"]);
}

/// A `secrets rekey` that a running pump has not caught up with (it lacks
/// the new key) leaves it unable to read the services rekeyed: it goes on
/// signing with the secrets it read before (a rekey seals the same secrets
/// with another key), and said so at every claim holding one of their
/// deliveries (327 ERROR lines in 6 s); now once per service per minute,
/// naming the service and the keys. `secrets rekey --json` says which key
/// and how many secrets.
#[tokio::test]
async fn a_pump_without_the_new_key_says_so_once_per_service_not_at_every_claim() {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    for name in ["deploy", "docs"] {
        let (service, _) = db.add_service(name, &consumer.base_url()).await;
        db.add_watch(service.id, "app", "acme/", all()).await;
    }
    let log = std::env::temp_dir().join(format!("watchpump-rekey-{}.log", rand::random::<u64>()));
    let mut serve = KillOnDrop(
        watchpump_cli(Some(&db.url))
            .arg("serve")
            .env("WATCHPUMP_LISTEN", format!("127.0.0.1:{}", free_port()))
            .env("WATCHPUMP_METRICS_LISTEN", "off")
            .env("WATCHPUMP_PRODUCER", PRODUCER)
            .env("WATCHPUMP_PRODUCER_TOKEN", PRODUCER_TOKEN)
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    // The pump signs with the key it has, for both services.
    db.emit("acme/before", "push", json!({})).await;
    consumer.wait_for(2, LIMIT).await;

    let out = watchpump_cli(Some(&db.url))
        .env(KEY_VAR, OTHER_KEY)
        .env(PREVIOUS_KEY_VAR, TEST_SECRET_KEY)
        .args(["secrets", "rekey", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let said: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let new_key = SecretKeys::new(OTHER_KEY, None).unwrap();
    assert_eq!(said, json!({"key_id": new_key.current_id(), "secrets": 2}));

    // Five seconds of changes: every claim finds deliveries it cannot sign.
    for i in 0..50 {
        db.emit(&format!("acme/{i}"), "push", json!({})).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = serve.0.kill();
    let _ = serve.0.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    assert_eq!(
        consumer.count(),
        102,
        "every change delivered, signed as before"
    );
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(
        errors.len(),
        2,
        "one line per service:\n{}",
        errors.join("\n")
    );
    for name in ["deploy", "docs"] {
        let line = errors
            .iter()
            .find(|l| l.contains(&format!("service \"{name}\"")))
            .unwrap_or_else(|| panic!("a line for {name}:\n{}", errors.join("\n")));
        for says in [
            "cannot read the service",
            "logged once a minute while it lasts",
            &format!("encrypted with key {}", new_key.current_id()),
            PREVIOUS_KEY_VAR,
        ] {
            assert!(line.contains(says), "{says:?} in {line}");
        }
    }
}
