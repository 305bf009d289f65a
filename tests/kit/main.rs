//! The consumer kit (`watchpump::kit`) against a real PostgreSQL (the
//! consumer's inbox in a database of its own) and the real pump, over real
//! HTTP on loopback: what it takes and how often its work runs
//! ([`delivery`]), what it refuses and that a refusal changes nothing
//! ([`forgery`]), two requests of one object at once ([`overlap`]), `kit::serve`'s limits and logs ([`edge`]), and the three example consumers end to end
//! ([`examples`]).
//!
//! Run with `WATCHPUMP_TEST_DATABASE_URL=<cluster> cargo nextest run --test kit`
//! (`make test` runs it with the rest).

#[path = "../common/mod.rs"]
mod common;
#[path = "../../examples/consumers/mod.rs"]
mod consumers;

mod delivery;
mod edge;
mod examples;
mod forgery;
mod overlap;
mod support;
