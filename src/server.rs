//! `watchpump serve`: connect, migrate, then run the pump, the watches API
//! and the metrics endpoint until SIGTERM or Ctrl-C.
//!
//! Both listeners go through [`crate::edge`], sized so that, full, they
//! leave file descriptors for the database and the pump's connections to
//! consumers (`fd_reserve`): a flood of clients cannot stop deliveries.
//!
//! Over 400 lines: `serve` from start to stop in the order it happens
//! (connect and wait, migrate, size the listeners against the open-file
//! limit, run, shut down), each step short.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api;
use crate::config::ServeConfig;
/// Connecting, for the CLI and embedders: [`crate::db::connection`].
pub use crate::db::connection::{connect, connect_waiting};
use crate::db::connection::{is_gone, START_UP_PATIENCE};
use crate::error::{Error, Result};
use crate::http::App;
use crate::pump::Pump;
use crate::{edge, metrics, operator, schema, services};

/// Migrates the schema and reads the registered services, [`patiently`]:
/// the database answered a moment ago ([`connect`]), and start-up waits
/// out a restart, a failover or another transaction's lock instead of
/// exiting and leaving the restart to a supervisor.
async fn prepare_database(pool: &PgPool) -> Result<Vec<services::Service>> {
    patiently("start-up", || async {
        let applied = schema::migrate(pool).await?;
        if !applied.is_empty() {
            tracing::info!(?applied, "schema updated");
        }
        services::list(pool).await
    })
    .await
}

/// [`schema::migrate`], tried again while the database went away or
/// another transaction was in the way, for up to [`START_UP_PATIENCE`]:
/// what `watchpump migrate` and the CLI's commands that migrate run. A run
/// holds its locks to its end
/// (`sql_files::begin`), so a deadlock with a reader of a view it replaces
/// is not an error to give up on: PostgreSQL breaks it, and the run is
/// tried again whole.
pub async fn migrate_patiently(pool: &PgPool) -> Result<Vec<String>> {
    patiently("migrate", || schema::migrate(pool)).await
}

/// `attempt` again every half second while the database went away (a
/// restart, a failover: [`is_gone`]) or another transaction was in the way
/// ([`is_contention`]), saying so each time, for up to
/// [`START_UP_PATIENCE`]; any other error at once.
async fn patiently<T, F>(what: &str, mut attempt: impl FnMut() -> F) -> Result<T>
where
    F: Future<Output = Result<T>>,
{
    let started = tokio::time::Instant::now();
    loop {
        match attempt().await {
            Err(Error::Database(e)) if started.elapsed() < START_UP_PATIENCE => {
                let why = if is_gone(&e) {
                    format!("the database went away during {what}; trying again")
                } else if is_contention(&e) {
                    format!("{what} met another transaction's lock; trying again")
                } else {
                    return Err(Error::Database(e));
                };
                tracing::warn!(error = %e, "{why}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            done => return done,
        }
    }
}

/// Another transaction was in the way: a lock held past the role's or the
/// database's `lock_timeout` (55P03; a DBA's safeguard for migrations, which
/// the migration's advisory lock honours too), a deadlock (40P01: a pending
/// migration's lock on a table against a reader, a pump or the panel, of a
/// view the same run replaces), a serialization failure
/// (40001). The same statements succeed once it is done.
fn is_contention(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d)
        if d.code().is_some_and(|c| matches!(&*c, "55P03" | "40P01" | "40001")))
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
    cfg.edge.validate().map_err(Error::Config)?;
    // The pump signs every delivery: without the key it could sign none.
    services::at_rest::SecretKeys::from_env()?;
    let metrics_addr = metrics_addr(&cfg)?;
    let soft_limit = open_file_limit();
    // One connection more than asked for: the listener keeps one for itself.
    let pool = connect_waiting(database_url, cfg.db_pool.max(2) + 1, START_UP_PATIENCE).await?;
    // Before anything is written: behind transaction pooling, migrations
    // and everything after them would fail at random (crate::pooler).
    crate::pooler::check(&pool.connect_options(), "DATABASE_URL").await?;
    let reads =
        crate::replica::connect(cfg.read_database_url.as_deref(), cfg.db_pool, &pool).await?;
    let services = prepare_database(&pool).await?;
    let budget = budget(&cfg, soft_limit, metrics_addr.is_some());
    let metrics = match (metrics_addr, budget.metrics) {
        (Some(addr), Some(max)) => {
            let handle = metrics::install_recorder().map_err(Error::Config)?;
            for service in &services {
                metrics::register_service(&service.name);
            }
            Some((addr, handle, max))
        }
        _ => None,
    };
    let listener = bind(cfg.listen, "the watches API", "--listen / WATCHPUMP_LISTEN").await?;
    tracing::info!(addr = %cfg.listen, "watches API listening");
    log_panel(&cfg);
    log_traces();

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    // One application state for every router of the listener.
    let state = App::new(pool.clone(), &cfg.pump, &cfg.operator, cfg.listen)
        .with_reads(reads.clone())
        .with_throttle(std::sync::Arc::new(cfg.edge.throttle.throttle()));
    let worker = operator::Worker::new(
        pool.clone(),
        (*cfg.operator).clone(),
        &cfg.pump,
        &state.settings.panel_url,
    )?;
    // One application for every audience, traced once as a whole.
    let app =
        crate::telemetry::http::traced(api::app(state.clone()).merge(operator::router(state)));
    let api = tokio::spawn(edge::serve(
        listener,
        app,
        cfg.edge.api_limits(budget.api),
        "api",
        stopped(stop_rx.clone()),
    ));
    let mut tasks = Vec::new();
    if let Some((addr, handle, max)) = metrics {
        let listener = bind(
            addr,
            "metrics",
            "--metrics-listen / WATCHPUMP_METRICS_LISTEN",
        )
        .await?;
        tracing::info!(%addr, "metrics at /metrics");
        let limits = cfg.edge.metrics_limits(max);
        let stop = stopped(stop_rx.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = metrics::serve(listener, handle, limits, stop).await {
                tracing::error!(error = %e, "metrics listener failed");
            }
        }));
        let interval = std::time::Duration::from_millis(cfg.backlog_interval_ms);
        let mut collector = metrics::backlog::Collector::new(&pool);
        if reads.is_standby() {
            collector = collector.reading(reads.pool().clone());
        }
        tasks.push(tokio::spawn(metrics::backlog::run_collector(
            collector,
            interval,
            stopped(stop_rx.clone()),
        )));
    }
    tasks.push(tokio::spawn(worker.run(stopped(stop_rx.clone()))));
    let pump = Pump::new(pool.clone(), cfg.pump)?;
    let pump = tokio::spawn(pump.run(stopped(stop_rx)));

    shutdown.await;
    tracing::info!("shutting down: no new claims, finishing sends in flight");
    let _ = stop_tx.send(true);
    let pump_result = pump
        .await
        .map_err(|e| Error::Config(format!("pump task: {e}")))?;
    if let Ok(Err(e)) = api.await {
        tracing::error!(error = %e, "API listener failed");
    }
    for task in tasks {
        let _ = task.await;
    }
    pool.close().await;
    pump_result
}

/// Where the panel is, or why it is off: its page says so too, but nobody
/// opens a page they do not know is there.
fn log_panel(cfg: &ServeConfig) {
    let url = cfg.operator.panel_url(cfg.listen);
    if cfg.operator.admin_token.is_some() {
        tracing::info!(%url, "panel and admin API on: log in with WATCHPUMP_ADMIN_TOKEN");
    } else {
        tracing::info!(%url, "panel and admin API off: set WATCHPUMP_ADMIN_TOKEN (16 characters or more) to turn them on");
    }
}

/// Whether traces are on, where they go, which are kept and under what
/// name, once: with traces on, nothing else in the logs says so, and a
/// wrong variable showed only as a collector that stayed empty.
fn log_traces() {
    match crate::telemetry::status::traces() {
        crate::telemetry::status::Traces::On(on) => tracing::info!(
            endpoint = %on.endpoint,
            sampler = %on.sampler,
            ratio = on.ratio,
            service_name = %on.service_name,
            "traces on: spans go over OTLP/HTTP to {}, sampled at ratio {}",
            on.endpoint,
            on.ratio
        ),
        crate::telemetry::status::Traces::Off(why) => tracing::info!("traces off: {why}"),
    }
}

/// The metrics listener's address, or None when it is off.
fn metrics_addr(cfg: &ServeConfig) -> Result<Option<SocketAddr>> {
    if cfg.metrics_listen == "off" {
        return Ok(None);
    }
    if cfg.backlog_interval_ms == 0 {
        return Err(Error::Config(
            "the backlog interval must be above zero".into(),
        ));
    }
    cfg.metrics_listen.parse().map(Some).map_err(|e| {
        Error::Config(format!(
            "metrics listen address {:?}: {e}",
            cfg.metrics_listen
        ))
    })
}

/// Binds a listener; the error names the setting to change, since the
/// usual cause is another process on the port.
async fn bind(addr: SocketAddr, what: &str, setting: &str) -> Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| {
        Error::Config(format!(
            "cannot listen on {addr} for {what}: {e}; choose another address with {setting}"
        ))
    })
}

/// Raises the soft open-file limit to the hard one and returns it; when
/// that fails, the limit as it is (logged by the edge).
fn open_file_limit() -> u64 {
    match edge::raise_open_file_limit() {
        Ok((soft, _)) => soft,
        Err(_) => edge::fd::current_open_file_limit().unwrap_or(1024),
    }
}

/// The listeners' caps within the open-file limit, logged.
fn budget(cfg: &ServeConfig, soft_limit: u64, metrics: bool) -> edge::config::Budget {
    let reserve = fd_reserve(cfg);
    let budget = cfg.edge.budget(soft_limit, reserve, metrics);
    tracing::info!(soft_limit, reserve, api_connections = budget.api,
        metrics_connections = ?budget.metrics, "connection budget");
    if budget.api < cfg.edge.max_connections {
        tracing::warn!(
            configured = cfg.edge.max_connections,
            budget = budget.api,
            "the open-file limit leaves the API listener fewer connections than WATCHPUMP_MAX_CONNECTIONS"
        );
    }
    budget
}

/// Connections `pump::pump_pool` opens at most (claims, the
/// completer, the listener, one spare).
const PUMP_DB_CONNECTIONS: u64 = 4;

/// Idle keep-alive connections to consumers reserved for: a host keeps at
/// most its concurrency idle, for `pump::send::IDLE_TIMEOUT`; this covers
/// two busy hosts at the default concurrency. More idle ones than this
/// (many hosts busy in the last seconds) come out of the API listener's
/// share only while they exist, never below its floor
/// (`edge::config::API_FLOOR`).
const RESERVED_IDLE: u64 = 128;

/// File descriptors the listeners must leave to everything else at peak:
/// every database connection (the pool, the pump's own, the backlog
/// collector's), the pump's requests in flight across all consumers
/// (`WATCHPUMP_MAX_IN_FLIGHT`, however many services there are: issue 17,
/// 352 services at 64 each left the API 1 connection), its idle keep-alive
/// connections ([`RESERVED_IDLE`]), and one for notify.
fn fd_reserve(cfg: &ServeConfig) -> u64 {
    let standby = match cfg.read_database_url {
        Some(_) => u64::from(cfg.db_pool.max(2)),
        None => 0,
    };
    let database = u64::from(cfg.db_pool.max(2) + 1) + PUMP_DB_CONNECTIONS + 1 + standby;
    database + u64::from(cfg.pump.max_in_flight) + RESERVED_IDLE + 1
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_up_waits_only_for_a_database_that_went_away() {
        let cut = std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "expected to read 5 bytes",
        );
        assert!(is_gone(&sqlx::Error::Io(cut)));
        assert!(is_gone(&sqlx::Error::PoolTimedOut));
        assert!(!is_gone(&sqlx::Error::Protocol(
            "unexpected message".into()
        )));
        assert!(!is_gone(&sqlx::Error::RowNotFound));
        assert!(!is_gone(&sqlx::Error::Configuration("bad option".into())));
    }

    #[test]
    fn the_outbound_reserve_is_the_in_flight_cap_and_an_idle_pool() {
        use clap::Parser;
        let cli = crate::cli::Cli::parse_from(["watchpump", "serve"]);
        let crate::cli::Command::Serve(cfg) = cli.command else {
            unreachable!()
        };
        // 8 + 1 pool, 4 pump, 1 backlog; 512 in flight; 128 idle; notify.
        assert_eq!(fd_reserve(&cfg), 14 + 512 + 128 + 1);
        // A container's usual limit (1,024) leaves the API 223; a limit
        // below the reserve, its floor; a generous one, what is configured.
        assert_eq!(budget(&cfg, 1_024, true).api, 223);
        assert_eq!(budget(&cfg, 512, true).api, crate::edge::config::API_FLOOR);
        assert_eq!(budget(&cfg, 65_536, true).api, cfg.edge.max_connections);
    }

    #[test]
    fn a_standby_to_read_adds_its_pool_to_the_reserve() {
        use clap::Parser;
        let plain = crate::cli::Cli::parse_from(["watchpump", "serve"]);
        let standby = crate::cli::Cli::parse_from([
            "watchpump",
            "serve",
            "--read-database-url",
            "postgres://standby/db",
        ]);
        let (crate::cli::Command::Serve(plain), crate::cli::Command::Serve(standby)) =
            (plain.command, standby.command)
        else {
            unreachable!()
        };
        assert_eq!(fd_reserve(&standby), fd_reserve(&plain) + 8);
    }
}
