//! The service hyper calls for each request: the router with
//! `ConnectInfo`, a request body that must arrive within its deadline
//! (`408` otherwise), and a response body that marks the request in flight
//! until it is written.

use std::convert::Infallible;
use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::ConnectInfo;
use axum::http::{header, HeaderValue, Request, Response, StatusCode};
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

use super::phase::{ConnState, RequestGuard};
use super::refuse::error_json;

type BoxError = Box<dyn StdError + Send + Sync>;

/// Hands each request to the router with `ConnectInfo`, a time-bounded
/// body, and phase tracking.
#[derive(Clone)]
pub(super) struct EdgeService {
    pub(super) app: Router,
    pub(super) peer: SocketAddr,
    pub(super) state: Arc<ConnState>,
    pub(super) body_read_timeout: Duration,
}

impl hyper::service::Service<Request<Incoming>> for EdgeService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let guard = self.state.begin_request();
        let timed_out = Arc::new(AtomicBool::new(false));
        let limit = self.body_read_timeout;
        let body_flag = timed_out.clone();
        let mut req = req.map(|incoming| {
            Body::new(TimedBody {
                inner: incoming,
                deadline: Instant::now() + limit,
                limit,
                sleep: None,
                timed_out: body_flag,
                finished: false,
            })
        });
        req.extensions_mut().insert(ConnectInfo(self.peer));
        let app = self.app.clone();
        Box::pin(async move {
            let response = match app.oneshot(req).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            // Whatever the handler made of the body error (axum's extractors
            // say 400), the truth is a timeout: say 408 and close.
            let response = if timed_out.load(Ordering::Acquire) {
                body_timeout_response(limit)
            } else {
                response
            };
            Ok(response.map(|body| {
                Body::new(TrackedBody {
                    inner: body,
                    _guard: guard,
                })
            }))
        })
    }
}

fn body_timeout_response(limit: Duration) -> Response<Body> {
    let message = format!("request body not received within {limit:?}");
    let mut response = Response::new(Body::from(error_json("request_timeout", &message)));
    *response.status_mut() = StatusCode::REQUEST_TIMEOUT;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The request body error after `body_read_timeout`.
#[derive(Debug)]
pub struct BodyTimeout(Duration);

impl fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request body not received within {:?}", self.0)
    }
}

impl StdError for BodyTimeout {}

/// hyper's request body, failing with [`BodyTimeout`] once the deadline
/// passes while the client is still sending. The timer is only created when
/// a read actually waits.
struct TimedBody {
    inner: Incoming,
    deadline: Instant,
    limit: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    timed_out: Arc<AtomicBool>,
    finished: bool,
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.finished {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                this.finished = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(frame)) => Poll::Ready(Some(frame.map_err(Into::into))),
            Poll::Pending => {
                let deadline = this.deadline;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if sleep.as_mut().poll(cx).is_ready() {
                    this.finished = true;
                    this.timed_out.store(true, Ordering::Release);
                    return Poll::Ready(Some(Err(Box::new(BodyTimeout(this.limit)))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The response body, carrying the `RequestGuard` until hyper drops it.
struct TrackedBody {
    inner: Body,
    _guard: RequestGuard,
}

impl HttpBody for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
