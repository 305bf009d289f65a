//! Registering and removing watches at the producer
//! (`POST`/`DELETE /api/v1/watches`, with the consumer's service token), and
//! recording each watch id in the inbox: the events endpoint takes
//! deliveries only for watches recorded here.
//!
//! The HTTP client is hyper-util's, which reqwest is built on: the kit makes
//! two kinds of calls, rarely, to one producer, and a consumer should not
//! compile reqwest's TLS stack for that. It speaks plain HTTP only, as the
//! producer's API does on the internal network (ADR 0021's calls are
//! service to service).

use std::time::Duration;

use axum::body::Bytes;
use axum::http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::db::inbox;
use crate::kit::error::{Error, Result};

/// How long one call to the producer may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read from the producer.
const MAX_ANSWER: usize = 64 * 1024;
/// How long one call waits, in all, for the producer's per-service limit
/// on self-service writes (a 429 with `Retry-After`) before it gives up
/// with the 429. A consumer that registers its watches at every start
/// registers more than the limit's burst (60 by default) a second apart,
/// rather than failing to start.
const MOST_WAITED_FOR_THE_LIMIT: Duration = Duration::from_secs(120);

/// What to follow: `POST /api/v1/watches`'s body.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WatchRequest {
    /// The consumer's own resource this watch acts for (an app, a site).
    pub resource: String,
    /// An exact object, or a prefix ending in `/`.
    pub object: String,
    pub filters: WatchFilters,
}

/// Which of the object's changes count; empty means all.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WatchFilters {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kinds: Option<Vec<String>>,
    /// A PostgreSQL jsonpath over the payload (see the producer's README).
    #[serde(rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_path: Option<String>,
}

impl WatchRequest {
    /// Every change of `object` (exact, or a prefix ending in `/`).
    pub fn new(resource: &str, object: &str) -> Self {
        WatchRequest {
            resource: resource.into(),
            object: object.into(),
            filters: WatchFilters::default(),
        }
    }

    /// Only changes of these kinds.
    pub fn kinds(mut self, kinds: &[&str]) -> Self {
        self.filters.kinds = Some(kinds.iter().map(|k| k.to_string()).collect());
        self
    }

    /// Only changes whose payload the jsonpath selects something in.
    pub fn matching(mut self, jsonpath: &str) -> Self {
        self.filters.match_path = Some(jsonpath.into());
        self
    }
}

/// A watch as the producer returned it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RegisteredWatch {
    pub id: i64,
    pub resource: String,
    pub object: String,
    pub filters: serde_json::Value,
}

/// The consumer's client for one producer's watches API.
#[derive(Clone)]
pub struct WatchClient {
    pool: PgPool,
    producer: String,
    api: String,
    token: String,
    http: Client<HttpConnector, Full<Bytes>>,
}

impl WatchClient {
    /// `api` is the producer's base URL (`http://127.0.0.1:8080`), `token`
    /// this consumer's service token there; watch ids are recorded in
    /// `pool`, the consumer's database, under the producer's `name`.
    pub fn new(pool: PgPool, name: &str, api: &str, token: &str) -> Result<Self> {
        if !api.starts_with("http://") {
            return Err(Error::Invalid(format!(
                "the producer's API {api:?} must be an http:// URL (the kit's client speaks plain HTTP)"
            )));
        }
        Ok(WatchClient {
            pool,
            producer: name.into(),
            api: api.trim_end_matches('/').into(),
            token: token.into(),
            http: Client::builder(TokioExecutor::new()).build_http(),
        })
    }

    /// Registers `watch` (the producer returns the existing watch when an
    /// identical one is live, so this is safe on every start) and records
    /// its id. Deliveries that arrive between the two steps are refused
    /// with 403 and retried by the producer.
    pub async fn register(&self, watch: &WatchRequest) -> Result<RegisteredWatch> {
        let body = serde_json::to_vec(watch).expect("a watch request serialises");
        let (status, answer) = self.call(Method::POST, "", Some(body)).await?;
        if !status.is_success() {
            return Err(refused(status, &answer));
        }
        let registered: RegisteredWatch =
            serde_json::from_slice(&answer).map_err(|e| self.garbled(&e))?;
        inbox::remember_watch(
            &self.pool,
            &self.producer,
            registered.id,
            &registered.resource,
            &registered.object,
            &registered.filters,
        )
        .await?;
        Ok(registered)
    }

    /// Removes watch `id` at the producer (one already gone there counts as
    /// removed) and here: later deliveries for it are answered 410.
    pub async fn remove(&self, id: i64) -> Result<()> {
        let (status, answer) = self.call(Method::DELETE, &format!("/{id}"), None).await?;
        if !(status.is_success() || status == StatusCode::NOT_FOUND) {
            return Err(refused(status, &answer));
        }
        inbox::forget_watch(&self.pool, &self.producer, id, "removed by this consumer").await?;
        Ok(())
    }

    /// One request to the watches API, sent again after the wait a 429
    /// names (both calls are safe to repeat: registering an identical watch
    /// returns it, removing one already gone counts as removed), up to
    /// [`MOST_WAITED_FOR_THE_LIMIT`] in all.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes)> {
        let mut waited = Duration::ZERO;
        loop {
            let (status, answer, retry_after) =
                self.exchange(method.clone(), path, body.clone()).await?;
            if status == StatusCode::TOO_MANY_REQUESTS {
                let wait = retry_after.unwrap_or(Duration::from_secs(1));
                if waited + wait <= MOST_WAITED_FOR_THE_LIMIT {
                    tokio::time::sleep(wait).await;
                    waited += wait;
                    continue;
                }
            }
            return Ok((status, answer));
        }
    }

    /// One request and its answer: the status, the body, and the wait a
    /// `Retry-After` of whole seconds asks for.
    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes, Option<Duration>)> {
        let url = format!("{}/api/v1/watches{path}", self.api);
        let request = Request::builder()
            .method(method)
            .uri(&url)
            .header(header::AUTHORIZATION, format!("Bearer {}", self.token))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| Error::Invalid(format!("{url}: {e}")))?;
        let http = |message: String| Error::Http {
            url: url.clone(),
            message,
        };
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| http(format!("{e}")))?;
            let status = response.status();
            let retry_after = response
                .headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(|secs| Duration::from_secs(secs.max(1)));
            let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| http(format!("reading the answer: {e}")))?;
            Ok((status, body.to_bytes(), retry_after))
        };
        tokio::time::timeout(TIMEOUT, exchange)
            .await
            .map_err(|_| http(format!("no answer within {TIMEOUT:?}")))?
    }

    fn garbled(&self, e: &serde_json::Error) -> Error {
        Error::Http {
            url: format!("{}/api/v1/watches", self.api),
            message: format!("the answer is not a watch: {e}"),
        }
    }
}

/// The producer's error, from its `{"error": {"message"}}` body.
fn refused(status: StatusCode, body: &[u8]) -> Error {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    Error::Refused {
        status: status.as_u16(),
        message,
    }
}

impl std::fmt::Debug for WatchClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchClient")
            .field("producer", &self.producer)
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_request_is_the_apis_json() {
        let w = WatchRequest::new("docs", "acme/web/refs/heads/")
            .kinds(&["push"])
            .matching("$.paths[*] ? (@ starts with \"docs/\")");
        assert_eq!(
            serde_json::to_value(&w).unwrap(),
            serde_json::json!({"resource": "docs", "object": "acme/web/refs/heads/",
                "filters": {"kinds": ["push"], "match": "$.paths[*] ? (@ starts with \"docs/\")"}})
        );
        assert_eq!(
            serde_json::to_value(WatchRequest::new("a", "b")).unwrap()["filters"],
            serde_json::json!({})
        );
    }

    #[test]
    fn the_producers_error_message_is_kept() {
        let e = refused(
            StatusCode::UNPROCESSABLE_ENTITY,
            br#"{"error":{"code":"invalid","message":"object must not start with '/'"}}"#,
        );
        assert_eq!(
            e.to_string(),
            "the producer's watches API answered 422: object must not start with '/'"
        );
    }
}
