//! Pausing's statements (`sql/functions/0550_pause.sql`, "PAUSE"): the
//! rules are SQL's; the batches and bounds they run with are in
//! [`crate::watches::pause`].

use sqlx::PgPool;

/// `watchpump.set_watch_paused()`: whether anything changed; P0002 for
/// another service's watch or a removed one, 54000 for a pause within
/// `repause_after_secs` of the last resume.
pub async fn set_watch_paused(
    pool: &PgPool,
    service_id: i64,
    watch_id: i64,
    paused: bool,
    repause_after_secs: Option<f64>,
) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"select watchpump.set_watch_paused($1, $2, $3, make_interval(secs => $4::double precision))
               as "changed!""#,
        service_id,
        watch_id,
        paused,
        repause_after_secs
    )
    .fetch_one(pool)
    .await
}

/// `watchpump.set_service_paused()`: whether anything changed.
pub async fn set_service_paused(
    pool: &PgPool,
    service_id: i64,
    paused: bool,
) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"select watchpump.set_service_paused($1, $2) as "changed!""#,
        service_id,
        paused
    )
    .fetch_one(pool)
    .await
}

/// What one run of `watchpump.hold_paused()` did.
pub struct Held {
    pub superseded: i32,
    pub held: i32,
}

pub async fn hold_paused(pool: &PgPool, max: i32) -> sqlx::Result<Held> {
    sqlx::query_as!(
        Held,
        r#"select superseded as "superseded!", held as "held!" from watchpump.hold_paused($1)"#,
        max
    )
    .fetch_one(pool)
    .await
}

/// `watchpump.release_resumed()`: how many were released.
pub async fn release_resumed(pool: &PgPool, per_watch: i32, max: i32) -> sqlx::Result<i32> {
    sqlx::query_scalar!(
        r#"select watchpump.release_resumed($1, $2) as "released!""#,
        per_watch,
        max
    )
    .fetch_one(pool)
    .await
}

/// A consumer's pause that `watchpump.expire_pauses()` ended.
pub struct Expired {
    pub service: String,
    pub watch_id: i64,
}

pub async fn expire_pauses(pool: &PgPool, max: i32) -> sqlx::Result<Vec<Expired>> {
    sqlx::query_as!(
        Expired,
        r#"select service as "service!", watch_id as "watch_id!"
           from watchpump.expire_pauses($1)"#,
        max
    )
    .fetch_all(pool)
    .await
}
