//! Servers on loopback: any router ([`Served`], [`serve`]), the watches
//! API alone ([`WatchesApi`]), and the API with the panel and the admin API
//! as `watchpump serve` serves them ([`AppServer`]), with the operator's
//! ways in (the admin token, a panel session).

use std::net::SocketAddr;

use axum::Router;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use watchpump::services::Service;

use super::db::TestDb;
use super::pump::pump_config;
use super::ADMIN_TOKEN;

/// An HTTP server on loopback until dropped.
pub struct Served {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

impl Served {
    /// Serves `app` on `listener` (bound beforehand when the app must know
    /// its own address).
    pub async fn start(listener: TcpListener, app: Router) -> Served {
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Served {
            addr,
            stop: Some(stop),
        }
    }

    /// Serves `app` on a free loopback port.
    pub async fn on_loopback(app: Router) -> Served {
        Served::start(loopback().await, app).await
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A listener on a free loopback port.
pub async fn loopback() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.unwrap()
}

/// Serves `app` on a free loopback port for as long as the test runs;
/// returns the address.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = loopback().await;
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// The one application state for `pump`, the panel and the admin API off
/// (so the address it is told, for the panel's URL, is of no use): what the
/// watches API alone is served with.
pub fn api_state(pool: &PgPool, pump: &watchpump::config::PumpConfig) -> watchpump::http::App {
    let operator = watchpump::operator::OperatorConfig::new();
    let unused: SocketAddr = "127.0.0.1:0".parse().unwrap();
    watchpump::http::App::new(pool.clone(), pump, &operator, unused)
}

/// The watches API alone (`watchpump::api::app`) on loopback, on a fresh
/// database with two consumer services registered, `deploy` and `docs`;
/// served for as long as the test runs. A test file adds the calls it makes
/// in an `impl WatchesApi` of its own.
pub struct WatchesApi {
    pub db: TestDb,
    pub base: String,
    pub http: reqwest::Client,
    pub deploy: Service,
    pub deploy_token: String,
    pub docs: Service,
    pub docs_token: String,
}

impl WatchesApi {
    pub async fn start() -> WatchesApi {
        let db = TestDb::new().await;
        let (deploy, deploy_token) = db.add_service("deploy", "http://127.0.0.1:9").await;
        let (docs, docs_token) = db.add_service("docs", "http://127.0.0.1:9").await;
        let app = watchpump::api::app(api_state(&db.pool, &pump_config()));
        let addr = serve(app).await;
        WatchesApi {
            db,
            base: format!("http://{addr}"),
            http: reqwest::Client::new(),
            deploy,
            deploy_token,
            docs,
            docs_token,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// Operator settings for tests: the admin token set, everything else default.
pub fn operator_config() -> watchpump::operator::OperatorConfig {
    let mut cfg = watchpump::operator::OperatorConfig::new();
    cfg.admin_token = Some(ADMIN_TOKEN.into());
    cfg
}

/// The API with the panel and the admin API, served on loopback as
/// `watchpump serve` serves them, until dropped.
pub struct AppServer {
    pub addr: SocketAddr,
    _server: Served,
}

impl AppServer {
    pub async fn start(pool: &PgPool, operator: &watchpump::operator::OperatorConfig) -> AppServer {
        let listener = loopback().await;
        let addr = listener.local_addr().unwrap();
        let state = watchpump::http::App::new(pool.clone(), &pump_config(), operator, addr);
        let app = watchpump::api::app(state.clone()).merge(watchpump::operator::router(state));
        AppServer {
            addr,
            _server: Served::start(listener, app).await,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Logs in to the panel over HTTP with the admin token; returns the
    /// `Cookie` header value of the session.
    pub async fn log_in(&self) -> String {
        let res = panel_client()
            .post(self.url("/panel/login"))
            .header("origin", self.origin())
            .form(&[("token", ADMIN_TOKEN)])
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 303, "log-in");
        let cookie = res.headers()["set-cookie"].to_str().unwrap();
        cookie.split(';').next().unwrap().to_string()
    }

    /// GETs `path` of the admin API with the admin token; asserts 200 and
    /// returns the body.
    pub async fn admin_get(&self, path: &str) -> String {
        let resp = reqwest::Client::new()
            .get(self.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        resp.text().await.unwrap()
    }

    /// GETs a panel page in a new session; asserts 200 and returns the page.
    pub async fn panel_get(&self, path: &str) -> String {
        let cookie = self.log_in().await;
        let resp = panel_client()
            .get(self.url(path))
            .header("cookie", cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        resp.text().await.unwrap()
    }
}

/// A client as a browser talks to the panel: redirects not followed, so
/// that a test sees each 303 and where it points.
pub fn panel_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Sends a request and reads its answer as JSON, whatever the status.
pub async fn json_of(request: reqwest::RequestBuilder) -> serde_json::Value {
    request.send().await.unwrap().json().await.unwrap()
}
