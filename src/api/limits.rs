//! What one consumer service's self-service writes may cost (issue 34):
//! every write a consumer makes through this API (creating a watch, a
//! ping, a redelivery, a resync, a pause, a resume) takes a token from a
//! bucket of its service's own, in PostgreSQL so that every `serve`
//! process shares it (`watchpump.take_write_tokens()`,
//! `sql/functions/0250_rate.sql`): 60 at once, then one a second by
//! default (`watchpump.settings.self_service_rate` and `_burst`). Past it,
//! a 429 with `Retry-After`, and nothing is written. Registering an
//! identical watch again writes nothing and takes no token.
//!
//! The bounds on what those writes queue are SQL's, next to what they
//! bound, and reach the caller the same way (54000 with the wait in the
//! error's detail, [`refusal_of`]): a ping per watch per 10 s
//! (`watchpump.ping()`), a redelivery per delivery per minute
//! (`watchpump.redeliver()`), one resync per service at a time and a daily
//! replay budget (`watchpump.resync_start()`, `consumer_resync_start()`),
//! no pause within a minute of a resume (`watchpump.set_watch_paused()`).
//! Each refusal is counted in `watchpump_self_service_refused_total`
//! (`tests/consumer_limits.rs`).

use std::time::Duration;

use sqlx::postgres::PgDatabaseError;
use sqlx::PgPool;

use crate::http::HttpError;
use crate::services::Service;

/// What a refusal is counted under, the `limit` label of
/// `watchpump_self_service_refused_total`.
pub const LIMITS: &[&str] = &[
    "rate",
    "ping",
    "redeliver",
    "resync_running",
    "replay_budget",
    "repause",
];

/// A self-service write, for the refusal's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    Create,
    Ping,
    Redeliver,
    Resync,
    Pause,
    Resume,
}

impl Write {
    fn as_str(self) -> &'static str {
        match self {
            Write::Create => "watch creation",
            Write::Ping => "ping",
            Write::Redeliver => "redelivery",
            Write::Resync => "resync",
            Write::Pause => "pause",
            Write::Resume => "resume",
        }
    }
}

/// Takes a token of the service's bucket for `what`, or refuses it: 429
/// with the wait for the next token as `Retry-After`.
pub async fn take(pool: &PgPool, service: &Service, what: Write) -> Result<(), HttpError> {
    let crate::db::rate::WriteTokens {
        wait_secs: wait,
        rate,
        burst,
    } = crate::db::rate::take_write_token(pool, service.id).await?;
    if wait <= 0.0 {
        return Ok(());
    }
    count(&service.name, "rate");
    Err(HttpError::TooMany(
        format!(
            "too many self-service writes by this service: {burst} at once, then {rate} a \
             second (watch creation, ping, redeliver, resync, pause and resume together); \
             this {} may be asked again in {:.1} s",
            what.as_str(),
            wait
        ),
        Duration::from_secs_f64(wait),
    ))
}

/// Counts a refusal of `service`'s write at `limit` (one of [`LIMITS`]).
pub fn count(service: &str, limit: &'static str) {
    metrics::counter!(crate::metrics::SELF_SERVICE_REFUSED,
        "service" => service.to_string(), "limit" => limit)
    .increment(1);
}

/// A bound of a consumer's own calls reached (SQLSTATE 54000, from
/// `sql/functions/0700_consumer.sql`, `0550_pause.sql` or `0250_rate.sql`):
/// its message without the function's name, and the wait its detail gives
/// (`retry_after=N`; 1 s when it gives none).
pub fn refusal_of(e: &sqlx::Error) -> Option<(String, Duration)> {
    let sqlx::Error::Database(d) = e else {
        return None;
    };
    if d.code().as_deref() != Some("54000") {
        return None;
    }
    let message = d.message();
    let message = message
        .split_once(": ")
        .map_or(message, |(_, m)| m)
        .to_string();
    let wait = d
        .try_downcast_ref::<PgDatabaseError>()
        .and_then(|pg| pg.detail())
        .and_then(|detail| detail.strip_prefix("retry_after="))
        .and_then(|secs| secs.trim().parse::<f64>().ok())
        .filter(|secs| secs.is_finite())
        .map_or(Duration::from_secs(1), |secs| {
            Duration::from_secs_f64(secs.clamp(1.0, 86_400.0))
        });
    Some((message, wait))
}

/// [`refusal_of`] as a 429, counted under `limit`; any other error as
/// [`crate::Error::raised`] maps it.
pub fn too_many_or_raised(e: sqlx::Error, service: &str, limit: &'static str) -> HttpError {
    match refusal_of(&e) {
        Some((message, wait)) => {
            count(service, limit);
            HttpError::TooMany(message, wait)
        }
        None => crate::Error::raised(e).into(),
    }
}
