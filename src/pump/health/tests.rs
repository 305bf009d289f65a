//! The health rules case by case: what counts as an answer, the window
//! earned by answering and halved by failures, going down and the probes,
//! what a claim asks for and what is given back.

use super::*;
use crate::retry::tests::policy;

fn slot_of(slots: &Slots, id: i64) -> (i32, bool) {
    let i = slots.service_ids.iter().position(|s| *s == id).unwrap();
    (slots.free[i], slots.probe[i])
}

#[test]
fn only_a_2xx_or_a_410_counts_as_an_answer() {
    use crate::delivery::outcome::Failure;
    let retry = |failure| AttemptResult::Retry {
        at: chrono::Utc::now(),
        failure,
    };
    for failure in [
        Failure::Status(400),
        Failure::Status(404),
        Failure::Status(429),
        Failure::Status(302),
        Failure::Status(503),
        Failure::Timeout,
        Failure::Connect,
    ] {
        assert_eq!(Answer::of(&retry(failure)), Answer::Failed, "{failure:?}");
    }
    assert_eq!(
        Answer::of(&AttemptResult::Delivered { status: 204 }),
        Answer::Answered
    );
    assert_eq!(Answer::of(&AttemptResult::Gone), Answer::Answered);
}

#[test]
fn a_service_earns_its_concurrency_by_answering() {
    let now = Instant::now();
    let mut h = Health::new(64, 1, 3, policy());
    assert_eq!(
        h.slots_now(now).default_free,
        1,
        "an unknown service: one at a time"
    );
    h.claimed(1, "a", now);
    assert_eq!(slot_of(&h.slots_now(now), 1), (0, false));
    for _ in 0..10 {
        h.finished(1, Answer::Answered, now);
        h.claimed(1, "a", now);
    }
    h.finished(1, Answer::Answered, now);
    assert_eq!(
        slot_of(&h.slots_now(now), 1),
        (12, false),
        "each answer widens it by one"
    );
    h.claimed(1, "a", now);
    h.finished(1, Answer::Failed, now);
    assert_eq!(
        slot_of(&h.slots_now(now), 1),
        (6, false),
        "a failure halves it"
    );
    // 300 services that never answer hold one request each.
    for id in 100..400 {
        h.claimed(id, "hanging", now);
    }
    assert_eq!(slot_of(&h.slots_now(now), 150), (0, false));
    assert_eq!(h.total_in_flight(), 300);
}

#[test]
fn in_flight_is_capped_per_service() {
    let now = Instant::now();
    let mut h = Health::new(2, 2, 3, policy());
    h.claimed(1, "a", now);
    assert_eq!(slot_of(&h.slots_now(now), 1), (1, false));
    h.claimed(1, "a", now);
    assert_eq!(slot_of(&h.slots_now(now), 1), (0, false));
    assert_eq!(h.slots_now(now).default_free, 2);
    h.finished(1, Answer::Answered, now);
    assert_eq!(slot_of(&h.slots_now(now), 1), (1, false));
}

#[test]
fn a_claim_takes_one_window_ahead_and_what_waits_starts_as_requests_finish() {
    let now = Instant::now();
    let mut h = Health::new(4, 4, 3, policy());
    let offered = h.slots(now);
    h.claim_found(&offered, &HashMap::from([(1, 8)]));
    h.queued(1, "a", 8);
    assert_eq!(
        slot_of(&h.slots(now), 1),
        (0, false),
        "4 in flight + 4 ahead"
    );
    for _ in 0..4 {
        assert!(h.start(1, now));
    }
    assert!(!h.start(1, now), "the window is full: the rest wait");
    assert_eq!((h.in_flight(1), h.queued_of(1)), (4, 4));
    assert!(!h.wants_claim(now), "nothing room for");
    h.finished(1, Answer::Answered, now);
    h.finished(1, Answer::Answered, now);
    assert!(h.start(1, now) && h.start(1, now));
    assert_eq!(slot_of(&h.slots(now), 1), (2, false));
    assert!(h.wants_claim(now), "half a window of room: claim");
    // A claim that found less than its room: nothing more is due.
    let offered = h.slots(now);
    h.claim_found(&offered, &HashMap::from([(1, 1)]));
    assert!(!h.wants_claim(now), "the backlog is drained: wait for news");
}

/// A rate-limited service's last claim used every token: "more due". Its
/// queue then empties, and the next claim offers it nothing (its rate
/// found nothing queued, `pump::rate::Taken::nothing_queued`): it must not
/// stay "more due", or every finished send would claim again for it.
#[test]
fn a_service_with_nothing_queued_has_no_more_due_though_offered_nothing() {
    let now = Instant::now();
    let mut h = Health::new(4, 4, 3, policy());
    let mut offered = h.slots(now);
    offered.service_ids.push(1);
    offered.free.push(2);
    offered.probe.push(false);
    h.claim_found(&offered, &HashMap::from([(1, 2)]));
    assert!(h.wants_claim(now), "every token used: more may be due");
    let mut idle = h.slots(now);
    idle.free[0] = 0;
    h.claim_found(&idle, &HashMap::new());
    assert!(h.wants_claim(now), "offered nothing, the claim learnt nothing");
    h.nothing_due(1);
    assert!(!h.wants_claim(now), "nothing queued: wait for news");
}

#[test]
fn a_failing_service_gives_back_what_waits_beyond_its_window_and_all_when_down() {
    let now = Instant::now();
    let mut h = Health::new(8, 8, 2, policy());
    h.queued(1, "a", 16);
    for _ in 0..8 {
        assert!(h.start(1, now));
    }
    assert_eq!(h.excess_queued(1), 0);
    assert_eq!(h.finished(1, Answer::Failed, now), Transition::None);
    assert_eq!(
        h.excess_queued(1),
        4,
        "the window halved to 4: 4 of 8 go back"
    );
    h.unqueued(1, 4);
    assert_eq!(h.finished(1, Answer::Failed, now), Transition::WentDown);
    assert_eq!(h.excess_queued(1), 4, "down: all of it goes back");
    h.unqueued(1, 4);
    assert!(!h.start(1, now), "nothing waits");
}

#[test]
fn a_failing_service_is_probed_one_at_a_time_and_comes_back() {
    let now = Instant::now();
    let mut h = Health::new(8, 8, 2, policy());
    h.claimed(1, "a", now);
    h.claimed(1, "a", now);
    assert_eq!(h.finished(1, Answer::Failed, now), Transition::None);
    assert_eq!(h.finished(1, Answer::Failed, now), Transition::WentDown);
    assert_eq!(
        slot_of(&h.slots_now(now), 1),
        (0, false),
        "no claim until the probe is due"
    );
    let later = h.next_probe_at().unwrap();
    assert_eq!(slot_of(&h.slots_now(later), 1), (1, true));
    h.claimed(1, "a", later);
    assert_eq!(
        slot_of(&h.slots_now(later + Duration::from_secs(5)), 1),
        (0, false),
        "one probe at a time"
    );
    assert_eq!(h.finished(1, Answer::Failed, later), Transition::None);
    assert!(h.next_probe_at().unwrap() > later, "the pause grows");
    let again = h.next_probe_at().unwrap();
    h.claimed(1, "a", again);
    assert_eq!(h.finished(1, Answer::Answered, again), Transition::CameBack);
    // Its window, halved by each failure to 1, widens again answer by
    // answer: 2 now.
    assert_eq!(slot_of(&h.slots_now(again), 1), (2, false));
}
