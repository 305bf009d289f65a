//! What the HTTP front ends share, below their routes: the one error type
//! every handler answers with, as JSON (the watches API, the admin API) or
//! as a page (the panel) ([`error`]); the one reading of `Authorization:
//! Bearer` ([`bearer()`](fn@bearer)); request text PostgreSQL cannot take ([`text`]);
//! the HTML building blocks of the panel's pages ([`html`]); the request's
//! body, query and form as handlers take them ([`extract`]); one
//! convention for a page of a listing ([`page`]); and the
//! one application state every router of `serve`'s listener takes
//! ([`app`]).
//!
//! [`crate::edge`] is the layer below: connections, timeouts and caps,
//! before a request reaches a router.

pub mod bearer;

with_feature! { "producer":
    pub mod app;
    pub mod error;
    pub mod extract;
    pub mod html;
    pub mod page;
    pub mod text;
}

/// Largest request body the JSON APIs read, the consumer API's and the
/// admin API's alike.
pub const BODY_LIMIT: usize = 64 * 1024;

#[cfg(feature = "producer")]
pub use app::App;
pub use bearer::bearer;
#[cfg(feature = "producer")]
pub use error::{AsHtml, HttpError};
