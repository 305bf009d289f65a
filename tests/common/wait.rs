//! Polling until a condition holds, and failing after a limit.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` until it returns true (panics after `limit`).
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        if Instant::now() > deadline {
            panic!("not within {limit:?}: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Retries `attempt` until it succeeds; panics with its last complaint
/// after `limit`.
pub async fn until<F, Fut>(limit: Duration, what: &str, mut attempt: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + limit;
    loop {
        match attempt().await {
            Ok(()) => return,
            Err(e) if Instant::now() > deadline => panic!("not within {limit:?}: {what}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// `Ok` if `ok`, else the complaint: one condition of an [`until`].
pub fn check(ok: bool, complaint: String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(complaint)
    }
}
