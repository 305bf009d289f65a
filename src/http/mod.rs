//! What the HTTP front ends share, below their routes: the one error type
//! every handler answers with, as JSON (the watches API, the admin API) or
//! as a page (the panel) ([`error`]); the one reading of `Authorization:
//! Bearer` ([`bearer()`](fn@bearer)); request text PostgreSQL cannot take ([`text`]);
//! and the HTML building blocks of the panel's pages ([`html`]).
//!
//! [`crate::edge`] is the layer below: connections, timeouts and caps,
//! before a request reaches a router.

pub mod bearer;
#[cfg(feature = "producer")]
pub mod error;
#[cfg(feature = "producer")]
pub mod html;
#[cfg(feature = "producer")]
pub mod text;

pub use bearer::bearer;
#[cfg(feature = "producer")]
pub use error::{AsHtml, HttpError};
