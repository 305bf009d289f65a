//! Host names of consumers, resolved by the pump (issue 17 item 5,
//! `destinations::Resolver`): one consumer's dead DNS holds neither the
//! others nor the process. The lookups are injected so that a name hangs
//! deterministically (a lookup that never answers, as a DNS server that
//! drops every query makes getaddrinfo do); everything else is real: the
//! pump, PostgreSQL, HTTP to a consumer on loopback.

mod common;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::json;
use watchpump::destinations::{Destinations, Lookup, Resolver, MAX_PENDING_LOOKUPS};

const WAIT: Duration = Duration::from_secs(30);

/// Names in `answers` resolve to their address; any other name hangs
/// forever. Counts the lookups of each name.
fn lookup(answers: &[(&str, &str)]) -> (Lookup, Arc<std::sync::Mutex<HashMap<String, usize>>>) {
    let answers: HashMap<String, IpAddr> = answers
        .iter()
        .map(|(n, ip)| (n.to_string(), ip.parse().unwrap()))
        .collect();
    let calls = Arc::new(std::sync::Mutex::new(HashMap::<String, usize>::new()));
    let counted = calls.clone();
    let lookup = Lookup::new(move |name: String| {
        *counted.lock().unwrap().entry(name.clone()).or_default() += 1;
        let answer = answers.get(&name).copied();
        async move {
            match answer {
                Some(ip) => Ok(vec![ip]),
                None => std::future::pending().await,
            }
        }
    });
    (lookup, calls)
}

#[tokio::test]
async fn a_name_whose_lookup_hangs_does_not_delay_a_healthy_consumer_named_by_another_host() {
    let db = TestDb::new().await;
    let healthy = Receiver::start().await;
    let port = healthy.addr.port();
    let names: Destinations = "127.0.0.0/8, healthy.test, dead.test".parse().unwrap();
    let mut services = Vec::new();
    for (name, host) in [("healthy", "healthy.test"), ("dead", "dead.test")] {
        let url = format!("http://{host}:{port}");
        let s = watchpump::services::add_within(&db.pool, name, &url, &names)
            .await
            .unwrap();
        for r in 0..20 {
            db.add_watch(s.service.id, &format!("r{r}"), "acme/", all())
                .await;
        }
        services.push(s.service.id);
    }
    let (lookup, calls) = lookup(&[("healthy.test", "127.0.0.1")]);
    let mut cfg = pump_config();
    cfg.allowed_destinations = Some(names);
    cfg.lookup_with = Some(lookup);
    let pump = RunningPump::start(&db.pool, cfg);
    for n in 0..5 {
        db.emit(&format!("acme/{n}"), "push", json!({ "n": n }))
            .await;
    }
    // 5 changes x 20 watches for the healthy consumer, while every one of
    // the dead consumer's 100 deliveries waits on a lookup that never ends.
    healthy.wait_for(100, WAIT).await;
    let failed_healthy: i64 = sqlx::query_scalar(
        "select count(*) from watchpump.attempts a
         join watchpump.deliveries d on d.id = a.delivery_id
         join watchpump.watches w on w.id = d.watch_id
         where w.service_id = $1 and a.error is not null",
    )
    .bind(services[0])
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        failed_healthy, 0,
        "the healthy consumer had failed attempts"
    );
    // The dead name's deliveries fail as timeouts, and its lookup ran once
    // however many deliveries waited on it (one flight, never restarted
    // while it hangs).
    eventually(
        WAIT,
        "the dead consumer's attempts are recorded",
        || async {
            let errors: Vec<Option<String>> = sqlx::query_scalar(
                "select a.error from watchpump.attempts a
             join watchpump.deliveries d on d.id = a.delivery_id
             join watchpump.watches w on w.id = d.watch_id
             where w.service_id = $1",
            )
            .bind(services[1])
            .fetch_all(&db.pool)
            .await
            .unwrap();
            !errors.is_empty()
                && errors
                    .iter()
                    .all(|e| e.as_deref().unwrap_or_default().contains("dead.test"))
        },
    )
    .await;
    pump.stop().await.unwrap();
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.get("dead.test"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("healthy.test"), Some(&1), "{calls:?}");
}

/// At the cap on lookups running at once: a new name fails at once with the
/// reason, a name already resolved keeps its answer, and a hanging name
/// never starts a second lookup.
#[tokio::test]
async fn past_the_cap_on_pending_lookups_a_new_name_fails_at_once_and_known_names_still_resolve() {
    let (lookup, calls) = lookup(&[("known.test", "127.0.0.1"), ("new.test", "127.0.0.2")]);
    let resolver = Resolver::new(&Destinations::loopback(), Duration::from_millis(20), lookup);
    assert_eq!(
        resolver.resolve_name("known.test").await.unwrap(),
        ["127.0.0.1".parse::<IpAddr>().unwrap()]
    );
    for i in 0..MAX_PENDING_LOOKUPS {
        let err = resolver
            .resolve_name(&format!("dead{i}.test"))
            .await
            .unwrap_err();
        assert!(err.contains("timed out"), "{err}");
    }
    let err = resolver.resolve_name("new.test").await.unwrap_err();
    assert!(err.contains("too many host name lookups pending"), "{err}");
    assert!(resolver.resolve_name("known.test").await.is_ok());
    // The failure is remembered for a while; the hanging lookup is not
    // started again.
    assert!(resolver.resolve_name("dead0.test").await.is_err());
    let calls = calls.lock().unwrap();
    assert_eq!(calls.get("dead0.test"), Some(&1));
    assert_eq!(calls.get("new.test"), None);
    assert_eq!(calls.len(), MAX_PENDING_LOOKUPS + 1);
}

/// A counter, so that the healthy consumer's lookups can be asserted to be
/// cached: many deliveries, one lookup.
#[tokio::test]
async fn answers_are_cached_and_shared_by_concurrent_lookups() {
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    let lookup = Lookup::new(move |_name: String| {
        counted.fetch_add(1, Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(vec!["127.0.0.1".parse().unwrap()])
        }
    });
    let resolver = Arc::new(Resolver::new(
        &Destinations::loopback(),
        Duration::from_secs(5),
        lookup,
    ));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let r = resolver.clone();
        tasks.push(tokio::spawn(
            async move { r.resolve_name("one.test").await },
        ));
    }
    for t in tasks {
        assert!(t.await.unwrap().is_ok());
    }
    assert!(resolver.resolve_name("ONE.test.").await.is_ok());
    assert_eq!(count.load(Ordering::SeqCst), 1);
}
