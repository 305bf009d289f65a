//! Starting one example consumer against a running `make run`, with no
//! setup by hand:
//!
//! 1. its own database on the producer's cluster (created if missing), with
//!    the kit's inbox and its own tables;
//! 2. its service at the producer: registered through the producer's
//!    database on the first start; on later starts the token and signing
//!    secret it stored in its own database are used again;
//! 3. its watch, registered through the producer's watches API (an identical
//!    live watch is returned as it is, so this is safe on every start);
//! 4. its events endpoint, served until Ctrl-C.
//!
//! Steps 1 and 2 are the example's shortcuts: a real consumer gets its
//! credentials from the producer's operator (`watchpump services add`) and
//! keeps them in its secret store, and has its own database.
//!
//! Settings (environment): `DATABASE_URL` (the producer's database,
//! default `make run`'s), `WATCHPUMP_API` (default `http://127.0.0.1:8080`),
//! `WATCHPUMP_PRODUCER` (`git`), `WATCHPUMP_PRODUCER_TOKEN`
//! (`dev-producer-token`, `make run`'s), `WATCHPUMP_EXAMPLE_LISTEN`.

use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::PgPool;
use watchpump::kit::{self, BoxError, Handler, Inbox, Producer, WatchClient};
use watchpump::services;

use super::consumers::Consumer;

const CREDENTIALS: &str = "
    create table if not exists example_credentials (
        service         text primary key,
        token           text not null,
        signing_secret  text not null,
        stored_at       timestamptz not null default now()
    );";

struct Settings {
    database_url: String,
    api: String,
    producer: String,
    producer_token: String,
    listen: String,
}

impl Settings {
    fn from_env<H: Handler>(c: &Consumer<H>) -> Settings {
        let var =
            |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
        Settings {
            database_url: var(
                "DATABASE_URL",
                "postgres://postgres@127.0.0.1:54329/watchpump",
            ),
            api: var("WATCHPUMP_API", "http://127.0.0.1:8080"),
            producer: var("WATCHPUMP_PRODUCER", "git"),
            producer_token: var("WATCHPUMP_PRODUCER_TOKEN", "dev-producer-token"),
            listen: var("WATCHPUMP_EXAMPLE_LISTEN", c.listen),
        }
    }
}

struct Credentials {
    token: String,
    signing_secret: String,
}

/// Starts `c` and serves it until Ctrl-C; `on_start` gets its database once
/// everything is in place (to start a worker).
pub async fn main<H: Handler>(c: Consumer<H>, on_start: impl FnOnce(PgPool)) -> ExitCode {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // Traces, when an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT):
    // the kit's handler span continues the producer's trace, and this
    // consumer's spans are exported under its own service name.
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        std::env::set_var("OTEL_SERVICE_NAME", c.service);
    }
    let telemetry = match watchpump::telemetry::Telemetry::from_env() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{}: {e}", c.service);
            return ExitCode::FAILURE;
        }
    };
    tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new(
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,watchpump=info".into()),
        ))
        .with(telemetry.as_ref().map(|t| t.layer()))
        // No colour codes in a file or a pipe, as the watchpump binary.
        .with(tracing_subscriber::fmt::layer().with_ansi(std::io::stdout().is_terminal()))
        .init();
    // The example registers itself through the producer's database, which
    // stores signing secrets encrypted: with `make run`'s key unless told.
    if std::env::var_os("WATCHPUMP_SECRET_KEY").is_none() {
        let made_by_make_run = concat!(env!("CARGO_MANIFEST_DIR"), "/target/dev-secret-key");
        if let Ok(key) = std::fs::read_to_string(made_by_make_run) {
            std::env::set_var("WATCHPUMP_SECRET_KEY", key.trim());
        }
    }
    let service = c.service;
    let outcome = run(c, on_start).await;
    if let Some(t) = telemetry {
        t.shutdown();
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{service}: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run<H: Handler>(c: Consumer<H>, on_start: impl FnOnce(PgPool)) -> Result<(), BoxError> {
    let s = Settings::from_env(&c);
    let base_url = format!("http://{}", s.listen);
    let producer_db = PgPool::connect(&s.database_url).await.map_err(|e| {
        format!(
            "cannot reach the producer's database {}: {e} (is `make run` running?)",
            s.database_url
        )
    })?;
    let own = own_database(&producer_db, &s.database_url, c.service, c.database).await?;
    kit::migrate(&own).await?;
    sqlx::raw_sql(c.schema).execute(&own).await?;
    let creds = credentials(&producer_db, &own, c.service, &base_url).await?;
    producer_db.close().await;

    let watches = WatchClient::new(own.clone(), &s.producer, &s.api, &creds.token)?;
    let watch = watches
        .register(&c.watch)
        .await
        .map_err(|e| format!("{e} (is `make run` running?)"))?;
    println!(
        "{}: watch {} for {}: {} {}",
        c.service, watch.id, watch.resource, watch.object, watch.filters
    );

    let producer = Producer::new(
        &s.producer,
        &s.producer_token,
        vec![creds.signing_secret.parse()?],
    );
    let app = Inbox::new(own.clone(), c.handler)
        .producer(producer)
        .router();
    let listener = tokio::net::TcpListener::bind(&s.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", s.listen))?;
    println!(
        "{}: listening on {base_url}/api/v1/{}/events (Ctrl-C stops)",
        c.service, s.producer
    );
    on_start(own.clone());
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    kit::serve(listener, app, kit::Limits::default(), ctrl_c).await?;
    Ok(())
}

/// The consumer's own database on the producer's cluster, created if
/// missing.
async fn own_database(
    producer_db: &PgPool,
    producer_url: &str,
    service: &str,
    name: &str,
) -> Result<PgPool, BoxError> {
    let exists: Option<i32> = sqlx::query_scalar("select 1 from pg_database where datname = $1")
        .bind(name)
        .fetch_optional(producer_db)
        .await?;
    if exists.is_none() {
        // `name` is one of the examples' constants, a plain identifier.
        sqlx::raw_sql(&format!("create database {name}"))
            .execute(producer_db)
            .await?;
        println!(
            "{service}: created database {name} on the producer's cluster for its inbox and state"
        );
    }
    let options = PgConnectOptions::from_str(producer_url)?.database(name);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await?;
    sqlx::raw_sql(CREDENTIALS).execute(&pool).await?;
    Ok(pool)
}

/// The service's token and signing secret: the stored ones while they still
/// work, otherwise new ones (registering the service, or rotating both when
/// it exists but this database has no working token for it).
async fn credentials(
    producer_db: &PgPool,
    own: &PgPool,
    name: &str,
    base_url: &str,
) -> Result<Credentials, BoxError> {
    let stored: Option<(String, String)> =
        sqlx::query_as("select token, signing_secret from example_credentials where service = $1")
            .bind(name)
            .fetch_optional(own)
            .await?;
    let existing = match services::find(producer_db, name).await {
        Ok(service) => Some(service),
        Err(watchpump::Error::NotFound(_)) => None,
        Err(e) => return Err(e.into()),
    };
    let Some(service) = existing else {
        let registered = services::add_within(
            producer_db,
            name,
            base_url,
            &watchpump::destinations::Destinations::loopback(),
        )
        .await?;
        println!("{name}: registered service {name} at the producer, base URL {base_url}");
        let creds = Credentials {
            token: registered.token,
            signing_secret: registered.signing_secret,
        };
        return store(own, name, creds).await;
    };
    if service.base_url != base_url {
        services::set_url_within(
            producer_db,
            name,
            base_url,
            &watchpump::destinations::Destinations::loopback(),
        )
        .await?;
        println!(
            "{name}: pointed service {name} at {base_url} (was {})",
            service.base_url
        );
    }
    if let Some((token, signing_secret)) = stored {
        let works = services::authenticate(producer_db, &token).await?;
        if works.is_some_and(|s| s.id == service.id) {
            println!("{name}: service {name} exists; using the token and signing secret stored in database {name}");
            return Ok(Credentials {
                token,
                signing_secret,
            });
        }
    }
    // Forced: the credentials this example had are lost, and no one else
    // uses them, so an overlap still running protects nobody.
    let token = services::rotate_token(producer_db, name, Duration::ZERO, true)
        .await?
        .new;
    let signing_secret = services::rotate_secret(producer_db, name, Duration::ZERO, true)
        .await?
        .new;
    println!("{name}: service {name} existed without a working token here; rotated its token and signing secret");
    store(
        own,
        name,
        Credentials {
            token,
            signing_secret,
        },
    )
    .await
}

async fn store(own: &PgPool, name: &str, creds: Credentials) -> Result<Credentials, BoxError> {
    sqlx::query(
        "insert into example_credentials (service, token, signing_secret) values ($1, $2, $3)
         on conflict (service) do update
         set token = excluded.token, signing_secret = excluded.signing_secret, stored_at = now()",
    )
    .bind(name)
    .bind(&creds.token)
    .bind(&creds.signing_secret)
    .execute(own)
    .await?;
    Ok(creds)
}
