//! The chaos suite: several pump processes on one database while pumps are
//! SIGKILLed and restarted, their LISTEN connections terminated, PostgreSQL
//! restarted, consumers answer 2xx, 410 and 500, hang past the request
//! timeout or refuse connections, and producers commit and roll back.
//! Afterwards the consumers turn healthy, the pumps drain the queue and are
//! stopped with SIGTERM, and the run is judged from what the consumers
//! recorded and from the database ([`verdict`]).
//!
//! `make test` runs a short form (a few seconds); `make chaos` the full one
//! (`make chaos CHANGES=100000` for a longer run). Every run prints one
//! summary line and fails on any violation. The cluster is a project-local
//! one of its own (`target/pg-chaos`), because the suite restarts it.
//!
//! `make chaos FAULTS=failover` replaces the restarts with three switches
//! of the primary in a Patroni cluster: two PostgreSQL nodes under Patroni
//! agents, etcd, and HAProxy asking the agents which node is the primary
//! ([`patroni`]). Under load, the suite asks for a switchover, crashes the
//! primary's machine, and cuts the primary's agent off from etcd
//! ([`switches`]); Patroni promotes the standby each time, and rewinds the
//! old primary into the new standby once it is back. With Patroni's
//! `synchronous_mode` (`SYNC=on`, the default) nothing committed may be
//! lost; without it (`SYNC=off`) the commits lost in the crash are counted.
//!
//! Settings (environment, all optional): `WATCHPUMP_CHAOS_CHANGES` (producer
//! transactions), `WATCHPUMP_CHAOS_SEED`, `WATCHPUMP_CHAOS_PG_PORT`,
//! `WATCHPUMP_CHAOS_FAULTS` (`failover`), `WATCHPUMP_CHAOS_SYNC` (`on`, `off`).

mod cluster;
mod consumers;
mod daemon;
mod net;
mod patroni;
mod producers;
mod pumps;
mod retention;
mod switches;
mod verdict;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use chrono::{DateTime, Utc};
use cluster::Cluster;
use consumers::{Behaviour, Consumers};
use net::Net;
use patroni::PatroniCluster;
use producers::Ledger;
use pumps::Pumps;
use verdict::WatchDef;

/// What is done to PostgreSQL besides pump kills and listener kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Faults {
    /// Fast restarts of one cluster.
    Restarts,
    /// A switchover, a crash and a partition of the primary in a Patroni
    /// cluster of two nodes (Patroni's `synchronous_mode` or not).
    Failover { synchronous: bool },
    /// Restarts, and each pump a host of its own (a loopback source
    /// address and a database port of its own: tests/chaos/net.rs), cut off from the database or from its consumers now and then.
    Partition,
}

impl Faults {
    fn from_env() -> Faults {
        let faults = std::env::var("WATCHPUMP_CHAOS_FAULTS").unwrap_or_default();
        match faults.trim() {
            "" | "restarts" => Faults::Restarts,
            "partition" => Faults::Partition,
            "failover" => Faults::Failover {
                synchronous: std::env::var("WATCHPUMP_CHAOS_SYNC").as_deref() != Ok("off"),
            },
            other => panic!(
                "WATCHPUMP_CHAOS_FAULTS={other:?}: use failover or partition (or leave it unset)"
            ),
        }
    }
}

/// How one run is shaped.
#[derive(Debug, Clone)]
pub struct Settings {
    pub faults: Faults,
    /// Producer transactions, committed or rolled back.
    pub transactions: usize,
    pub producers: usize,
    pub pumps: usize,
    /// Repositories × objects per repository: the objects producers change.
    pub repos: usize,
    pub objects_per_repo: usize,
    pub rollback_ratio: f64,
    /// Pause between pump kills, drawn uniformly from this range.
    pub kill_every: (Duration, Duration),
    pub listener_kill_every: (Duration, Duration),
    /// Fractions of the transactions after which PostgreSQL is restarted.
    pub pg_restarts_at: Vec<f64>,
    pub seed: u64,
    /// The pumps' request timeout; a consumer that hangs waits longer.
    pub request_timeout: Duration,
    pub lease: Duration,
    /// How long the pumps get to drain the queue once consumers are healthy.
    pub settle_limit: Duration,
    /// Failover: how long the primary's WAL sender is frozen before the
    /// crash of the primary (what an asynchronous standby then loses, and
    /// what a synchronous one makes producers wait for).
    pub standby_lag: Duration,
}

impl Settings {
    fn full() -> Settings {
        let transactions = env_number("WATCHPUMP_CHAOS_CHANGES").unwrap_or(20_000) as usize;
        let faults = Faults::from_env();
        Settings {
            faults,
            transactions,
            producers: 6,
            pumps: 3,
            repos: 10,
            objects_per_repo: 20,
            rollback_ratio: 0.08,
            kill_every: (Duration::from_millis(1500), Duration::from_millis(4000)),
            listener_kill_every: (Duration::from_millis(1000), Duration::from_millis(3000)),
            pg_restarts_at: if matches!(faults, Faults::Failover { .. }) {
                vec![]
            } else if transactions >= 50_000 {
                vec![0.3, 0.7]
            } else {
                vec![0.5]
            },
            seed: env_number("WATCHPUMP_CHAOS_SEED").unwrap_or_else(rand::random),
            request_timeout: Duration::from_millis(1000),
            lease: Duration::from_millis(2500),
            settle_limit: Duration::from_secs(120),
            standby_lag: Duration::from_millis(
                env_number("WATCHPUMP_CHAOS_STANDBY_LAG_MS").unwrap_or(1000),
            ),
        }
    }

    fn short() -> Settings {
        Settings {
            faults: Faults::Restarts,
            transactions: 1000,
            kill_every: (Duration::from_millis(500), Duration::from_millis(1200)),
            listener_kill_every: (Duration::from_millis(400), Duration::from_millis(1000)),
            pg_restarts_at: vec![0.5],
            ..Settings::full()
        }
    }
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn a_short_chaos_run_loses_nothing_and_keeps_every_object_in_order() {
    run(Settings::short());
}

/// The failover fault in short (`make chaos FAULTS=failover` in full): a
/// Patroni cluster in `synchronous_mode` switched over, crashed and cut off
/// from etcd under load, each time the old primary rewound into the new
/// standby by Patroni. Nothing committed may be lost.
#[test]
fn a_short_failover_run_loses_nothing_committed_and_keeps_every_object_in_order() {
    if needs_root("the failover fault (PostgreSQL runs as the postgres user, nftables cuts etcd)") {
        return;
    }
    run(Settings {
        faults: Faults::Failover { synchronous: true },
        pg_restarts_at: vec![],
        ..Settings::short()
    });
}

/// The partition fault in short (`make chaos FAULTS=partition` in full):
/// hosts cut off from the database or from their consumers while requests
/// are on the wire. No PostgreSQL restart here: the plain short run above
/// restarts the same cluster.
#[test]
fn a_short_partition_run_loses_nothing_and_never_overlaps() {
    if needs_root("the partition fault (nftables rules on lo)") {
        return;
    }
    run(Settings {
        faults: Faults::Partition,
        pg_restarts_at: vec![],
        ..Settings::short()
    });
}

/// The fault modes drive nftables and run PostgreSQL as its own user, which
/// needs root (CI and `make chaos` run as root). Elsewhere the test says
/// so and passes: it cannot set its faults up.
fn needs_root(what: &str) -> bool {
    let uid = std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    if uid == "0" {
        return false;
    }
    eprintln!("skipped: {what} needs root; run `make test` as root");
    true
}

/// `make chaos` (and `make chaos CHANGES=100000`).
#[test]
#[ignore = "long; run by `make chaos`"]
fn chaos() {
    run(Settings::full());
}

/// One run at a time in this process, too (`cargo test` runs a binary's
/// tests on threads; nextest's test group does the same across processes).
static ONE_RUN_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(settings: Settings) {
    let _one = ONE_RUN_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let summary = runtime.block_on(run_async(settings));
    println!("{}", summary.line());
    assert!(
        summary.violations.is_empty(),
        "chaos found {} violations; the first ones:\n{}",
        summary.violations.len(),
        summary
            .violations
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Everything the run counted, for the summary line.
#[derive(Debug)]
pub struct Summary {
    pub faults: Faults,
    pub standby_lag: Duration,
    pub seed: u64,
    pub transactions: usize,
    pub committed_changes: usize,
    pub rolled_back_changes: usize,
    pub in_doubt: usize,
    pub deliveries: i64,
    pub requests: usize,
    pub kills: usize,
    pub graceful_stops: usize,
    pub listener_kills: usize,
    pub pg_restarts: usize,
    pub failovers: Vec<Failover>,
    /// Failover: how many switches the run was to make.
    pub switches_planned: usize,
    /// Failover: committed changes lost, requests of changes lost, overlaps
    /// excused by an asynchronous failover ([`verdict::Judged`]).
    pub lost: usize,
    pub sent_then_lost: usize,
    pub overlaps_across_async_failover: usize,
    /// Failover: the lost changes' acknowledgements, seconds after the
    /// standby froze (earliest, latest).
    pub lost_window: Option<(f64, f64)>,
    /// Delivery ids, and (watch, object, sequence)s, that reached consumers
    /// for two different changes ([`verdict::Judged`]).
    pub reused: (usize, usize),
    /// Partition: times a host was cut off from the database, and from its
    /// consumers.
    pub partitions: (usize, usize),
    /// Pauses, resumes and resyncs, and the replayed requests received.
    pub self_service: SelfService,
    pub replays: usize,
    /// The rate-limited service's busiest second of requests.
    pub rated_busiest: usize,
    /// Old days made and retired beside the chaos.
    pub retention: retention::Retention,
    pub duplicates: usize,
    pub seconds: f64,
    /// Seconds producing (under chaos), settling, and stopping the pumps.
    pub phases: (f64, f64, f64),
    pub violations: Vec<String>,
}

/// One switch of the primary: what moved it, when the front reached the
/// new primary, how long that took from the fault, how long the old
/// primary took to stream again, and the first delivery of a change
/// emitted after the switch.
#[derive(Debug, Clone)]
pub struct Failover {
    pub kind: switches::Kind,
    pub from: &'static str,
    pub to: &'static str,
    /// When the fault began (a crash: when the primary's WAL sender froze).
    pub began: DateTime<Utc>,
    pub promoted_at: DateTime<Utc>,
    pub took: Duration,
    pub rebuilt_in: Duration,
    pub first_delivery_after: Option<f64>,
}

impl Summary {
    fn line(&self) -> String {
        let mut line = self.base_line();
        let s = &self.self_service;
        line.push_str(&format!(
            "; consumers: {} watch pauses, {} service pauses, {} resumes ({} found still paused at the end), {} resyncs ({} replays queued, {} replayed requests)",
            s.watch_pauses, s.service_pauses, s.resumes, s.found_paused, s.resyncs, s.replays_queued, self.replays
        ));
        line.push_str(&format!(
            "; rate: at most {} requests in a second to the service limited to {}",
            self.rated_busiest,
            verdict::RATE
        ));
        let r = &self.retention;
        line.push_str(&format!(
            "; retention: {} old days made, {} retired here, {} prune calls ({} failed)",
            r.days.len(),
            r.retired,
            r.prune_calls,
            r.prune_errors
        ));
        if self.faults == Faults::Partition {
            line.push_str(&format!(
                "; partitions: {} hosts cut off from the database, {} from their consumers",
                self.partitions.0, self.partitions.1
            ));
        }
        if let Faults::Failover { synchronous } = self.faults {
            let each: Vec<String> = self
                .failovers
                .iter()
                .map(|f| {
                    format!(
                        "{} {}->{}: switched in {:.1} s, first delivery {} s after, rebuilt in {:.1} s",
                        f.kind.name(),
                        f.from,
                        f.to,
                        f.took.as_secs_f64(),
                        f.first_delivery_after
                            .map_or("-".to_string(), |s| format!("{s:.2}")),
                        f.rebuilt_in.as_secs_f64()
                    )
                })
                .collect();
            line.push_str(&format!(
                "; failover (Patroni, {}, standby {} ms behind at the crash): {} of {} switches [{}]; {} committed changes lost{}, {} requests of lost changes, {} overlaps across an asynchronous failover; {} delivery ids and {} (watch, object, sequence) reached consumers for two changes",
                if synchronous { "synchronous_mode" } else { "asynchronous" },
                self.standby_lag.as_millis(),
                self.failovers.len(),
                self.switches_planned,
                each.join("; "),
                self.lost,
                self.lost_window.map_or(String::new(), |(lo, hi)| format!(
                    " (acknowledged {lo:.2} to {hi:.2} s after the standby froze)"
                )),
                self.sent_then_lost,
                self.overlaps_across_async_failover,
                self.reused.0,
                self.reused.1
            ));
        }
        line
    }

    fn base_line(&self) -> String {
        format!(
            "chaos: seed {}, {} transactions ({} changes committed, {} rolled back, {} in doubt) in {:.1} s \
             ({:.1} s of chaos, {:.1} s to settle, {:.1} s to stop); \
             {} deliveries, {} requests; {} pump kills, {} graceful stops, {} listener kills, {} PostgreSQL restarts; \
             {} duplicates after kills; {} violations",
            self.seed,
            self.transactions,
            self.committed_changes,
            self.rolled_back_changes,
            self.in_doubt,
            self.seconds,
            self.phases.0,
            self.phases.1,
            self.phases.2,
            self.deliveries,
            self.requests,
            self.kills,
            self.graceful_stops,
            self.listener_kills,
            self.pg_restarts,
            self.duplicates,
            self.violations.len()
        )
    }
}

async fn run_async(settings: Settings) -> Summary {
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(settings.seed);
    // The key the pumps seal and open signing secrets with; they inherit it.
    if std::env::var_os("WATCHPUMP_SECRET_KEY").is_none() {
        std::env::set_var(
            "WATCHPUMP_SECRET_KEY",
            "Y2hhb3MgdGVzdHMgb25seTogYSBmaXhlZCBzZWNyZXQ=",
        );
    }
    let ha = match settings.faults {
        Faults::Failover { synchronous } => Some(Arc::new(PatroniCluster::start(synchronous))),
        Faults::Restarts | Faults::Partition => None,
    };
    let cluster = match &ha {
        Some(ha) => ha.front.clone(),
        None => Cluster::start(),
    };
    // A database of this run's own: a short run in `make test` and a long
    // `make chaos` may share the cluster (though not its restarts).
    let database = format!("chaos_{}", std::process::id());
    let url = cluster.fresh_database(&database).await;
    let pool = watchpump::server::connect(&url, settings.producers as u32 + 4)
        .await
        .expect("connect to the chaos database");
    watchpump::schema::migrate(&pool).await.unwrap();

    let net = (settings.faults == Faults::Partition)
        .then(|| Arc::new(Net::up(settings.pumps, cluster.port())));
    let consumers = Consumers::start(
        &[
            Behaviour::Healthy,
            Behaviour::Flaky,
            Behaviour::Gone,
            Behaviour::Hangs,
            Behaviour::Flaps,
            Behaviour::Mixed,
            Behaviour::Slow,
        ],
        settings.request_timeout,
        settings.seed,
    )
    .await;
    let watches = register(&pool, &consumers, &settings, &mut rng).await;

    // The pumps' way to the database: with the partition fault, each
    // host's own front port, and its own source address for deliveries.
    let hosts = match &net {
        Some(net) => net
            .hosts
            .iter()
            .map(|h| pumps::Host {
                url: url.replacen(
                    &format!("127.0.0.1:{}", cluster.port()),
                    &format!("127.0.0.1:{}", h.front_port),
                    1,
                ),
                source: Some(h.source.clone()),
            })
            .collect(),
        None => Vec::new(),
    };
    let pumps = Arc::new(tokio::sync::Mutex::new(Pumps::new(&url, &settings, hosts)));
    pumps.lock().await.start(settings.pumps);

    // The chaos, until the producers are done.
    let done = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(AtomicUsize::new(0));
    let killer = tokio::spawn(kill_pumps(
        pumps.clone(),
        settings.clone(),
        rng.gen(),
        done.clone(),
    ));
    let listener_killer = tokio::spawn(kill_listeners(
        pool.clone(),
        settings.clone(),
        rng.gen(),
        done.clone(),
    ));
    let restarter = tokio::spawn(restart_postgres(
        cluster.clone(),
        pumps.clone(),
        settings.clone(),
        progress.clone(),
        done.clone(),
    ));
    let partitioning = net.clone().map(|net| {
        let ports: Vec<u16> = consumers.services.iter().map(|c| c.addr.port()).collect();
        tokio::spawn(partition_hosts(net, ports, rng.gen(), done.clone()))
    });
    // With the failover fault the producers go on past their transactions
    // until every switch has happened: each must happen under load.
    let pace = Arc::new(producers::Pace {
        more: AtomicBool::new(ha.is_some()),
        give_up: AtomicBool::new(false),
    });
    let failing_over = ha.clone().map(|ha| {
        tokio::spawn(switch_the_primary(
            ha,
            pumps.clone(),
            settings.clone(),
            progress.clone(),
            pace.clone(),
        ))
    });
    let self_service = tokio::spawn(consumers_help_themselves(
        pool.clone(),
        rng.gen(),
        done.clone(),
    ));
    let retiring = tokio::spawn(retention::run(pool.clone(), done.clone()));
    let ledger: Ledger = producers::run(&pool, &settings, progress.clone(), pace, rng.gen()).await;
    done.store(true, Ordering::SeqCst);
    // First: a switch that failed ends the run here (its panic), with the
    // cluster stopped, rather than after the other tasks' own waits for a
    // database that may not come back.
    let failovers = match failing_over {
        Some(task) => task.await.unwrap(),
        None => Vec::new(),
    };
    let self_service = self_service.await.unwrap();
    let mut retention = retiring.await.unwrap();
    let kills = killer.await.unwrap();
    let listener_kills = listener_killer.await.unwrap();
    let pg_restarts = restarter.await.unwrap();
    let partitions = match partitioning {
        Some(task) => task.await.unwrap(),
        None => (0, 0),
    };

    // Healthy consumers, a full set of pumps, and time to drain.
    consumers.heal();
    let mut summary = Summary {
        faults: settings.faults,
        standby_lag: settings.standby_lag,
        seed: settings.seed,
        transactions: ledger.transactions,
        listener_kills,
        pg_restarts,
        failovers,
        switches_planned: if ha.is_some() { SWITCHES.len() } else { 0 },
        committed_changes: 0,
        rolled_back_changes: 0,
        in_doubt: 0,
        deliveries: 0,
        requests: 0,
        kills: 0,
        graceful_stops: 0,
        duplicates: 0,
        seconds: 0.0,
        phases: (0.0, 0.0, 0.0),
        violations: Vec::new(),
        lost: 0,
        lost_window: None,
        reused: (0, 0),
        sent_then_lost: 0,
        overlaps_across_async_failover: 0,
        partitions,
        self_service,
        replays: 0,
        rated_busiest: 0,
        retention: retention::Retention::default(),
    };
    let mut pumps = Arc::try_unwrap(pumps)
        .unwrap_or_else(|_| panic!("the chaos tasks hold no pumps any more"))
        .into_inner();
    pumps.reap();
    pumps.top_up(settings.pumps);
    let produced = started.elapsed().as_secs_f64();
    if let Err(left) = verdict::settled(&pool, settings.settle_limit).await {
        summary.violations.push(left);
    }
    summary
        .violations
        .extend(retention::verdict(&pool, &mut retention, settings.settle_limit).await);
    summary.retention = retention;
    let settled = started.elapsed().as_secs_f64();
    summary.violations.extend(pumps.stop_all_gracefully().await);
    summary.phases = (
        produced,
        settled - produced,
        started.elapsed().as_secs_f64() - settled,
    );
    summary.kills = kills + pumps.kills;
    summary.graceful_stops = pumps.graceful_stops;
    summary.violations.extend(pumps.unexpected.iter().cloned());

    let ledger = ledger.resolve_in_doubt(&pool).await;
    summary.committed_changes = ledger.committed.len();
    summary.rolled_back_changes = ledger.rolled_back.len();
    summary.in_doubt = ledger.in_doubt_count;
    let (ledger, requests) = producers::disambiguate(&pool, ledger, consumers.requests()).await;
    summary.requests = requests.len();
    let failovers = verdict::Failovers {
        synchronous: match settings.faults {
            Faults::Failover { synchronous } => Some(synchronous),
            Faults::Restarts | Faults::Partition => None,
        },
        // Only a crash leaves a lagging standby behind: a switchover and a
        // demotion stop the old primary cleanly, after its WAL sender has
        // sent everything.
        lossy: summary
            .failovers
            .iter()
            .filter(|f| f.kind == switches::Kind::Crash)
            .map(|f| (f.began, f.promoted_at))
            .collect(),
    };
    let judged = verdict::judge(&pool, &ledger, &watches, &requests, &failovers).await;
    summary.deliveries = judged.deliveries;
    summary.duplicates = judged.duplicates;
    summary.lost = judged.lost;
    summary.sent_then_lost = judged.sent_then_lost;
    summary.overlaps_across_async_failover = judged.overlaps_across_async_failover;
    summary.lost_window = judged.lost_window;
    summary.reused = judged.reused;
    summary.replays = judged.replays;
    for f in &mut summary.failovers {
        f.first_delivery_after = first_delivery_after(f.promoted_at, &ledger, &requests);
    }
    summary.violations.extend(judged.violations);
    let (rated_busiest, too_fast) = verdict::rate_held(&watches, &requests);
    summary.rated_busiest = rated_busiest;
    summary.violations.extend(too_fast);
    if summary.failovers.len() < summary.switches_planned {
        summary.violations.push(format!(
            "only {} of {} switches of the primary happened",
            summary.failovers.len(),
            summary.switches_planned
        ));
    }
    summary.seconds = started.elapsed().as_secs_f64();
    pool.close().await;
    if summary.violations.is_empty() {
        cluster.drop_database(&database).await;
    } else {
        eprintln!("the run's database is kept for a look: {url}");
        // The Patroni cluster is stopped with the run; its files are kept.
        if let Some(ha) = &ha {
            ha.keep_for_a_look();
        }
    }
    summary
}

/// Registers one consumer service per behaviour and its watches: a prefix
/// watch on a repository each, `acme/` for two of them, and a few exact
/// objects (some following pushes only).
async fn register(
    pool: &sqlx::PgPool,
    consumers: &Consumers,
    settings: &Settings,
    rng: &mut StdRng,
) -> Vec<WatchDef> {
    let mut defs = Vec::new();
    for (i, consumer) in consumers.services.iter().enumerate() {
        let service = watchpump::services::add_within(
            pool,
            &format!("{}-{i}", consumer.behaviour.name()),
            &format!("http://{}", consumer.addr),
            &watchpump::destinations::Destinations::parse("127.0.0.0/8,::1").unwrap(),
        )
        .await
        .unwrap()
        .service;
        let mut wanted: Vec<(String, String, Option<Vec<String>>)> = vec![(
            format!("repo-{i}"),
            format!("acme/r{}/", rng.gen_range(0..settings.repos)),
            None,
        )];
        if i < 2 {
            wanted.push((format!("all-{i}"), "acme/".into(), None));
        }
        for n in 0..4 {
            let object = random_object(rng, settings);
            let kinds = (n % 2 == 0).then(|| vec!["push".to_string()]);
            let resource = if consumer.behaviour == Behaviour::Gone && n < 2 {
                format!("gone-{n}")
            } else {
                format!("app-{n}")
            };
            wanted.push((resource, object, kinds));
        }
        for (resource, object, kinds) in wanted {
            let new = watchpump::watches::NewWatch {
                resource: resource.clone(),
                object: object.clone(),
                filters: watchpump::watches::Filters {
                    kinds: kinds.clone(),
                    match_path: None,
                },
                resync: false,
            };
            let (watch, _) = watchpump::watches::create(pool, service.id, &new)
                .await
                .unwrap();
            defs.push(WatchDef {
                id: watch.id,
                object,
                kinds,
                rated: consumer.behaviour == Behaviour::Mixed,
            });
        }
        if consumer.behaviour == Behaviour::Mixed {
            watchpump::services::rate::set_max(pool, &service.name, Some(verdict::RATE))
                .await
                .unwrap();
        }
    }
    defs
}

pub fn random_object(rng: &mut impl Rng, settings: &Settings) -> String {
    format!(
        "acme/r{}/o{}",
        rng.gen_range(0..settings.repos),
        rng.gen_range(0..settings.objects_per_repo)
    )
}

fn pause_in(rng: &mut StdRng, range: (Duration, Duration)) -> Duration {
    let (low, high) = (range.0.as_millis() as u64, range.1.as_millis() as u64);
    Duration::from_millis(rng.gen_range(low..=high.max(low)))
}

/// What the consumers did for themselves under chaos (issue 20).
#[derive(Debug, Clone, Copy, Default)]
pub struct SelfService {
    pub watch_pauses: usize,
    pub service_pauses: usize,
    pub resumes: usize,
    pub resyncs: usize,
    /// Replays the resyncs queued.
    pub replays_queued: i64,
    /// Watches and services found paused at the end though the consumers
    /// had not paused them or had resumed them: a pause whose answer a
    /// crash cut off (in doubt, and committed), or a resume an
    /// asynchronous failover lost. Resumed then.
    pub found_paused: usize,
}

/// The consumers' own faults: now and then a watch or a whole service is
/// paused, one paused before is resumed, or a watch is resynced (to its
/// end, in batches, while everything else goes on). Calls that meet a
/// restarting PostgreSQL are tried again later. When the producers are
/// done, everything still paused is resumed (retried until it is).
async fn consumers_help_themselves(
    pool: sqlx::PgPool,
    seed: u64,
    done: Arc<AtomicBool>,
) -> SelfService {
    use watchpump::watches::{pause, resync};
    let mut rng = StdRng::seed_from_u64(seed);
    let mut did = SelfService::default();
    let mut paused_watches: Vec<(i64, i64)> = Vec::new();
    let mut paused_services: Vec<i64> = Vec::new();
    let watches: Vec<(i64, i64)> =
        sqlx::query_as("select service_id, id from watchpump.watches order by id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let services: Vec<i64> = {
        let mut s: Vec<i64> = watches.iter().map(|w| w.0).collect();
        s.dedup();
        s
    };
    while !done.load(Ordering::SeqCst) {
        tokio::time::sleep(pause_in(
            &mut rng,
            (Duration::from_millis(300), Duration::from_millis(1500)),
        ))
        .await;
        match rng.gen_range(0..10) {
            0..=2 => {
                let (service, watch) = watches[rng.gen_range(0..watches.len())];
                if pause::set_watch(&pool, service, watch, true).await.is_ok() {
                    did.watch_pauses += 1;
                    paused_watches.push((service, watch));
                }
            }
            3 => {
                let service = services[rng.gen_range(0..services.len())];
                if pause::set_service(&pool, service, true).await.is_ok() {
                    did.service_pauses += 1;
                    paused_services.push(service);
                }
            }
            4..=6 => {
                if let Some(i) =
                    (!paused_watches.is_empty()).then(|| rng.gen_range(0..paused_watches.len()))
                {
                    let (service, watch) = paused_watches[i];
                    if pause::set_watch(&pool, service, watch, false).await.is_ok() {
                        did.resumes += 1;
                        paused_watches.swap_remove(i);
                    }
                } else if let Some(service) = paused_services.pop() {
                    if pause::set_service(&pool, service, false).await.is_ok() {
                        did.resumes += 1;
                    } else {
                        paused_services.push(service);
                    }
                }
            }
            _ => {
                let (service, watch) = watches[rng.gen_range(0..watches.len())];
                if resync::start(&pool, service, watch, 10_000).await.is_ok() {
                    did.resyncs += 1;
                    if let Ok(d) = resync::run(&pool, watch, 10_000).await {
                        did.replays_queued += d.queued;
                    }
                }
            }
        }
    }
    // Everything resumed before the run settles (a watch the consumer
    // dropped with a 410 is no longer live: nothing to resume). Then, as a
    // consumer that sees nothing arrive would, whatever the database still
    // has paused: a pause whose answer a crash cut off may have committed,
    // and an asynchronous failover may lose an acknowledged resume.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut looked_again = false;
    loop {
        if paused_watches.is_empty() && paused_services.is_empty() {
            if looked_again {
                break;
            }
            let watches: Result<Vec<(i64, i64)>, _> = sqlx::query_as(
                "select service_id, id from watchpump.watches where paused_at is not null and removed_at is null",
            )
            .fetch_all(&pool)
            .await;
            let services: Result<Vec<i64>, _> = sqlx::query_scalar(
                "select id from watchpump.services where paused_at is not null and removed_at is null",
            )
            .fetch_all(&pool)
            .await;
            match (watches, services) {
                (Ok(watches), Ok(services)) => {
                    did.found_paused = watches.len() + services.len();
                    paused_watches = watches;
                    paused_services = services;
                    looked_again = true;
                }
                (Err(e), _) | (_, Err(e)) => {
                    assert!(Instant::now() < deadline, "cannot read the pauses: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            continue;
        }
        if let Some(&(service, watch)) = paused_watches.last() {
            match pause::set_watch(&pool, service, watch, false).await {
                Ok(_) | Err(watchpump::Error::NotFound(_)) => {
                    paused_watches.pop();
                    did.resumes += 1;
                }
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "cannot resume watch {watch}: {e}"
                ),
            }
        } else if let Some(&service) = paused_services.last() {
            match pause::set_service(&pool, service, false).await {
                Ok(_) => {
                    paused_services.pop();
                    did.resumes += 1;
                }
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "cannot resume service {service}: {e}"
                ),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    did
}

/// SIGKILLs a random pump now and then (one time in four a SIGTERM, which
/// must end in exit 0) and starts a replacement. Returns the kills.
async fn kill_pumps(
    pumps: Arc<tokio::sync::Mutex<Pumps>>,
    settings: Settings,
    seed: u64,
    done: Arc<AtomicBool>,
) -> usize {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut kills = 0;
    while !done.load(Ordering::SeqCst) {
        tokio::time::sleep(pause_in(&mut rng, settings.kill_every)).await;
        if done.load(Ordering::SeqCst) {
            break;
        }
        let mut pumps = pumps.lock().await;
        pumps.reap();
        if rng.gen_bool(0.25) {
            pumps.stop_one_gracefully(&mut rng).await;
        } else {
            pumps.kill_one(&mut rng);
            kills += 1;
        }
        pumps.top_up(settings.pumps);
    }
    kills
}

/// Terminates the pumps' LISTEN connections now and then. Returns how many.
async fn kill_listeners(
    pool: sqlx::PgPool,
    settings: Settings,
    seed: u64,
    done: Arc<AtomicBool>,
) -> usize {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut killed = 0;
    while !done.load(Ordering::SeqCst) {
        tokio::time::sleep(pause_in(&mut rng, settings.listener_kill_every)).await;
        let terminated: Result<Vec<bool>, _> = sqlx::query_scalar(
            "select pg_terminate_backend(pid) from pg_stat_activity
             where datname = current_database() and query ilike 'listen%' and pid <> pg_backend_pid()",
        )
        .fetch_all(&pool)
        .await;
        killed += terminated.map_or(0, |t| t.into_iter().filter(|ok| *ok).count());
    }
    killed
}

/// Restarts PostgreSQL (fast mode) as the producers pass each fraction of
/// their transactions. Pumps are not killed or started meanwhile.
async fn restart_postgres(
    cluster: Cluster,
    pumps: Arc<tokio::sync::Mutex<Pumps>>,
    settings: Settings,
    progress: Arc<AtomicUsize>,
    done: Arc<AtomicBool>,
) -> usize {
    let mut restarts = 0;
    let mut marks: Vec<usize> = settings
        .pg_restarts_at
        .iter()
        .map(|f| (f * settings.transactions as f64) as usize)
        .collect();
    marks.reverse();
    while let Some(&mark) = marks.last() {
        if done.load(Ordering::SeqCst) {
            break;
        }
        if progress.load(Ordering::SeqCst) >= mark {
            let _held = pumps.lock().await;
            let cluster = cluster.clone();
            tokio::task::spawn_blocking(move || cluster.restart())
                .await
                .unwrap();
            restarts += 1;
            marks.pop();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    restarts
}

/// The switches of the primary in a failover run, in order, and the
/// fraction of the transactions each waits for.
const SWITCHES: [(switches::Kind, f64); 3] = [
    (switches::Kind::Switchover, 0.2),
    (switches::Kind::Crash, 0.45),
    (switches::Kind::Partition, 0.7),
];

/// Moves the primary of the Patroni cluster ([`SWITCHES`]) as the
/// producers pass each mark, and brings the old primary back as the new
/// standby after each; a switch whose mark has passed waits for the
/// previous rebuild. Pumps are not killed or started while the primary is
/// being switched. Tells the producers they may stop after the last, and
/// to give up if a switch fails (panics).
async fn switch_the_primary(
    cluster: Arc<PatroniCluster>,
    pumps: Arc<tokio::sync::Mutex<Pumps>>,
    settings: Settings,
    progress: Arc<AtomicUsize>,
    pace: Arc<producers::Pace>,
) -> Vec<Failover> {
    // However this ends: a switch that fails panics, and the producers
    // must still stop (waiting for no database) for the run to end and its
    // cluster to be stopped.
    struct NoMore(Arc<producers::Pace>);
    impl Drop for NoMore {
        fn drop(&mut self) {
            if std::thread::panicking() {
                self.0.give_up.store(true, Ordering::SeqCst);
            }
            self.0.more.store(false, Ordering::SeqCst);
        }
    }
    let _no_more = NoMore(pace);
    let mut failovers = Vec::new();
    for (kind, fraction) in SWITCHES {
        let mark = (fraction * settings.transactions as f64) as usize;
        while progress.load(Ordering::SeqCst) < mark {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let held = pumps.lock().await;
        let c = cluster.clone();
        let lag = settings.standby_lag;
        let mut switched = tokio::task::spawn_blocking(move || switches::cause(&c, kind, lag))
            .await
            .unwrap();
        drop(held);
        let c = cluster.clone();
        let (switched, rebuilt_in) = tokio::task::spawn_blocking(move || {
            let took = switched.rebuild(&c);
            (switched, took)
        })
        .await
        .unwrap();
        failovers.push(Failover {
            kind,
            from: switched.from,
            to: switched.to,
            began: switched.began,
            promoted_at: switched.promoted_at,
            took: switched.took,
            rebuilt_in,
            first_delivery_after: None,
        });
    }
    failovers
}

/// Cuts hosts off, again and again until the producers are done: one from
/// the database (its requests on the wire must end within their leases,
/// and it must claim nothing until healed), another from its consumers
/// (keeping the database: its requests time out and are held), for 3-6 s
/// each, longer than a lease, at random moments, so that requests are on
/// the wire at every point of their leases. Returns the cuts of each kind.
async fn partition_hosts(
    net: Arc<Net>,
    consumer_ports: Vec<u16>,
    seed: u64,
    done: Arc<AtomicBool>,
) -> (usize, usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let hosts = net.hosts.len();
    let (mut from_db, mut from_consumers) = (0, 0);
    let mut round = 0;
    while !done.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(500..2500))).await;
        let (a, b) = (round % hosts, (round + 1) % hosts);
        round += 1;
        let hold = Duration::from_millis(rng.gen_range(3000..6000));
        let (n, ports) = (net.clone(), consumer_ports.clone());
        tokio::task::spawn_blocking(move || {
            n.cut_from_database(a);
            n.cut_from_consumers(b, &ports);
        })
        .await
        .unwrap();
        from_db += 1;
        from_consumers += 1;
        tokio::time::sleep(hold).await;
        let n = net.clone();
        tokio::task::spawn_blocking(move || {
            n.heal(a);
            n.heal(b);
        })
        .await
        .unwrap();
    }
    (from_db, from_consumers)
}

/// Seconds from `promoted_at` to the first 2xx answer to a change emitted
/// after it: the whole path again, producer to consumer.
fn first_delivery_after(
    promoted_at: DateTime<Utc>,
    ledger: &producers::Ledger,
    requests: &[consumers::Request],
) -> Option<f64> {
    let after: std::collections::HashSet<i64> = ledger
        .committed
        .iter()
        .filter(|c| c.at > promoted_at)
        .map(|c| c.id)
        .collect();
    requests
        .iter()
        .filter(|r| (200..300).contains(&r.status) && after.contains(&r.change_id))
        .map(|r| r.arrived)
        .min()
        .map(|at| (at - promoted_at).num_milliseconds() as f64 / 1000.0)
}

/// Requests per (watch, object), in the order they reached the consumer.
pub type ByStream<'a> = HashMap<(i64, String), Vec<&'a consumers::Request>>;
