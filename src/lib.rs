//! watchpump: a producer service's changes, delivered durably to the
//! consumer services that watch them (ADR 0021).
//!
//! A producer records a change with [`emit()`](fn@emit) inside its own PostgreSQL
//! transaction; the same transaction writes one delivery per matching watch.
//! The pump pushes each delivery to `POST <consumer>/api/v1/<producer>/events`,
//! retrying with back-off until the delivery's deadline, superseding older
//! news of the same object, and dropping a watch whose consumer answers 410.
//!
//! # Where a change goes
//!
//! For each kind of change, the files to open, in order (at most three;
//! `tests/map.rs` checks that every one exists), and what each holds.
//!
//! | to change | open | what each holds |
//! |---|---|---|
//! | a field of the delivery body | `src/delivery/mod.rs`, `sql/functions/0500_delivery.sql`, `docs/protocol.md` | the module doc's "Adding a field to the body" lists the steps: the field on [`delivery::Message`] and [`delivery::Body`] (whose order is the JSON's); its value in `claim()` and `message()`; the body as consumer teams read it (the kit's `Delivery` ignores a field it does not know) |
//! | an admin action | `src/resources/`, `src/db/operator.rs`, `sql/functions/0600_operator.sql` | the handler in its resource's `admin.rs` (deliveries, watches, services), mounted by that resource's `admin_routes()` and answering through [`caller`]'s `Admin`; the panel's form beside it in `panel.rs`; the statement it sends; the SQL function that does it, which psql and the panel call too. The route's description is its handler's `#[utoipa::path]` and doc comment, gathered by `api::openapi` and held to the routers by the openapi test |
//! | a consumer endpoint | `src/resources/`, `src/db/consumer.rs`, `src/api/openapi.rs` | the handler in its resource's `consumer.rs` (or `rate.rs`, `kinds.rs`), mounted by its `consumer_routes()`, with its `#[utoipa::path]` and doc comment; its answer a type that is its schema too, a list paged by [`http::page`]; what its writes may cost: [`api::limits`]; the statement it sends, to the consumer's room `0700_consumer.sql`; the handler listed in the description's `paths`, served at `GET /api/v1/openapi.json` |
//! | a metric | `src/metrics.rs`, `docs/metrics.md`, `src/pump/recording.rs` | its name, and the `# HELP` text it is described with; what it means, for operators (the metrics test fails on a metric exported and not documented there, or the reverse); where an attempt's outcome is recorded (the rest where their event happens; the backlog gauges: [`metrics::backlog`]) |
//! | the retry policy | `src/retry.rs`, `src/pump/health/mod.rs`, `sql/functions/0500_delivery.sql` | the rule and which function enforces each part: back-off, Retry-After, the deadline; a consumer that is down, and its probes; `complete()`, which retries, fails or supersedes an attempt's delivery at the deadline |
//! | a bound | `docs/security.md`, `src/config.rs`, `sql/functions/0050_settings.sql` | the Bounds table: a row per bound with its refusal, its metric and its test (most in the bounds test); a bound of `serve` is a flag; one of the database a column of `watchpump.settings`, read where it is used |
//! | supersession, the per-object order | `sql/functions/0500_delivery.sql`, `sql/functions/0300_settle.sql`, `sql/functions/0000_vocabulary.sql` | the order rule at its top; `supersede_older()`, the one function every path calls; "newer" is `is_newer()`. Watch removal is `remove_watch()` in `0400_registry.sql` |
//! | an error at the HTTP edge | `src/http/error.rs`, `src/http/bearer.rs` | [`http::HttpError`]: one status per variant, as JSON or as a page; the bearer token, read there alone |
//!
//! # Layout
//!
//! - [`config`]: `serve`'s flags and environment, the pump's knobs and their
//!   checks (`--help` documents each knob).
//! - [`db`]: the one seam between Rust and SQL: every statement is a named
//!   function in the file of the SQL room it calls (`src/db/<room>.rs`),
//!   compile-checked against the checked-in `.sqlx/`.
//! - [`schema`]: applies `sql/migrations/*.sql` once and `sql/functions/*.sql`
//!   every time ([`sql_files`], which the kit's inbox uses too); the durable
//!   logic (emit, claim, complete, sweep) is SQL there, one room per file on
//!   floors that only call downward (the map: the top of
//!   `sql/functions/0000_vocabulary.sql`).
//! - [`emit()`](emit::emit): the producer's call, in the producer's
//!   transaction; [`emit::emit_many`] records a batch in one statement.
//! - [`kinds`]: the catalogue of the kinds of change the producer emits,
//!   each with a JSON Schema and an example, and strict mode, which makes
//!   `emit()` refuse what the catalogue does not declare.
//! - [`services`]: the registry of consumer services and their hashed tokens;
//!   [`destinations`]: where their base URLs may point, and how their
//!   host names are resolved.
//! - [`signing`]: Standard Webhooks signatures on every delivery, and their
//!   verification for consumers.
//! - [`delivery`]: a delivery as its consumer receives it (message, body,
//!   URL, signed headers), what an attempt came to, and the states a
//!   delivery goes through ([`delivery::State`]), for the pump that sends
//!   it and the panel that shows it.
//! - [`retry`]: when a failed delivery or warning is tried again, and how a
//!   consumer that is down is probed.
//! - [`redact`]: the one function that masks tokens and other credentials
//!   before an answer is stored and before anything is shown.
//! - [`pump`]: the delivery engine. [`pump::Pump::run`] is the loop:
//!   wake-ups ([`pump::wakeup`]: NOTIFY and sweep), claims
//!   ([`pump::store`]), per-consumer health ([`pump::health`]), HTTP sends
//!   ([`pump::send`]) and the batched write-back of outcomes;
//!   [`pump::Pump::step`] is one turn of it, for tests to drive.
//!   [`pump::fence`]: a pump sends only while its lease covers the request.
//! - [`leader`]: which periodic jobs run once per database, and how a
//!   leader is chosen and replaced (advisory locks, keepalives).
//! - [`http`]: what the HTTP front ends share: the one application state
//!   every router of the listener takes ([`http::App`]: pool, reads,
//!   throttle, settings, each held once), the one error type, the bearer
//!   parser, request text checks, the panel's HTML blocks.
//! - [`resources`]: the HTTP surface by resource (deliveries, watches,
//!   services, rate, kinds), each with its handlers and routes for every
//!   audience; [`caller`]: who is calling, the three doors side by side
//!   (a service's token, the admin token, a panel session), one extractor
//!   each for the handlers to take.
//! - [`api`]: the watches API consumers call (axum): its router, mounting
//!   each resource's consumer routes, and the OpenAPI description;
//!   [`api::limits`]: what one service's self-service writes may cost (a
//!   token bucket per service, and the bounds on what the writes queue).
//! - [`watches`]: what a watch may be: names, the safe jsonpath subset its
//!   filter must be in ([`watches::filter`]), what a service's filters on
//!   one object may cost ([`watches::cap`]), what every service's watches
//!   covering one object may cost `emit()` and each service's share of it
//!   ([`watches::fanout`]), pauses and resyncs ([`watches::pause`],
//!   [`watches::resync`]), and `migrate`'s report of older filters
//!   ([`watches::audit`]).
//! - [`operator`]: the operator's side: the routers of the panel
//!   (`/panel`) and the admin API (`/api/v1/admin`), warnings to notify
//!   about failed deliveries, and
//!   pruning; its SQL views and retry functions work from psql too.
//! - [`telemetry`]: OpenTelemetry traces: the W3C trace context a change
//!   carries from the producer's span to each attempt and on to the
//!   consumer, the OTLP exporter (on only when an `OTEL_EXPORTER_OTLP_*`
//!   endpoint is set) and the trace id in JSON logs.
//! - [`metrics`]: Prometheus metric names and the exporter;
//!   [`metrics::backlog`] reads the backlog gauges from the database, one
//!   pump at a time.
//! - [`replica`]: the listing pages and the backlog gauges read on a
//!   standby (`WATCHPUMP_READ_DATABASE_URL`), and how far behind it is.
//! - [`edge`]: the HTTP listeners' defences: connection caps, header, body,
//!   idle and write timeouts, the open-file limit and its budget.
//! - [`throttle`]: failed authentications per client address (admin
//!   token, panel log-in, service tokens), 429 once they are used up.
//! - [`server`]: `watchpump serve`: pool, migrations, pump, API, shutdown;
//!   [`pooler`]: what works through a connection pooler, and the check at
//!   start that refuses transaction pooling for `serve` itself.
//! - [`cli`]: the `watchpump` command, each group of subcommands' grammar
//!   beside what runs it; `src/cli/consumer.rs`: its forms of the
//!   consumer's own calls (deliveries, pause, resume).
//! - [`kit`]: the consumer's side, for services that receive deliveries:
//!   the events endpoint, an inbox in the consumer's own database, and a
//!   client for registering watches. Built alone with
//!   `--no-default-features --features kit`.
//!
//! # Features
//!
//! `producer` (default) builds everything above; `kit` builds only
//! [`kit`], [`edge`] (without its `serve` settings), [`signing`],
//! [`delivery`], [`http`], [`sql_files`] and [`error`], without the pump's
//! dependencies (reqwest, clap, metrics).

/// Declares each item under one feature, so that a list of modules says
/// its feature once (as tokio's `cfg_rt!` does): `with_feature! { "kit":
/// pub mod http; pub mod kit; }`.
macro_rules! with_feature {
    ($feature:literal: $($item:item)*) => {
        $( #[cfg(feature = $feature)] $item )*
    };
}

pub mod delivery;
pub mod signing;

with_feature! { "kit":
    pub mod db;
    pub mod edge;
    pub mod error;
    pub mod http;
    pub mod kit;
    pub mod sql_files;
    pub mod telemetry;
}

with_feature! { "producer":
    pub mod api;
    pub mod caller;
    pub mod cli;
    pub mod config;
    pub mod destinations;
    pub mod emit;
    pub mod kinds;
    pub mod leader;
    pub mod metrics;
    pub mod operator;
    pub mod pooler;
    pub mod pump;
    pub mod redact;
    pub mod replica;
    pub mod resources;
    pub mod retry;
    pub mod schema;
    pub mod server;
    pub mod services;
    pub mod throttle;
    pub mod watches;
}

#[cfg(feature = "producer")]
pub use emit::emit;
#[cfg(feature = "kit")]
pub use error::{Error, Result};
