//! `v1a` (ed25519) signatures against an independent implementation,
//! Python's `cryptography` (OpenSSL underneath), and end to end: a service
//! registered with `--signature ed25519` gets deliveries its public key
//! alone verifies, through a rotation.
//!
//! Needs `target/py/bin/python` with `cryptography` (scripts/test-deps.sh,
//! which `make test` runs), or `$STANDARDWEBHOOKS_PYTHON`; fails, never
//! skips, without it.

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use common::*;
use serde_json::{json, Value};
use watchpump::signing::{self, sign, verify, SigningSecret, VerifyError};

/// One request a line, one answer a line. `keygen` makes a key pair and
/// answers Svix's 64-byte whsk_ form and the whpk_ form; `sign KEY ID TS
/// BODY` signs `ID.TS.BODY` with a whsk_ key; `verify PUBKEY ID TS BODY
/// SIGNATURE` checks every v1a entry of a webhook-signature header.
const PY_SCRIPT: &str = r#"
import base64, sys
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

raw = serialization.Encoding.Raw
def content(msg_id, ts, body_b64):
    return msg_id.encode() + b"." + ts.encode() + b"." + base64.b64decode(body_b64)

for line in sys.stdin:
    f = line.rstrip("\n").split("\t")
    if f[0] == "keygen":
        key = Ed25519PrivateKey.generate()
        seed = key.private_bytes(raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
        public = key.public_key().public_bytes(raw, serialization.PublicFormat.Raw)
        print("whsk_" + base64.b64encode(seed + public).decode() + "\t"
              + "whpk_" + base64.b64encode(public).decode())
    elif f[0] == "sign":
        _, whsk, msg_id, ts, body = f
        seed = base64.b64decode(whsk[len("whsk_"):])[:32]
        key = Ed25519PrivateKey.from_private_bytes(seed)
        print("v1a," + base64.b64encode(key.sign(content(msg_id, ts, body))).decode())
    elif f[0] == "verify":
        _, whpk, msg_id, ts, body, header = f
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(whpk[len("whpk_"):]))
        answer = "no v1a entry"
        for entry in header.split(" "):
            version, _, sig = entry.partition(",")
            if version != "v1a":
                continue
            try:
                key.verify(base64.b64decode(sig), content(msg_id, ts, body))
                answer = "ok"
                break
            except InvalidSignature:
                answer = "invalid"
        print(answer)
    sys.stdout.flush()
"#;

fn python() -> PathBuf {
    let path = std::env::var_os("STANDARDWEBHOOKS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/py/bin/python"));
    assert!(
        path.exists(),
        "no Python at {}: run `make test` (scripts/test-deps.sh makes target/py)",
        path.display()
    );
    path
}

fn ask_python(requests: &[String]) -> Vec<String> {
    let mut child = Command::new(python())
        .arg("-c")
        .arg(PY_SCRIPT)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start python");
    {
        let mut stdin = child.stdin.take().unwrap();
        for r in requests {
            writeln!(stdin, "{r}").unwrap();
        }
    }
    let out = child.wait_with_output().expect("python output");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(answers.len(), requests.len());
    answers
}

fn bodies() -> Vec<Vec<u8>> {
    vec![
        br#"{"test": 2432232314}"#.to_vec(),
        r#"{"name":"Zoë","jp":"日本語","emoji":"🚀"}"#.as_bytes().to_vec(),
        Vec::new(),
        format!(r#"{{"big":"{}"}}"#, "x.y ".repeat(5_000)).into_bytes(),
    ]
}

const TS: i64 = 1_700_000_000;

#[test]
fn python_verifies_our_v1a_and_we_verify_pythons_with_svix_s_64_byte_keys() {
    // A key pair made by Python, in Svix's whsk_ form: we sign with it.
    let keys = ask_python(&["keygen".to_string()]);
    let (whsk, whpk) = keys[0].split_once('\t').unwrap();
    let theirs = SigningSecret::parse(whsk).expect("Svix's 64-byte whsk_ form");
    assert_eq!(theirs.public_key().as_deref(), Some(whpk));
    // And one of ours.
    let ours = SigningSecret::generate_ed25519();
    let our_public = ours.public_key().unwrap();

    let mut requests = Vec::new();
    let mut expected = Vec::new();
    for body in bodies() {
        for (key, public) in [(&theirs, whpk.to_string()), (&ours, our_public.clone())] {
            let header = sign(&[key], "42", TS, &body);
            requests.push(format!(
                "verify\t{public}\t42\t{TS}\t{}\t{header}",
                STANDARD.encode(&body)
            ));
            expected.push("ok");
        }
        // A signature over another body is refused by Python too.
        let header = sign(&[&ours], "42", TS, b"{}");
        requests.push(format!(
            "verify\t{our_public}\t42\t{TS}\t{}\t{header}",
            STANDARD.encode(&body)
        ));
        expected.push("invalid");
    }
    assert_eq!(ask_python(&requests), expected);

    // Python signs with its key; our verify accepts it with the public key
    // alone, and refuses it for another body or another key.
    let public = SigningSecret::parse(whpk).unwrap();
    let requests: Vec<String> = bodies()
        .iter()
        .map(|body| format!("sign\t{whsk}\t42\t{TS}\t{}", STANDARD.encode(body)))
        .collect();
    for (body, header) in bodies().iter().zip(ask_python(&requests)) {
        assert_eq!(
            verify(&[&public], "42", &TS.to_string(), &header, body, TS, 300),
            Ok(()),
            "{header}"
        );
        assert_eq!(
            verify(&[&public], "42", &TS.to_string(), &header, b"[1]", TS, 300),
            Err(VerifyError::NoMatchingSignature)
        );
        let stranger = SigningSecret::parse(&our_public).unwrap();
        assert_eq!(
            verify(&[&stranger], "42", &TS.to_string(), &header, body, TS, 300),
            Err(VerifyError::NoMatchingSignature)
        );
    }
}

fn cli(db: &TestDb, args: &[&str]) -> (i32, String, String) {
    let out = watchpump_cli(Some(&db.url)).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Verifies a received delivery with `keys` as a consumer would.
fn verified(received: &Received, keys: &[&SigningSecret]) -> Result<(), VerifyError> {
    let header = |name: &str| received.headers[name].to_str().unwrap().to_string();
    verify(
        keys,
        &header("webhook-id"),
        &header("webhook-timestamp"),
        &header("webhook-signature"),
        &received.raw,
        chrono::Utc::now().timestamp(),
        signing::DEFAULT_TOLERANCE_SECS,
    )
}

#[tokio::test]
async fn a_service_registered_with_ed25519_gets_deliveries_its_public_key_verifies_through_a_rotation(
) {
    let db = TestDb::new().await;
    let consumer = Receiver::start().await;
    let (code, out, err) = cli(
        &db,
        &[
            "services",
            "add",
            "deploy",
            "--base-url",
            &consumer.base_url(),
            "--signature",
            "ed25519",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let added: Value = serde_json::from_str(&out).unwrap();
    let whpk = added["signing_public_key"].as_str().expect("a public key");
    assert!(whpk.starts_with("whpk_"));
    assert_eq!(STANDARD.decode(&whpk[5..]).unwrap().len(), 32);
    assert!(
        added.get("signing_secret").is_none(),
        "nothing secret: {out}"
    );
    assert!(
        !out.contains("whsk_"),
        "the secret key stays with the producer"
    );
    let public = SigningSecret::parse(whpk).unwrap();
    let service_id: i64 =
        sqlx::query_scalar("select id from watchpump.services where name = 'deploy'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    db.add_watch(service_id, "app", "acme/", all()).await;
    let _pump = RunningPump::start(&db.pool, pump_config());

    db.emit("acme/web", "push", json!({"n": 1})).await;
    let received = consumer.wait_for(1, Duration::from_secs(20)).await;
    let header = received[0].headers["webhook-signature"].to_str().unwrap();
    assert!(
        header.starts_with("v1a,") && !header.contains(' '),
        "{header}"
    );
    assert_eq!(verified(&received[0], &[&public]), Ok(()));

    // A rotation: both keys sign during the overlap; each public key
    // verifies on its own.
    let (code, out, err) = cli(&db, &["services", "rotate-secret", "deploy"]);
    assert_eq!(code, 0, "{err}");
    let new_whpk = out.lines().last().unwrap().trim();
    assert!(new_whpk.starts_with("whpk_"), "{out}");
    let new_public = SigningSecret::parse(new_whpk).unwrap();
    db.emit("acme/web", "push", json!({"n": 2})).await;
    let received = consumer.wait_for(2, Duration::from_secs(20)).await;
    let header = received[1].headers["webhook-signature"].to_str().unwrap();
    assert_eq!(header.split(' ').count(), 2, "{header}");
    assert!(header.split(' ').all(|e| e.starts_with("v1a,")), "{header}");
    assert_eq!(verified(&received[1], &[&public]), Ok(()));
    assert_eq!(verified(&received[1], &[&new_public]), Ok(()));

    // Bad input: an unknown kind of signature registers nothing.
    let (code, _, err) = cli(
        &db,
        &[
            "services",
            "add",
            "other",
            "--base-url",
            &consumer.base_url(),
            "--signature",
            "rsa",
        ],
    );
    assert_ne!(code, 0);
    assert!(err.contains("rsa"), "{err}");
    let n: i64 = sqlx::query_scalar("select count(*) from watchpump.services")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(n, 1);
}
