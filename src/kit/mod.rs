//! The consumer kit: what a service that *receives* watchpump deliveries
//! needs, so that no consumer team hand-writes the contract of ADR 0021.
//!
//! A consumer implements one [`Handler`]: it gets each new delivery together
//! with an open transaction on the consumer's own PostgreSQL, does its work
//! in that transaction and returns [`Outcome::Done`] (commit, 2xx) or
//! [`Outcome::Gone`] (its resource is gone: roll back, 410, the producer
//! drops the watch); an error rolls back and answers 500, so the producer
//! retries. Everything around that is the kit's:
//!
//! - the producer's token and the Standard Webhooks signature are checked
//!   in constant time, with the timestamp tolerance and every secret the
//!   consumer knows (current and previous during a rotation), before any
//!   database work; a forged request changes nothing ([`verify`]);
//! - the delivery must name a watch this consumer registered (403 if not);
//! - [`serve()`](fn@serve) bounds what a client can hold: header, body and
//!   idle timeouts, connection caps; nothing a client sends before it is
//!   authenticated is logged raw (a path is logged escaped);
//! - the delivery is recorded in an inbox in the consumer's database, in the
//!   same transaction as the work: a second copy of a delivery, or news not
//!   newer than what was accepted for its (watch, object), answers 2xx
//!   without running the handler ([`inbox`], `sql/kit/`);
//! - [`WatchClient`] registers and removes watches at the producer and
//!   records their ids, which is how the kit knows which watches are ours.
//!
//! ```no_run
//! use watchpump::kit::{self, BoxError, Delivery, Handler, Inbox, Outcome, PgTransaction, Producer};
//!
//! struct Deploy;
//!
//! impl Handler for Deploy {
//!     async fn handle(&self, tx: &mut PgTransaction<'_>, d: &Delivery) -> Result<Outcome, BoxError> {
//!         sqlx::query("insert into deploys (app, commit) values ($1, $2)")
//!             .bind(&d.resource)
//!             .bind(d.payload["after"].as_str())
//!             .execute(&mut **tx)
//!             .await?;
//!         Ok(Outcome::Done)
//!     }
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::PgPool::connect("postgres://127.0.0.1/deploy").await?;
//! kit::migrate(&pool).await?;
//! let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse()?;
//! let git = Producer::new("git", "the producer's token", vec![secret]);
//! let app = Inbox::new(pool, Deploy).producer(git).router();
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9000").await?;
//! let ctrl_c = async { let _ = tokio::signal::ctrl_c().await; };
//! kit::serve(listener, app, kit::Limits::default(), ctrl_c).await?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! - [`delivery`]: what a handler receives and returns ([`Delivery`],
//!   [`Handler`], [`Outcome`]).
//! - [`verify`]: a producer's credentials ([`Producer`]) and the checks of
//!   the token and signature.
//! - [`inbox`]: the events endpoint ([`Inbox`]): verify, record, run the
//!   handler, answer.
//! - [`answer`]: the endpoint's answers and refusals, as JSON.
//! - [`serve`](mod@serve): [`serve()`](fn@serve) and its [`Limits`]: the
//!   endpoint on watchpump's hardened edge (timeouts, connection caps), not
//!   on `axum::serve`, which has neither.
//! - [`store`]: the calls into the inbox's SQL functions.
//! - [`watches`]: [`WatchClient`], for the producer's watches API.
//! - [`schema`]: [`migrate`], for the `watchpump_inbox` schema.
//! - [`error`]: the kit's error type ([`Error`]).

pub mod answer;
pub mod delivery;
pub mod error;
pub mod inbox;
pub mod schema;
pub mod serve;
pub mod store;
pub mod verify;
pub mod watches;

pub use delivery::{BoxError, Delivery, Handler, Outcome};
pub use error::{Error, Result};
pub use inbox::Inbox;
pub use schema::migrate;
pub use serve::{serve, Limits};
pub use store::{known_watches, prune, KnownWatch};
pub use verify::Producer;
pub use watches::{RegisteredWatch, WatchClient, WatchFilters, WatchRequest};

/// The transaction a [`Handler`] works in: the consumer's own database.
pub type PgTransaction<'c> = sqlx::Transaction<'c, sqlx::Postgres>;
