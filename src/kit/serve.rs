//! Serving the kit's endpoint: on watchpump's own hardened edge
//! ([`crate::edge`]), not on `axum::serve`.
//!
//! `axum::serve` gives hyper no timer and has no connection cap: an idle
//! connection, a header sent one line a minute or a body that never ends
//! stays open for as long as the client likes, and a few tens of thousands
//! of them exhaust the consumer's open files, so that the producer's genuine
//! delivery can no longer connect (issue 17: 19,985 idle connections, a
//! delivery timed out). [`serve`] bounds each of these with [`Limits`], the
//! same limits `watchpump serve` puts on its API.

use std::future::Future;
use std::io;

use axum::Router;
use tokio::net::TcpListener;

/// The kit's listener limits: header, body, idle and write timeouts, the
/// connection caps (the whole listener, and one client address) and the
/// head size. `Limits::default()` is what `watchpump serve` uses for its
/// API: 10 s headers, 30 s body, 60 s idle, 1024 connections, 128 per
/// address. The producer's pumps connect from their own addresses, so the
/// per-address cap keeps a flood from one host from taking their room.
pub use crate::edge::EdgeLimits as Limits;

/// Serves `app` (the [`Inbox`](super::Inbox)'s router, alone or merged into
/// the consumer's own) on `listener` within `limits` until `shutdown`
/// resolves; then stops accepting, lets requests in flight finish (at most
/// [`Limits::shutdown_grace`]) and returns.
///
/// A connection over a cap is answered `503` and closed; a head not complete
/// in time is closed without an answer; a body not complete in time gets
/// `408`. Handlers may extract `ConnectInfo<SocketAddr>`. The process's
/// soft open-file limit is raised to its hard limit first: the default
/// 1024 connections and the consumer's database pool do not fit in the
/// usual soft limit of 1024 descriptors.
///
/// Returns an error for invalid `limits` or a listener whose address cannot
/// be read; accept errors (such as running out of files) are logged and
/// retried, never fatal.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    // Logged by the function itself when it fails; serving goes on.
    let _ = crate::edge::raise_open_file_limit();
    crate::edge::serve(listener, app, limits, "kit", shutdown).await
}
