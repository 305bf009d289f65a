//! Interoperability with an independent implementation: the Standard Webhooks
//! reference library for Python (`standardwebhooks` on PyPI).
//!
//! Rust signs and Python verifies, Python signs and Rust verifies, over a few
//! secrets, ids and bodies (JSON, non-ASCII, empty, large). Needs a Python
//! with the package installed: `$STANDARDWEBHOOKS_PYTHON`, or else
//! `target/py/bin/python`, which `make test` makes (scripts/test-deps.sh):
//!
//! ```sh
//! python3 -m venv target/py && target/py/bin/pip install standardwebhooks==1.1.0
//! ```
//!
//! The test fails (it does not skip) when neither exists, so that a missing
//! setup cannot pass for a green run.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use watchpump::signing::{sign, verify, SigningSecret, VerifyError, DEFAULT_TOLERANCE_SECS};

/// Reads one request per line (tab-separated, bodies in base64 so any bytes
/// survive) and answers one line each. Uses only the library's documented
/// API: `Webhook(secret)`, `.verify(body, headers)` and `.sign(msg_id,
/// timestamp, data)`.
const PY_SCRIPT: &str = r#"
import base64, sys
from datetime import datetime, timezone
from importlib.metadata import version
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

for line in sys.stdin:
    f = line.rstrip("\n").split("\t")
    op = f[0]
    if op == "version":
        print(version("standardwebhooks"))
    elif op == "verify":
        _, secret, msg_id, ts, body_b64, sig = f
        body = base64.b64decode(body_b64)
        headers = {"webhook-id": msg_id, "webhook-timestamp": ts, "webhook-signature": sig}
        try:
            # verify() JSON-parses the body by default; an empty body is not JSON.
            Webhook(secret).verify(body, headers, json_parse=bool(body))
            print("ok")
        except WebhookVerificationError as e:
            print("rejected: %s" % e)
    elif op == "sign":
        _, secret, msg_id, ts, body_b64 = f
        data = base64.b64decode(body_b64).decode("utf-8")
        # sign() takes a datetime (not an int) and the body as str.
        when = datetime.fromtimestamp(int(ts), tz=timezone.utc)
        print(Webhook(secret).sign(msg_id, when, data))
    else:
        print("unknown op %r" % op)
    sys.stdout.flush()
"#;

fn python() -> PathBuf {
    let path = std::env::var_os("STANDARDWEBHOOKS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/py/bin/python"));
    assert!(
        path.exists(),
        "no Python at {}: run `make test` (scripts/test-deps.sh makes target/py) \
         in {} or set STANDARDWEBHOOKS_PYTHON",
        path.display(),
        env!("CARGO_MANIFEST_DIR")
    );
    path
}

/// Sends all requests to one Python process and returns its answers in order.
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
            assert!(!r.contains('\n'));
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
    assert_eq!(answers.len(), requests.len(), "one answer per request");
    answers
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn secrets() -> Vec<SigningSecret> {
    vec![
        SigningSecret::generate(),
        // 24 bytes, the spec's minimum (and its published example).
        SigningSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap(),
        // 64 bytes, the maximum.
        SigningSecret::parse(&format!("whsec_{}", STANDARD.encode([0xa5u8; 64]))).unwrap(),
    ]
}

fn ids() -> Vec<&'static str> {
    vec!["1", "18446744073709551615", "msg_p5jXN8AQM9LWM0D4loKWxJek"]
}

fn bodies() -> Vec<Vec<u8>> {
    vec![
        br#"{"test": 2432232314}"#.to_vec(),
        r#"{"name":"Zoë Łukasz","city":"Kraków","jp":"日本語","emoji":"🚀","quote":"\"a.b\""}"#
            .as_bytes()
            .to_vec(),
        Vec::new(),
        b"{\"text\":\"tab\\tand\\nnewline\",\n\t\"raw\": \"line\"\n}\n".to_vec(),
        format!(r#"{{"big":"{}"}}"#, "x.y ".repeat(5_000)).into_bytes(),
    ]
}

fn verify_request(secret: &SigningSecret, id: &str, ts: i64, body: &[u8], sig: &str) -> String {
    format!(
        "verify\t{}\t{id}\t{ts}\t{}\t{sig}",
        secret.to_whsec(),
        STANDARD.encode(body)
    )
}

#[test]
fn python_verifies_what_rust_signs() {
    let secrets = secrets();
    let ts = now();
    let mut requests = vec!["version".to_string()];
    let mut expected = vec![None];
    for secret in &secrets {
        for id in ids() {
            for body in bodies() {
                let sig = sign(&[secret], id, ts, &body);
                requests.push(verify_request(secret, id, ts, &body, &sig));
                expected.push(Some("ok"));
                // Control: Python must refuse a tampered body, or its "ok"
                // above would prove nothing.
                let mut tampered = body.clone();
                tampered.push(b' ');
                requests.push(verify_request(secret, id, ts, &tampered, &sig));
                expected.push(Some("rejected: No matching signature found"));
            }
        }
    }

    // Rotation: a two-signature header verifies with either secret alone.
    let (old, new, stranger) = (&secrets[0], &secrets[2], SigningSecret::generate());
    let body = br#"{"rotation":true}"#;
    let both = sign(&[old, new], "7", ts, body);
    assert_eq!(both.matches(' ').count(), 1);
    for (secret, answer) in [
        (old, "ok"),
        (new, "ok"),
        (&stranger, "rejected: No matching signature found"),
    ] {
        requests.push(verify_request(secret, "7", ts, body, &both));
        expected.push(Some(answer));
    }

    // Python applies the same 5-minute window: same limits as ours.
    for (at, answer) in [
        (
            ts - DEFAULT_TOLERANCE_SECS - 60,
            "rejected: Message timestamp too old",
        ),
        (
            ts + DEFAULT_TOLERANCE_SECS + 60,
            "rejected: Message timestamp too new",
        ),
    ] {
        let sig = sign(&[old], "8", at, body);
        requests.push(verify_request(old, "8", at, body, &sig));
        expected.push(Some(answer));
    }

    let answers = ask_python(&requests);
    println!("standardwebhooks (Python) version {}", answers[0]);
    let mut checked = 0;
    for ((request, answer), want) in requests.iter().zip(&answers).zip(&expected) {
        if let Some(want) = want {
            assert_eq!(answer, want, "request: {request}");
            checked += 1;
        }
    }
    println!("{checked} Rust-signed cases checked by Python");
}

#[test]
fn rust_verifies_what_python_signs() {
    let secrets = secrets();
    let stamps = [1_614_265_330, now()];
    let mut requests = Vec::new();
    let mut cases = Vec::new();
    for secret in &secrets {
        for id in ids() {
            for body in bodies() {
                for ts in stamps {
                    requests.push(format!(
                        "sign\t{}\t{id}\t{ts}\t{}",
                        secret.to_whsec(),
                        STANDARD.encode(&body)
                    ));
                    cases.push((secret, id, ts, body.clone()));
                }
            }
        }
    }
    let answers = ask_python(&requests);
    let stranger = SigningSecret::generate();
    for ((secret, id, ts, body), py_sig) in cases.iter().zip(&answers) {
        let ts_text = ts.to_string();
        // Byte-for-byte the same header as ours...
        assert_eq!(py_sig, &sign(&[secret], id, *ts, body), "{id} {ts}");
        // ...and it verifies, at the signing time and at either edge of
        // the window, alone or next to a rotation partner.
        for now in [
            *ts,
            ts - DEFAULT_TOLERANCE_SECS,
            ts + DEFAULT_TOLERANCE_SECS,
        ] {
            assert_eq!(
                verify(
                    &[secret],
                    id,
                    &ts_text,
                    py_sig,
                    body,
                    now,
                    DEFAULT_TOLERANCE_SECS
                ),
                Ok(())
            );
        }
        assert_eq!(
            verify(
                &[&stranger, secret],
                id,
                &ts_text,
                py_sig,
                body,
                *ts,
                DEFAULT_TOLERANCE_SECS
            ),
            Ok(())
        );
        assert_eq!(
            verify(
                &[&stranger],
                id,
                &ts_text,
                py_sig,
                body,
                *ts,
                DEFAULT_TOLERANCE_SECS
            ),
            Err(VerifyError::NoMatchingSignature)
        );
        let mut tampered = body.clone();
        tampered.push(b' ');
        assert_eq!(
            verify(
                &[secret],
                id,
                &ts_text,
                py_sig,
                &tampered,
                *ts,
                DEFAULT_TOLERANCE_SECS
            ),
            Err(VerifyError::NoMatchingSignature)
        );
    }
    // The published vector, signed by Python here rather than copied.
    let vector = ask_python(&[format!(
        "sign\twhsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\tmsg_p5jXN8AQM9LWM0D4loKWxJek\t1614265330\t{}",
        STANDARD.encode(br#"{"test": 2432232314}"#)
    )]);
    assert_eq!(vector[0], "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    println!("{} Python-signed cases verified by Rust", cases.len());
}
