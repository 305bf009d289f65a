//! `watchpump serve`: connect, migrate, then run the pump, the watches API
//! and the metrics endpoint until SIGTERM or Ctrl-C.

use std::future::{Future, IntoFuture};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::{self, AppState};
use crate::config::ServeConfig;
use crate::error::{Error, Result};
use crate::pump::Pump;
use crate::{metrics, operator, schema, services};

/// Opens a pool on `database_url` with `size` connections. One connection
/// is made first, so that a bad URL or a refused connection says why at
/// once (a pool only reports that it timed out waiting, after 10 s).
pub async fn connect(database_url: &str, size: u32) -> Result<PgPool> {
    let shown = without_password(database_url);
    let options: PgConnectOptions = database_url
        .strip_prefix("postgres://")
        .or_else(|| database_url.strip_prefix("postgresql://"))
        .ok_or_else(|| {
            Error::Config(format!(
                "DATABASE_URL {shown:?} is not a PostgreSQL URL: it must start with postgres:// \
                 (e.g. postgres://user@127.0.0.1:5432/dbname)"
            ))
        })
        .and_then(|_| {
            database_url.parse().map_err(|e| {
                Error::Config(format!("DATABASE_URL {shown:?} is not a valid URL: {e}"))
            })
        })?;
    let first = PgConnection::connect_with(&options).await.map_err(|e| {
        Error::Connect(format!(
            "cannot connect to the database at {shown} (DATABASE_URL): {}",
            cause(&e)
        ))
    })?;
    let _ = first.close().await;
    Ok(PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect_with(options)
        .await?)
}

/// A database URL fit for messages: its password replaced.
fn without_password(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(u) => u.to_string(),
        Err(_) => url.split('@').next_back().unwrap_or(url).to_string(),
    }
}

/// The error with its causes ("Connection refused (os error 111)").
fn cause(e: &sqlx::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// Runs everything until `shutdown` resolves; then the API stops taking
/// requests, the pump finishes its sends, and this returns.
pub async fn serve(
    database_url: &str,
    cfg: ServeConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    cfg.pump.validate().map_err(Error::Config)?;
    cfg.operator.validate().map_err(Error::Config)?;
    // One connection more than asked for: the listener keeps one for itself.
    let pool = connect(database_url, cfg.db_pool.max(2) + 1).await?;
    let applied = schema::migrate(&pool).await?;
    if !applied.is_empty() {
        tracing::info!(?applied, "schema updated");
    }
    if cfg.metrics_listen != "off" {
        let addr = cfg.metrics_listen.parse().map_err(|e| {
            Error::Config(format!(
                "metrics listen address {:?}: {e}",
                cfg.metrics_listen
            ))
        })?;
        if cfg.backlog_interval_ms == 0 {
            return Err(Error::Config(
                "the backlog interval must be above zero".into(),
            ));
        }
        metrics::install(addr).map_err(Error::Config)?;
        for service in services::list(&pool).await? {
            metrics::register_service(&service.name);
        }
        tracing::info!(%addr, "metrics at /metrics");
    }
    let listener = TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| Error::Config(format!("cannot listen on {}: {e}", cfg.listen)))?;
    tracing::info!(addr = %cfg.listen, "watches API listening");

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let settings = operator::Settings::new(&cfg.operator, &cfg.pump, cfg.listen);
    let worker = operator::Worker::new(
        pool.clone(),
        (*cfg.operator).clone(),
        &cfg.pump,
        &settings.panel_url,
    )?;
    let app = api::app(AppState { pool: pool.clone() }).merge(operator::router(
        operator::OperatorState {
            pool: pool.clone(),
            settings: std::sync::Arc::new(settings),
        },
    ));
    let api = tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(stopped(stop_rx.clone()))
            .into_future(),
    );
    let backlog = (cfg.metrics_listen != "off").then(|| {
        let interval = std::time::Duration::from_millis(cfg.backlog_interval_ms);
        tokio::spawn(metrics::backlog::run(
            pool.clone(),
            interval,
            stopped(stop_rx.clone()),
        ))
    });
    let worker = tokio::spawn(worker.run(stopped(stop_rx.clone())));
    let pump = Pump::new(pool.clone(), cfg.pump)?;
    let pump = tokio::spawn(pump.run(stopped(stop_rx)));

    shutdown.await;
    tracing::info!("shutting down: no new claims, finishing sends in flight");
    let _ = stop_tx.send(true);
    let pump_result = pump
        .await
        .map_err(|e| Error::Config(format!("pump task: {e}")))?;
    let _ = api.await;
    let _ = worker.await;
    if let Some(backlog) = backlog {
        let _ = backlog.await;
    }
    pool.close().await;
    pump_result
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT). The handlers are installed when
/// this is called, not when the future is first polled, so a signal that
/// arrives while the server is still starting is not lost (and does not kill
/// the process with the default action). Call it within the runtime.
pub fn shutdown_signal() -> impl Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
