//! `cargo run --example second_producer`: an issue tracker that embeds
//! watchpump as a second producer ("tracker"), in its own process and its
//! own database (`examples/tracker/mod.rs`).
//!
//! ```sh
//! make run   # for its PostgreSQL cluster; or set TRACKER_DATABASE_URL
//! cargo run --example second_producer
//! curl -X POST localhost:8090/issues/acme -H 'Content-Type: application/json' -d '{"title": "flaky deploy"}'
//! ```
//! Consumers register watches on `tracker/acme/issues/` at
//! `http://127.0.0.1:8090/api/v1/watches` with a token from
//! `DATABASE_URL=$TRACKER_DATABASE_URL target/release/watchpump services add ...`
//! (with `WATCHPUMP_SECRET_KEY`: by default `make run`'s, in target/dev-secret-key).

#[path = "tracker/mod.rs"]
mod tracker;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_ansi(std::io::stdout().is_terminal())
        .init();
    // Its pump opens the signing secrets with WATCHPUMP_SECRET_KEY; by
    // default the one `make run` made.
    if std::env::var_os("WATCHPUMP_SECRET_KEY").is_none() {
        let made_by_make_run = concat!(env!("CARGO_MANIFEST_DIR"), "/target/dev-secret-key");
        if let Ok(key) = std::fs::read_to_string(made_by_make_run) {
            std::env::set_var("WATCHPUMP_SECRET_KEY", key.trim());
        }
    }
    let database_url = std::env::var("TRACKER_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:54329/tracker".into());
    if let Err(e) = create_database(&database_url).await {
        eprintln!("tracker: cannot create its database: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let cfg = tracker::Config {
        database_url,
        listen: "127.0.0.1:8090".parse().unwrap(),
        producer_token: std::env::var("TRACKER_PRODUCER_TOKEN")
            .unwrap_or_else(|_| "dev-tracker-token".into()),
        admin_token: std::env::var("TRACKER_ADMIN_TOKEN").ok(),
    };
    let shutdown = watchpump::server::shutdown_signal();
    let bound = |addr| println!("tracker: issues, watches and panel on http://{addr}");
    match tracker::run(cfg, bound, shutdown).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tracker: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Creates the tracker's database on its cluster if it does not exist yet.
async fn create_database(url: &str) -> Result<(), sqlx::Error> {
    let (cluster, name) = url
        .rsplit_once('/')
        .expect("a database URL ends in /<name>");
    let admin = sqlx::PgPool::connect(&format!("{cluster}/postgres")).await?;
    let exists: bool =
        sqlx::query_scalar("select exists (select 1 from pg_database where datname = $1)")
            .bind(name)
            .fetch_one(&admin)
            .await?;
    if !exists {
        sqlx::query(&format!("create database \"{name}\""))
            .execute(&admin)
            .await?;
    }
    Ok(())
}
