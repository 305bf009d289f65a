//! The parser's tests: accepted filters and how they are classified
//! (each checked against PostgreSQL 15 when the parser was written),
//! refusals with the message each gives (`refused`, `regex_and_limits`),
//! and generated garbage that must never panic.

mod cost;
mod refused;
mod regex_and_limits;

use super::token::is_blank;
use super::*;

/// Accepted filters and their classification (true = predicate). Every
/// entry was also checked against PostgreSQL 15: `$1::jsonpath` parses,
/// and `jsonb_path_match('{}', $1, '{}', true) IS NOT NULL` equals the
/// flag.
const ACCEPTED: &[(&str, bool)] = &[
    // From the brief.
    (r#"$.forced == true"#, true),
    (r#"$.paths[*] ? (@ starts with "docs/")"#, false),
    (r#"$.paths[*] ? (@ like_regex "^src/.*\\.rs$")"#, false),
    (r#"$.ref == "refs/heads/main" && $.forced == false"#, true),
    (r#"exists($.pull_request)"#, true),
    (
        r#"$.commits[*].author ? (@.email starts with "bot@")"#,
        false,
    ),
    (r#"$.labels[*] ? (@ == "deploy" || @ == "preview")"#, false),
    // Paths.
    (r#"$"#, false),
    (r#"$.a"#, false),
    (r#"lax $.a.b"#, false),
    (r#"LAX $.a"#, false),
    (r#"lax$.a"#, false),
    (r#"$."quoted key".b"#, false),
    (r#"$.""[0]"#, false),
    (r#"$.a[0]"#, false),
    (r#"$.a[last]"#, false),
    (r#"$.a[LAST]"#, false),
    (r#"$.a[2147483647]"#, false),
    (r#"$.a.*"#, false),
    (r#"$.*[*]"#, false),
    (r#"$ . a [ * ] . b"#, false),
    (r#"$.a ? (@ > 1).b"#, false),
    (r#"$.a ? (@ == 1)[*].c[0]"#, false),
    (r#"$?(@.a == 1)"#, false),
    (r#"$.exists.true.null.last.like_regex"#, false),
    (r#"$.a ? (exists(@.b))"#, false),
    (r#"$.a ? ((@ == 1) is unknown)"#, false),
    (r#"$.a ? (!(@.b == 1) && @.c != "x")"#, false),
    (r#"$.a ? (!exists(@.b))"#, false),
    (r#"$.a ? (@.b[*] == "x" || @.c.* starts with "y")"#, false),
    (r#"$.a ? (@ like_regex "(" flag "q")"#, false),
    (
        "$.files[*]\n  ? (@.path starts with \"a\"\n     && @.size > 10)",
        false,
    ),
    // Predicates.
    (r#"EXISTS($.a)"#, true),
    (r#"! exists ( $.a )"#, true),
    (r#"!($.a == 1)"#, true),
    (r#"(($.a == 1))"#, true),
    (r#"($.a == 1) is unknown"#, true),
    (r#"($.a == 1) IS UNKNOWN"#, true),
    (r#"!(($.a == 1) is unknown)"#, true),
    (r#"$.a Starts With "x""#, true),
    (r#"$.a LIKE_REGEX "x" FLAG "iq""#, true),
    (r#"$.a like_regex "^[0-9a-f]{12}""#, true),
    (r#"$.a like_regex "^(?:feat|fix)(\\(.+\\))?: ""#, true),
    (r#"$.a like_regex "[[:alpha:]_-]+" flag "i""#, true),
    (r#"$.a like_regex "^\\d{4}-\\d{2}-\\d{2}T" flag "sm""#, true),
    (
        r#"$.a like_regex "\\yw\\y|[]a]|[^]a]|[-a]|x{2,}?|y{0,3}|z+?""#,
        true,
    ),
    (r#"$.a like_regex "[а-я]" flag "i""#, true),
    (r#"$.a like_regex """#, true),
    (r#"-1 == $.a"#, true),
    (r#"$.a == - 1"#, true),
    (r#"$.a == +1.5e3"#, true),
    (r#"$.a == -0.25E-3"#, true),
    (r#"$.a != null"#, true),
    (r#"$.a <> "x""#, true),
    (r#"$.a <= 10 && $.a >= 0 && $.b < 1 && $.c > 2"#, true),
    (
        r#"$.a == "\u00e9\uD83D\uDE00\u{1F600}\x41\n\"\\\/\'\t\b\f\r\v""#,
        true,
    ),
    (r#"$.a == "x" && $.b == 1 || $.c == 2"#, true),
    (r#"exists($.a[*] ? (@ == 1)) || $.b == true"#, true),
    (r#"$.a[*] ? (@ == 1) == 1"#, true),
    (r#"$.true == true"#, true),
];

/// Predicates whose operand is the payload root itself. They are
/// predicates (PostgreSQL prints `$ == 1` as `($ == 1)`), but the probe
/// `jsonb_path_match('{}', f, '{}', true)` is NULL for them, because
/// comparing the object `{}` with a literal is unknown; on `1` or `"x"`
/// they are true or false. So that probe is not a classifier; `parse`
/// classifies from the grammar.
const ACCEPTED_ROOT_OPERAND: &[(&str, bool)] = &[
    (r#"$ == 1"#, true),
    (r#""x" == $"#, true),
    (r#"$[0] starts with "x""#, true),
    (r#"lax $[*] like_regex "^x""#, true),
];

fn refused(text: &str) -> String {
    match parse(text) {
        Ok(f) => panic!("expected {text:?} to be refused, got {f:?}"),
        Err(e) => e.message().to_string(),
    }
}

fn assert_refused(text: &str, needle: &str) {
    let m = refused(text);
    assert!(m.starts_with("filters.match: "), "{text:?}: {m}");
    assert!(
        m.contains(needle),
        "{text:?}: message {m:?} does not mention {needle:?}"
    );
}

#[test]
fn accepted_examples_parse_and_classify() {
    for &(text, is_predicate) in ACCEPTED {
        match parse(text) {
            Ok(f) => {
                assert_eq!(f.is_predicate, is_predicate, "{text:?}");
                assert_eq!(f.text, text.trim(), "{text:?}");
            }
            Err(e) => panic!("{text:?} refused: {e}"),
        }
    }
}

#[test]
fn root_operand_predicates_are_predicates() {
    for &(text, is_predicate) in ACCEPTED_ROOT_OPERAND {
        assert_eq!(
            parse(text).map(|f| f.is_predicate),
            Ok(is_predicate),
            "{text:?}"
        );
    }
}

#[test]
fn text_is_trimmed() {
    let f = parse("  \n $.forced == true \t").unwrap();
    assert_eq!(f.text, "$.forced == true");
    assert!(f.is_predicate);
}

#[test]
fn empty() {
    assert_refused("", "the filter is empty");
    assert_refused("  \n", "the filter is empty");
    assert_refused("lax", "unexpected end");
}

#[test]
fn errors_display_their_message() {
    let e = parse("$.a / 0 == 1").unwrap_err();
    assert_eq!(e.to_string(), e.message());
    let _: &dyn std::error::Error = &e;
}

/// Small deterministic generator, so the property tests need no crates.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const FRAGMENTS: &[&str] = &[
    "$",
    "@",
    ".",
    "a",
    "b",
    "[",
    "]",
    "*",
    "**",
    "?",
    "(",
    ")",
    "==",
    "!=",
    "<",
    ">=",
    "&&",
    "||",
    "!",
    "\"",
    "\\",
    "x\"",
    "1",
    "-",
    "+",
    "/",
    "%",
    " ",
    "exists",
    "starts with",
    "like_regex",
    "flag",
    "\"i\"",
    "is unknown",
    "last",
    "to",
    ",",
    "{",
    "}",
    "lax",
    "strict",
    "true",
    "TRUE",
    "null",
    "\\u",
    "\\u{",
    "D83D",
    "é",
    "\0",
    "\u{7}",
    "1e5",
    ".5",
    "0",
    "type()",
    "$x",
    "/*",
    "*/",
    "'",
    "\n",
    "\u{10FFFF}",
    "[*]",
    "? (",
    "\"^a{3}(b|c)*$\"",
];

#[test]
fn random_garbage_never_panics() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..20_000 {
        let n = rng.below(40);
        let mut s = String::new();
        for _ in 0..n {
            if rng.below(4) == 0 {
                // Any code point, including controls and non-characters.
                if let Some(c) = char::from_u32((rng.next() % 0x11_0000) as u32) {
                    s.push(c);
                }
            } else {
                s.push_str(FRAGMENTS[rng.below(FRAGMENTS.len())]);
            }
        }
        if let Ok(f) = parse(&s) {
            assert_eq!(f.text, s.trim_matches(is_blank));
        }
    }
}

#[test]
fn mutated_examples_never_panic() {
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    for _ in 0..20_000 {
        let (base, _) = ACCEPTED[rng.below(ACCEPTED.len())];
        let mut chars: Vec<char> = base.chars().collect();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(chars.len() + 1);
            match rng.below(3) {
                0 if at < chars.len() => {
                    chars.remove(at);
                }
                1 => {
                    let frag = FRAGMENTS[rng.below(FRAGMENTS.len())];
                    for (k, c) in frag.chars().enumerate() {
                        chars.insert(at + k, c);
                    }
                }
                _ if at < chars.len() => {
                    chars[at] = char::from_u32(rng.below(128) as u32).unwrap_or('x');
                }
                _ => {}
            }
        }
        let s: String = chars.into_iter().collect();
        if let Ok(f) = parse(&s) {
            assert_eq!(f.text, s.trim_matches(is_blank));
        }
    }
}
