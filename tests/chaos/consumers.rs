//! Consumer services on loopback, one listener each, with a behaviour each:
//! healthy, flaky (500s), gone (410 for some resources), hanging past the
//! pump's request timeout, flapping (refusing connections for a while), or a
//! mix. Every request is recorded with when it arrived and when it ended.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    Healthy,
    /// 500 three times in ten.
    Flaky,
    /// 410 now and then for resources named `gone-*`: their watch is dropped.
    Gone,
    /// Now and then answers only after the pump's request timeout.
    Hangs,
    /// Stops listening for a while, again and again.
    Flaps,
    /// A bit of everything.
    Mixed,
    /// Answers in 0.9-1.07 s, around the pump's 1 s request timeout: some
    /// answers come just after the pump gave up (issue 19's consumer).
    Slow,
}

impl Behaviour {
    pub fn name(self) -> &'static str {
        match self {
            Behaviour::Healthy => "healthy",
            Behaviour::Flaky => "flaky",
            Behaviour::Gone => "gone",
            Behaviour::Hangs => "hangs",
            Behaviour::Flaps => "flaps",
            Behaviour::Mixed => "mixed",
            Behaviour::Slow => "slow",
        }
    }
}

/// One request as the consumer saw it.
#[derive(Debug, Clone)]
pub struct Request {
    pub watch_id: i64,
    pub object: String,
    pub delivery_id: i64,
    pub change_id: i64,
    /// The payload's `key` (tests/chaos/producers.rs): the change the
    /// request is of, even where a failover made its id ambiguous.
    pub key: String,
    pub sequence: i64,
    pub attempt: i64,
    /// The answer, or 0 when the pump went away before it.
    pub status: u16,
    /// Wall clock, the same the pumps record attempts with.
    pub arrived: DateTime<Utc>,
    /// When the answer was sent or the handler was dropped; for a request
    /// that hung past the pump's request timeout, when the handler ended,
    /// after the pump gave up.
    pub ended: DateTime<Utc>,
    pub hung: bool,
    /// A resync's replay (`"replay": true` in the body).
    pub replay: bool,
}

struct Shared {
    behaviour: Behaviour,
    healthy: AtomicBool,
    request_timeout: Duration,
    rng: Mutex<StdRng>,
    log: Arc<Mutex<Vec<Request>>>,
}

pub struct ConsumerService {
    pub behaviour: Behaviour,
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

pub struct Consumers {
    pub services: Vec<ConsumerService>,
    log: Arc<Mutex<Vec<Request>>>,
}

impl Consumers {
    /// Consumers listening on loopback.
    pub async fn start(
        behaviours: &[Behaviour],
        request_timeout: Duration,
        seed: u64,
    ) -> Consumers {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut services = Vec::new();
        for (i, behaviour) in behaviours.iter().copied().enumerate() {
            let shared = Arc::new(Shared {
                behaviour,
                healthy: AtomicBool::new(false),
                request_timeout,
                rng: Mutex::new(StdRng::seed_from_u64(seed ^ ((i as u64 + 1) * 0x9e37_79b9))),
                log: log.clone(),
            });
            let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
                .await
                .unwrap();
            let addr = listener.local_addr().unwrap();
            let server = serve(listener, shared.clone());
            if behaviour == Behaviour::Flaps {
                tokio::spawn(flap(addr, server, shared.clone()));
            }
            services.push(ConsumerService {
                behaviour,
                addr,
                shared,
            });
        }
        Consumers { services, log }
    }

    /// From now on every consumer listens and answers 200 at once.
    pub fn heal(&self) {
        for s in &self.services {
            s.shared.healthy.store(true, Ordering::SeqCst);
        }
    }

    pub fn requests(&self) -> Vec<Request> {
        self.log.lock().unwrap().clone()
    }
}

fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) -> tokio::task::JoinHandle<()> {
    let app = Router::new()
        .route("/{*path}", post(receive))
        .with_state(shared);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    })
}

/// Refuses connections for 0.3-1.5 s every 1-3 s until healed: the server
/// task is aborted (open connections go with it) and started again later on
/// the same address.
async fn flap(addr: SocketAddr, mut server: tokio::task::JoinHandle<()>, shared: Arc<Shared>) {
    loop {
        let up = Duration::from_millis(shared.rng.lock().unwrap().gen_range(1000..3000));
        tokio::time::sleep(up).await;
        if shared.healthy.load(Ordering::SeqCst) {
            return;
        }
        server.abort();
        let down = Duration::from_millis(shared.rng.lock().unwrap().gen_range(300..1500));
        tokio::time::sleep(down).await;
        let listener = loop {
            match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => break l,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        server = serve(listener, shared.clone());
    }
}

/// What to do with one request.
enum Answer {
    Status(u16),
    /// Answer 200 after this long.
    After(Duration),
    /// Answer 200, but only after the pump's request timeout.
    Hang,
}

fn decide(shared: &Shared, resource: &str) -> Answer {
    if shared.healthy.load(Ordering::SeqCst) {
        return Answer::Status(200);
    }
    let mut rng = shared.rng.lock().unwrap();
    match shared.behaviour {
        Behaviour::Healthy | Behaviour::Flaps => Answer::Status(200),
        Behaviour::Flaky if rng.gen_bool(0.3) => Answer::Status(500),
        Behaviour::Flaky => Answer::Status(200),
        Behaviour::Gone if resource.starts_with("gone-") && rng.gen_bool(0.05) => {
            Answer::Status(410)
        }
        Behaviour::Gone => Answer::Status(200),
        Behaviour::Hangs if rng.gen_bool(0.05) => Answer::Hang,
        Behaviour::Hangs => Answer::Status(200),
        Behaviour::Slow => Answer::After(shared.request_timeout.mul_f64(rng.gen_range(0.9..1.07))),
        Behaviour::Mixed => match rng.gen_range(0..100) {
            0..=9 => Answer::Status(500),
            10..=11 => Answer::Hang,
            12 => Answer::Status(429),
            _ => Answer::Status(200),
        },
    }
}

/// Records the request when the handler ends, answered or dropped because
/// the pump closed the connection (a killed pump).
struct Recording {
    shared: Arc<Shared>,
    request: Option<Request>,
}

impl Drop for Recording {
    fn drop(&mut self) {
        if let Some(mut r) = self.request.take() {
            r.ended = Utc::now();
            self.shared.log.lock().unwrap().push(r);
        }
    }
}

async fn receive(State(shared): State<Arc<Shared>>, body: Bytes) -> StatusCode {
    let arrived = Utc::now();
    let Ok(d) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return StatusCode::BAD_REQUEST;
    };
    let field = |name: &str| d[name].as_i64().unwrap_or(-1);
    let answer = decide(&shared, d["resource"].as_str().unwrap_or(""));
    let mut recording = Recording {
        shared: shared.clone(),
        request: Some(Request {
            watch_id: field("watch_id"),
            object: d["object"].as_str().unwrap_or("").to_string(),
            delivery_id: field("delivery_id"),
            change_id: field("change_id"),
            key: d["payload"]["key"].as_str().unwrap_or("").to_string(),
            sequence: field("sequence"),
            attempt: field("attempt"),
            status: 0,
            arrived,
            ended: arrived,
            hung: false,
            replay: d["replay"] == true,
        }),
    };
    let status = match answer {
        Answer::Status(status) => status,
        Answer::After(wait) => {
            tokio::time::sleep(wait).await;
            if wait >= shared.request_timeout {
                // The pump has given up (hyper runs the handler to its
                // end): as far as it knows, no answer.
                let r = recording.request.as_mut().unwrap();
                r.hung = true;
                r.status = 0;
                return StatusCode::OK;
            }
            200
        }
        Answer::Hang => {
            recording.request.as_mut().unwrap().hung = true;
            tokio::time::sleep(shared.request_timeout + Duration::from_millis(300)).await;
            // The pump has given up by now: as far as it knows, no answer.
            recording.request.as_mut().unwrap().status = 0;
            return StatusCode::OK;
        }
    };
    if let Some(r) = recording.request.as_mut() {
        r.status = status;
    }
    drop(recording);
    StatusCode::from_u16(status).unwrap()
}
