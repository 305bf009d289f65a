//! `like_regex` patterns and the size limits: refused past each limit, accepted at it.

use super::*;

#[test]
fn like_regex_rules() {
    assert_refused(r#"$.a like_regex "x" flag "g""#, "flag `g` is not allowed");
    assert_refused(r#"$.a like_regex "x" flag "I""#, "flag `I` is not allowed");
    assert_refused(r#"$.a like_regex "x" flag "x""#, "flag `x` is not allowed");
    assert_refused(r#"$.a like_regex "(a)\\1""#, "back-references");
    assert_refused(r#"$.a like_regex "\\0""#, "back-references and octal");
    assert_refused(
        r#"$.a like_regex "a{1000}""#,
        "counted repetition `{1000}` is too large",
    );
    assert_refused(r#"$.a like_regex "a{1,65}""#, "counted repetition `{65}`");
    assert_refused(r#"$.a like_regex "a{2,1}""#, "inverted");
    assert_refused(
        r#"$.a like_regex "((a{8}){8}){8}""#,
        "too large once counted",
    );
    assert_refused(r#"$.a like_regex "(?=a)""#, "lookahead");
    assert_refused(r#"$.a like_regex "(?<!a)b""#, "lookbehind");
    assert_refused(r#"$.a like_regex "(?i)a""#, "embedded options");
    assert_refused(r#"$.a like_regex "***=a""#, "directors");
    assert_refused(
        r#"$.a like_regex "a**""#,
        "quantifier can not follow another",
    );
    assert_refused(
        r#"$.a like_regex "a{2}{3}""#,
        "quantifier can not follow another",
    );
    assert_refused(r#"$.a like_regex "*a""#, "nothing to repeat");
    assert_refused(r#"$.a like_regex "^*""#, "can not follow an anchor");
    assert_refused(r#"$.a like_regex "\\y+""#, "can not follow an anchor");
    assert_refused(r#"$.a like_regex "a{x""#, "counted repetition `{m}`");
    assert_refused(r#"$.a like_regex "a{,3}""#, "counted repetition `{m}`");
    assert_refused(r#"$.a like_regex "{""#, "`{` must start");
    assert_refused(r#"$.a like_regex "a}""#, "literal `}`");
    assert_refused(r#"$.a like_regex "(a""#, "unmatched `(`");
    assert_refused(r#"$.a like_regex "a)""#, "unmatched `)`");
    assert_refused(r#"$.a like_regex "[a""#, "unmatched `[`");
    assert_refused(r#"$.a like_regex "[z-a]""#, "inverted");
    assert_refused(
        r#"$.a like_regex "[a-z-9]""#,
        "literal `-` must come first or last",
    );
    assert_refused(
        r#"$.a like_regex "[\\d-z]""#,
        "range must start with a plain",
    );
    assert_refused(r#"$.a like_regex "[[.a.]]""#, "collating elements");
    assert_refused(r#"$.a like_regex "[[=a=]]""#, "equivalence classes");
    assert_refused(r#"$.a like_regex "[[:foo:]]""#, "unknown character class");
    assert_refused(r#"$.a like_regex "\\b""#, "`\\b` is not allowed");
    assert_refused(r#"$.a like_regex "\\x41""#, "escape `\\x` is not allowed");
    assert_refused(r#"$.a like_regex "a\\""#, "lone backslash");
    assert_refused(
        r#"$.a like_regex "[\u0001-\u{10FFFF}]" flag "i""#,
        "with flag `i`, the character ranges of a pattern may span at most 4096",
    );
    assert_refused(
        r#"$.a like_regex "[\u0100-\u0900][\u0a00-\u1201]" flag "i""#,
        "may span at most 4096 characters in all",
    );
    assert!(parse(r#"$.a like_regex "[\u0100-\u0900][\u0a00-\u1000]" flag "i""#).is_ok());
    // The span counts code points, both ends included: 4,096 exactly is
    // taken, one more refused.
    assert!(parse(r#"$.a like_regex "[\u0100-\u10ff]" flag "i""#).is_ok());
    assert_refused(
        r#"$.a like_regex "[\u0100-\u1100]" flag "i""#,
        "may span at most 4096 characters in all",
    );
    assert!(parse(r#"$.a like_regex "[\u0001-\u{10FFFF}]""#).is_ok());
    let long = format!(r#"$.a like_regex "{}""#, "a".repeat(MAX_REGEX_LEN + 1));
    assert_refused(&long, "at most 128 characters");
    // At the length limit, as one bracket expression: a single atom.
    let at_limit = format!(r#"$.a like_regex "[{}]""#, "a".repeat(MAX_REGEX_LEN - 2));
    assert!(parse(&at_limit).is_ok());
    assert_refused(
        r#"$.a like_regex "a" || $.b like_regex "b" || $.c like_regex "c" || $.d like_regex "d" || $.e like_regex "e""#,
        "at most 4 `like_regex`",
    );
    assert_refused(
        r#"$.a like_regex "x" flag 1"#,
        "`flag` needs a double-quoted string",
    );
}

#[test]
fn limits() {
    let long = format!("$.a == \"{}\"", "x".repeat(MAX_LEN));
    assert_refused(&long, "at most 256 are allowed");
    let fits = format!("$.a == \"{}\"", "x".repeat(MAX_LEN - 9));
    assert_eq!(fits.chars().count(), MAX_LEN);
    assert!(parse(&fits).is_ok());
    // Characters, not bytes.
    let wide = format!("$.a == \"{}\"", "é".repeat(MAX_LEN - 9));
    assert!(parse(&wide).is_ok());

    let deep = format!("{}$.a == 1{}", "(".repeat(MAX_DEPTH), ")".repeat(MAX_DEPTH));
    assert!(parse(&deep).is_ok());
    let too_deep = format!(
        "{}$.a == 1{}",
        "(".repeat(MAX_DEPTH + 1),
        ")".repeat(MAX_DEPTH + 1)
    );
    assert_refused(&too_deep, "nesting is too deep");
    assert_refused(&"(".repeat(200), "nesting is too deep");

    let steps = format!("${}", ".a".repeat(MAX_STEPS));
    assert!(parse(&steps).is_ok());
    assert_refused(
        &format!("${}", ".a".repeat(MAX_STEPS + 1)),
        "too many path steps",
    );

    assert!(parse(&format!("${}", "[*]".repeat(MAX_WILDCARDS))).is_ok());
    assert_refused(
        &format!("${}", "[*]".repeat(MAX_WILDCARDS + 1)),
        "too many wildcard steps",
    );
    assert_refused(
        &format!("${}", ".*".repeat(MAX_WILDCARDS + 1)),
        "too many wildcard steps",
    );

    let conds = vec!["$.a == 1"; MAX_CONDITIONS].join(" || ");
    assert!(parse(&conds).is_ok());
    let too_many = vec!["$.a == 1"; MAX_CONDITIONS + 1].join("||");
    assert_refused(&too_many, "too many conditions");
}
