//! A second producer embedding watchpump: `tracker`, an issue tracker with
//! its own database, its own axum app and its own producer name. Its HTTP
//! app mounts watchpump's watches API and panel next to its own routes, its
//! pump runs as a task with its own shutdown, and opening or closing an
//! issue calls `watchpump::emit()` in the same transaction as its own write:
//! consumers follow `tracker/<project>/issues/<n>` exactly as they follow
//! git's objects, at `POST <consumer>/api/v1/tracker/events`.
//!
//! Shared by `examples/second_producer.rs` (the binary) and
//! `tests/second_producer.rs` (which runs it against a real database and a
//! real consumer).

use std::future::Future;
use std::net::SocketAddr;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio::sync::watch;
use watchpump::config::PumpConfig;
use watchpump::operator::OperatorConfig;
use watchpump::pump::Pump;

/// The producer's name: deliveries go to `<consumer>/api/v1/tracker/events`.
pub const PRODUCER: &str = "tracker";

/// What the tracker needs to run.
pub struct Config {
    pub database_url: String,
    pub listen: SocketAddr,
    /// The tracker's own service token, sent with every delivery.
    pub producer_token: String,
    /// For the panel and the admin API (at least 16 characters), or none.
    pub admin_token: Option<String>,
}

/// The tracker's own table, next to watchpump's schema in its database.
const SCHEMA: &str = "
    create table if not exists tracker_issues (
        project  text not null,
        number   integer not null,
        title    text not null,
        state    text not null default 'open' check (state in ('open', 'closed')),
        primary key (project, number)
    )";

#[derive(Clone)]
struct Tracker {
    pool: PgPool,
}

/// Runs the tracker until `shutdown` resolves: its routes and watchpump's
/// on one listener, and the pump beside them. Returns the address it
/// listened on once it has stopped.
pub async fn run(
    cfg: Config,
    bound: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> watchpump::Result<()> {
    let pool = watchpump::server::connect(&cfg.database_url, 8).await?;
    watchpump::schema::migrate(&pool).await?;
    sqlx::query(SCHEMA).execute(&pool).await?;

    let mut pump_cfg = PumpConfig::new(PRODUCER, &cfg.producer_token);
    // Its consumers run on this host (loopback is refused by default).
    pump_cfg.allowed_destinations = Some(watchpump::destinations::Destinations::loopback());
    let mut operator = OperatorConfig::new();
    operator.admin_token = cfg.admin_token.clone();
    let listener = tokio::net::TcpListener::bind(cfg.listen).await?;
    let addr = listener.local_addr()?;
    let state = watchpump::http::App::new(pool.clone(), &pump_cfg, &operator, addr);

    // Its own routes, watchpump's consumer API, admin API and panel, each
    // request in a span named by its route (traced once, as a whole).
    let app = watchpump::telemetry::http::traced(
        Router::new()
            .route("/issues/{project}", post(open_issue))
            .route("/issues/{project}/{number}/close", post(close_issue))
            .with_state(Tracker { pool: pool.clone() })
            .merge(watchpump::api::app(state.clone()))
            .merge(watchpump::operator::router(state)),
    );

    let (stop, stopped) = watch::channel(false);
    let wait = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let pump = tokio::spawn(Pump::new(pool.clone(), pump_cfg)?.run(wait(stopped.clone())));
    bound(addr);
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            let _ = stop.send(true);
        })
        .await;
    let pumped = pump.await.expect("the pump task");
    pool.close().await;
    served?;
    pumped
}

#[derive(Deserialize)]
struct NewIssue {
    title: String,
}

/// Opens an issue: the tracker's own row and the change consumers follow,
/// in one transaction.
async fn open_issue(
    State(t): State<Tracker>,
    Path(project): Path<String>,
    Json(new): Json<NewIssue>,
) -> Result<(StatusCode, Json<Value>), (StatusCode, String)> {
    let mut tx = t.pool.begin().await.map_err(internal)?;
    let number: i32 = sqlx::query_scalar(
        "insert into tracker_issues (project, number, title)
         select $1, coalesce(max(number), 0) + 1, $2 from tracker_issues where project = $1
         returning number",
    )
    .bind(&project)
    .bind(&new.title)
    .fetch_one(&mut *tx)
    .await
    .map_err(internal)?;
    let object = format!("tracker/{project}/issues/{number}");
    watchpump::emit(&mut tx, &object, "opened", &json!({"title": new.title}))
        .await
        .map_err(internal)?;
    tx.commit().await.map_err(internal)?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"number": number, "object": object})),
    ))
}

/// Closes an issue, and tells whoever follows it.
async fn close_issue(
    State(t): State<Tracker>,
    Path((project, number)): Path<(String, i32)>,
) -> Result<StatusCode, (StatusCode, String)> {
    let mut tx = t.pool.begin().await.map_err(internal)?;
    let closed = sqlx::query(
        "update tracker_issues set state = 'closed' where project = $1 and number = $2 and state = 'open'",
    )
    .bind(&project)
    .bind(number)
    .execute(&mut *tx)
    .await
    .map_err(internal)?
    .rows_affected();
    if closed == 0 {
        return Err((StatusCode::NOT_FOUND, "no such open issue".into()));
    }
    let object = format!("tracker/{project}/issues/{number}");
    watchpump::emit(&mut tx, &object, "closed", &json!({}))
        .await
        .map_err(internal)?;
    tx.commit().await.map_err(internal)?;
    Ok(StatusCode::NO_CONTENT)
}

fn internal(e: impl std::fmt::Display) -> (StatusCode, String) {
    (StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}
