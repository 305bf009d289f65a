//! Whatever the language leaves out is refused, with a message that says what.

use super::*;

#[test]
fn malicious_nested_exists_is_refused() {
    let m = refused(r#"$.paths[*] ? (exists($.paths[*] ? (exists($.paths[*] ? (@ == "zzz")))))"#);
    assert!(
        m.starts_with("filters.match: `$` is not allowed inside a filter `? (...)`"),
        "{m}"
    );
    assert!(m.contains("exists(...)"), "{m}");
    assert!(m.contains("use `@`"), "{m}");
    // The same shape with `@` is still refused: nested filters.
    assert_refused(
        r#"$.paths[*] ? (exists(@.paths[*] ? (@ == "zzz")))"#,
        "nested filters are not allowed",
    );
    assert_refused(
        r#"$.a[*] ? (@ == $.b)"#,
        "`$` is not allowed inside a filter",
    );
}

#[test]
fn previously_misclassified_cases_are_refused() {
    assert_refused("$.** == 1", "`.**` (recursive descent");
    assert_refused("$.a / 0 == 1", "arithmetic (`/`)");
    assert_refused("strict $.a.b == 1", "`strict` mode is not allowed");
}

#[test]
fn mode() {
    assert_refused("STRICT $.a", "`strict` mode");
    assert_refused("$.a == 1 && lax", "`lax` may only appear at the very start");
}

#[test]
fn recursive_descent() {
    assert_refused("$.**", "`.**`");
    assert_refused("$.a.**{2}", "`.**`");
    assert_refused("$.a.**{2 to last} ? (@ == 1)", "`.**`");
    assert_refused("$.a ? (@.** == 1)", "`.**`");
}

#[test]
fn item_methods() {
    for m in [
        "type",
        "size",
        "double",
        "ceiling",
        "floor",
        "abs",
        "keyvalue",
        "datetime",
        "bigint",
        "boolean",
        "date",
        "decimal",
        "integer",
        "number",
        "string",
        "time",
        "time_tz",
        "timestamp",
        "timestamp_tz",
        "Type",
    ] {
        assert_refused(&format!("$.a.{m}() == 1"), &format!("item method `.{m}()`"));
    }
    assert_refused(r#"$.a.datetime("YYYY") == 1"#, "item method `.datetime()`");
    assert_refused("$.a.decimal(4, 2) == 1", "item method `.decimal()`");
    assert_refused("$.a ? (@.size() > 1)", "item method `.size()`");
    // Without parentheses these are ordinary keys.
    assert!(parse("$.a.size == 1").is_ok());
}

#[test]
fn arithmetic() {
    assert_refused("$.a + 1 == 2", "arithmetic (`+`)");
    assert_refused("$.a == 1 + 1", "arithmetic (`+`)");
    assert_refused("$.a * 2 == 2", "arithmetic (`*`)");
    assert_refused("$.a % 2 == 0", "arithmetic (`%`)");
    assert_refused("$.a - 1 == 0", "arithmetic (`-`)");
    assert_refused("-$.a == 1", "arithmetic (unary `-`)");
    assert_refused("$.a == -$.b", "arithmetic (unary `-`)");
    assert_refused("$.a == --1", "arithmetic (unary `-`)");
    assert_refused(r#"$.a == -"x""#, "arithmetic (unary `-`)");
    assert_refused("$.a[last - 1]", "arithmetic (`-`) in an array index");
    assert_refused("$.a ** 2", "`**`");
    assert_refused("2 * $.a == 2", "arithmetic (`*`)");
}

#[test]
fn variables() {
    assert_refused("$.a == $x", "variables (`$name`)");
    assert_refused(r#"$.a == $"x""#, "variables (`$name`)");
    assert_refused(r#"$.a ? (@ starts with $x)"#, "variables");
    assert_refused("$1 == 1", "variables");
}

#[test]
fn subscripts() {
    assert_refused("$.a[1 to 3]", "array slices");
    assert_refused("$.a[1, 2]", "index lists");
    assert_refused("$.a[-1]", "negative array indexes");
    assert_refused("$.a[$.b]", "computed array indexes");
    assert_refused("$.a[1.5]", "array index `1.5`");
    assert_refused("$.a[1e2]", "array index `1e2`");
    assert_refused("$.a[2147483648]", "array index `2147483648`");
    assert_refused("$.a[]", "expected an array index");
    assert_refused("$.a == last", "`last` is only allowed as an array index");
}

#[test]
fn filters() {
    assert_refused("$.a ? (@ == 1) ? (@ == 2)", "at most 1 filter");
    assert_refused(
        "$.a ? (@ == 1) && $.b ? (@ == 2)",
        "`&&` combines conditions",
    );
    assert_refused(
        "exists($.a ? (@ == 1)) && exists($.b ? (@ == 2))",
        "at most 1 filter",
    );
    assert_refused("$.a ? (@.b ? (@ == 1) == 1)", "nested filters");
    assert_refused("$.a ? (@.b)", "a filter `? (...)` needs a condition");
    assert_refused("$.a ? (\"x\")", "needs a condition");
    assert_refused("$.a ? (@)", "needs a condition");
    assert_refused("$.a ? @ == 1", "expected `(` after the filter `?`");
    assert_refused("$.a ? (@ == 1", "to close the filter");
}

#[test]
fn current_item_only_in_filters() {
    assert_refused("@ == 1", "`@` is only allowed inside a filter");
    assert_refused(
        "$.a == 1 && exists(@.b)",
        "`@` is only allowed inside a filter",
    );
    assert_refused("$.a ? (@ == 1).b ? (@ == 1)", "at most 1 filter");
}

#[test]
fn comparisons() {
    assert_refused("$.a == $.b", "comparing two paths");
    assert_refused("$.a ? (@.b == @.c)", "comparing two paths");
    assert_refused(
        "1 == 1",
        "needs a path on one side and a literal on the other",
    );
    assert_refused("$.a = 1", "unexpected `=`");
    assert_refused("$.a ==", "unexpected end");
    assert_refused("$.a == 1 == 2", "unexpected `==`");
    assert_refused("exists($.a) == true", "unexpected `==`");
    assert_refused("($.a) == 1", "parentheses may only group conditions");
    assert_refused("$.a == ($.b)", "parentheses may only group conditions");
    assert_refused(
        "\"x\" starts with \"y\"",
        "`starts with` needs a path on its left",
    );
    assert_refused("$.a starts with 1", "needs a double-quoted string literal");
    assert_refused("$.a starts \"x\"", "expected `with`");
    assert_refused("$.a & $.b", "unexpected `&`");
}

#[test]
fn boolean_structure() {
    assert_refused("$.a && $.b", "`&&` combines conditions");
    assert_refused("$.a == 1 || $.b", "`||` combines conditions");
    assert_refused("!$.a == 1", "`!` must be followed by");
    assert_refused(
        "!($.a == 1) is unknown",
        "`is unknown` can not follow `!(...)`",
    );
    assert_refused("exists($.a) is unknown", "`is unknown` can only follow");
    assert_refused("$.a == 1 is unknown", "unexpected `is`");
    assert_refused("($.a == 1) is known", "expected `unknown`");
    assert_refused("exists($.a == 1)", "takes a path, not a condition");
    assert_refused("exists(1)", "`exists(...)` needs a path");
    assert_refused("exists $.a", "expected `(` after `exists`");
}

#[test]
fn literals_and_keywords() {
    assert_refused("$.a == TRUE", "`TRUE` is not a literal");
    assert_refused("$.a == False", "`False` is not a literal");
    assert_refused("$.a == NULL", "must be lowercase");
    assert_refused("\"x\"", "a bare literal is not a filter");
    assert_refused("true", "a bare literal is not a filter");
    assert_refused("$.a == foo", "unexpected word `foo`");
    assert_refused("$.a like_regex", "needs a double-quoted pattern");
    assert_refused("like_regex \"x\"", "needs a path on its left");
}

#[test]
fn numbers() {
    assert_refused("$.a == 01", "leading zeros");
    assert_refused("$.a == 1.", "decimal point must be followed by digits");
    assert_refused("$.a == .5", "`.` followed by a digit");
    assert_refused("$.a.1 == 1", "`.` followed by a digit");
    assert_refused("$.a == 1e", "exponent needs digits");
    assert_refused("$.a == 1x", "unexpected characters right after it");
    assert_refused("$.a == 1.5.2", "unexpected characters right after it");
    assert_refused("$.a == 1e400", "exponents may be at most 308");
    assert_refused(
        "$.a == 123456789012345678901234567890123",
        "at most 32 characters",
    );
}

#[test]
fn keys() {
    assert_refused("$.é == 1", "unquoted key `é`");
    assert_refused("$.a~b == 1", "unquoted key `a~b`");
    assert_refused("$. == 1", "expected a key");
    assert!(parse(r#"$."é" == 1"#).is_ok());
}

#[test]
fn strings() {
    assert_refused(r#"$.a == "\u0000""#, "NUL");
    assert_refused(r#"$.a == "\u{0}""#, "NUL");
    assert_refused(r#"$.a == "\x00""#, "NUL");
    assert_refused("$.a == \"x\0\"", "NUL");
    assert_refused("$.a == \"x\u{7}\"", "control character U+0007");
    assert_refused("$.a == \"x\u{85}\"", "control character U+0085");
    assert_refused("$.a\u{c}== 1", "control character U+000C");
    assert_refused(
        "$.a == \"x\ny\"",
        "raw control character U+000A inside a string",
    );
    assert_refused(
        "$.\"a\tb\" == 1",
        "raw control character U+0009 inside a string",
    );
    assert_refused(r#"$.a == "\.""#, "string escape `\\.` is not allowed");
    assert_refused(r#"$.a like_regex "^src/.*\.rs$""#, "string escape `\\.`");
    assert_refused(r#"$.a == "\d""#, "string escape `\\d`");
    assert_refused(r#"$.a == "\U0041""#, "string escape `\\U`");
    assert_refused(r#"$.a == "\uD83D""#, "high surrogate");
    assert_refused(r#"$.a == "\uD83Dx""#, "high surrogate");
    assert_refused(r#"$.a == "\uDE00""#, "low surrogate");
    assert_refused(r#"$.a == "\u{110000}""#, "invalid code point");
    assert_refused(r#"$.a == "\u{D800}""#, "high surrogate");
    assert_refused(r#"$.a == "\u004""#, "invalid hexadecimal or unicode escape");
    assert_refused(r#"$.a == "\u{1234567}""#, "invalid \\u{...} escape");
    assert_refused(r#"$.a == "\x4""#, "invalid hexadecimal");
    assert_refused(r#"$.a == "abc"#, "unterminated string");
    assert_refused(r#"$.a == "abc\"#, "unterminated string");
    assert_refused("$.a == 'x'", "single-quoted strings");
    assert_refused(r#"$.a\u0062 == 1"#, "backslash is only allowed inside");
}

#[test]
fn comments() {
    assert_refused("$.a /* hi */ == 1", "comments");
}
