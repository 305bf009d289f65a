//! What filters cost ([`super::cost`]), and the most one filter may cost.

use super::*;

fn cost(text: &str) -> u32 {
    parse(text)
        .unwrap_or_else(|e| panic!("{text:?} refused: {e}"))
        .cost
}

#[test]
fn conditions_cost_one_each_and_a_filter_at_least_one() {
    assert_eq!(cost("$"), 1);
    assert_eq!(cost("$.pull_request"), 1);
    assert_eq!(cost("$.*[*][*][*][*][*][*][*]"), 1);
    assert_eq!(cost(r#"$.paths[*] ? (@ starts with "docs/")"#), 1);
    assert_eq!(
        cost(r#"$.ref == "refs/heads/main" && $.forced == false"#),
        2
    );
    assert_eq!(
        cost(r#"$.labels[*] ? (@ == "a" || !(@ == "b") || exists(@.c))"#),
        3
    );
    assert_eq!(cost(&vec!["$.a == 1"; MAX_CONDITIONS].join(" || ")), 16);
}

#[test]
fn a_like_regex_costs_its_base_plus_its_weight() {
    // ^ s r c / .* \. r s $: ten atoms.
    assert_eq!(cost(r#"$.paths[*] ? (@ like_regex "^src/.*\\.rs$")"#), 14);
    assert_eq!(cost(r#"$.a like_regex "x{3}""#), 7);
    assert_eq!(cost(r#"$.a like_regex "(ab){2}|c""#), 9);
    assert_eq!(cost(r#"$.a like_regex "[a-z0-9_./-]""#), 5);
    // With flag q the pattern is a literal: one atom per character.
    assert_eq!(cost(r#"$.a like_regex "a.b" flag "q""#), 7);
    assert_refused(
        &format!(r#"$.a like_regex "{}" flag "q""#, "x".repeat(17)),
        "(17 atoms; at most 16)",
    );
    assert_refused(
        &format!(r#"$.a like_regex "{}Q""#, ".*".repeat(16)),
        "(17 atoms; at most 16)",
    );
}

#[test]
fn a_filter_may_cost_at_most_max_cost() {
    let fits = r#"$.a like_regex "[a-c]{12}" || $.b == 1 || $.c == 2 || $.d == 3 || $.e == 4"#;
    assert_eq!(cost(fits), MAX_COST);
    assert_refused(
        &format!("{fits} || $.j == 9"),
        "the filter costs 21 units; at most 20 are allowed",
    );
    assert_refused(
        r#"$.a like_regex "a{3}" || $.b like_regex "b{3}" || $.c like_regex "c{3}" || $.d like_regex "d{3}""#,
        "the filter costs 28 units",
    );
}
