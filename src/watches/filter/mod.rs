//! Validation of a watch's `match` filter (a PostgreSQL `jsonpath`).
//!
//! # Why this module exists
//!
//! A watch's `match` filter is evaluated by PostgreSQL *inside the producer's
//! transaction* (`jsonb_path_match(payload, filter, '{}', true)` for a
//! predicate, `jsonb_path_exists(payload, filter, '{}', true)` for a path).
//! Consumers are only semi-trusted, and full jsonpath is not safe to run
//! there: a 75-character filter such as
//! `$.paths[*] ? (exists($.paths[*] ? (exists($.paths[*] ? (@ == "zzz")))))`
//! re-scans the whole payload for every item at every nesting level, which
//! made an emit take seconds and 23 GB of backend memory. Other constructs
//! raise errors that `silent => true` does *not* suppress (an unknown
//! variable `$x`) and so would abort the producer's transaction.
//!
//! So [`parse`] accepts only a small subset of PostgreSQL 15's jsonpath
//! grammar, decided purely by parsing the text (the filter is never run),
//! and refuses everything else with a message naming what is not allowed.
//! Everything it accepts is valid PostgreSQL jsonpath with the meaning the
//! parser assumed, and [`MatchFilter::is_predicate`] agrees with how
//! PostgreSQL classifies the expression.
//!
//! # Accepted language
//!
//! ```text
//! match      = [ "lax" ] ( path | predicate ) ;       (* "strict" is refused *)
//! path       = "$" { step } ;                          (* at top level *)
//! item-path  = "@" { plain-step } ;                    (* only inside a filter *)
//! step       = plain-step | filter ;                   (* at most ONE filter per match *)
//! plain-step = "." key | "." "*" | "[" "*" "]" | "[" index "]" ;
//! key        = identifier | string ;                   (* identifier = [A-Za-z_][A-Za-z0-9_]* *)
//! index      = unsigned-integer | "last" ;
//! filter     = "?" "(" condition ")" ;                 (* operands are item-paths *)
//! predicate  = condition ;                             (* operands are $-paths *)
//! condition  = and { "||" and } ;
//! and        = unary { "&&" unary } ;
//! unary      = "!" ( "(" condition ")" | exists )
//!            | "(" condition ")" [ "is" "unknown" ]
//!            | exists
//!            | operand cmp literal | literal cmp operand
//!            | operand "starts" "with" string
//!            | operand "like_regex" string [ "flag" string ] ;
//! exists     = "exists" "(" operand ")" ;
//! operand    = path | item-path ;                      (* whichever the context allows *)
//! cmp        = "==" | "!=" | "<>" | "<" | "<=" | ">" | ">=" ;
//! literal    = string | [ "-" | "+" ] number | "true" | "false" | "null" ;
//! ```
//!
//! Keywords other than `true`, `false` and `null` are case-insensitive, as
//! in PostgreSQL (`LIKE_REGEX`, `Starts With`, `EXISTS`, `LAX` all work);
//! `true`, `false` and `null` must be lowercase (PostgreSQL reads `TRUE` as
//! an identifier and fails). Whitespace (space, tab, CR, LF) may separate
//! tokens. Strings are double-quoted with the escapes `\" \' \\ \/ \b \f \n
//! \r \t \v \uXXXX \u{X…} \xXX`; any other escape is refused because
//! PostgreSQL silently drops the backslash (`"\."` is the string `.`).
//! Numbers are JSON numbers. `like_regex` patterns are restricted further,
//! see [`MAX_REGEX_LEN`] and the `like_regex` rules below.
//!
//! # Cost
//!
//! In lax mode without `.**`, item methods, arithmetic, `$` inside a filter
//! and nested filters, every step maps a set of JSON nodes that are pairwise
//! not ancestor/descendant of each other to another such set (each node to
//! some of its children or grandchildren, or to itself), so each step touches
//! every node of the payload at most a constant number of times, and a
//! filter's condition, evaluated once per selected item with `@`-relative
//! paths, only reads that item's subtree; those subtrees are disjoint. Every
//! comparison has one literal side, so it is linear in the items it sees.
//! `like_regex` patterns are small, without back-references or lookaround,
//! so PostgreSQL's DFA-based matcher is linear in the string, with a
//! constant that grows with the pattern. Hence an accepted filter costs
//! O(payload size × filter size).
//!
//! The constants differ a lot (a weight-32 pattern costs as much as 50
//! comparisons), so [`cost`] turns each filter into units that add up: a
//! comparison is one, a `like_regex` four plus its weight. One filter may
//! cost at most [`MAX_COST`]; what all of a service's filters on one object
//! may cost together is capped in [`crate::watches`].
//!
//! # Layout
//!
//! [`parse`] here; `token` and `lexer` split the text where PostgreSQL's
//! scanner would; `parser` reads conditions and `parser::path` the paths;
//! `regex` checks `like_regex` patterns; [`cost`] says what each construct
//! costs; `tests` holds the accepted and refused examples. Written without dependencies: it is a few hundred lines
//! of recursive descent, and every limit is visible here.

pub mod cost;
mod lexer;
mod parser;
mod regex;
#[cfg(test)]
mod tests;
mod token;

use std::fmt;

use lexer::Lexer;
use parser::{Expr, Parser};
use token::{is_blank, Tok};

/// Maximum length of a filter, in characters (after trimming). Long enough
/// for any realistic routing rule; short enough that the other limits below
/// can not be multiplied into anything large, and that a stored filter fits
/// comfortably in an error message or a log line.
pub const MAX_LEN: usize = 256;

/// Maximum syntactic nesting: every `(`…`)` group, `!(`…`)`, `exists(`…`)`
/// and filter `? (`…`)` opens one level. Both this parser and PostgreSQL's
/// evaluator recurse once per level; real filters need two or three.
pub const MAX_DEPTH: usize = 8;

/// Maximum number of path steps (`.key`, `."key"`, `[n]`, `[last]`, `[*]`,
/// `.*`, `? (...)`) in the whole filter, summed over all its paths. Each
/// step is one linear pass over (part of) the payload, so this is the
/// constant in O(payload × filter).
pub const MAX_STEPS: usize = 32;

/// Maximum number of wildcard steps (`[*]` and `.*`) in the whole filter.
/// Each is linear (it visits every child once, and in lax mode never
/// revisits a node), but each one materialises a list of up to payload-size
/// items; two or three are plenty for `$.commits[*].files[*]`-style rules.
pub const MAX_WILDCARDS: usize = 8;

/// Maximum number of filters `? (...)` in the whole text: one. A filter is
/// where per-item work happens; allowing only one (and never inside another)
/// keeps the cost argument simple and the filter readable.
pub const MAX_FILTERS: usize = 1;

/// Maximum number of conditions (comparisons, `starts with`, `like_regex`,
/// `exists`) combined with `&&`/`||`. PostgreSQL builds a left-deep tree for
/// `a || b || c …`, so this also bounds its evaluation recursion.
pub const MAX_CONDITIONS: usize = 16;

/// Largest array index `[n]`. PostgreSQL subscripts are `int4`; a larger
/// literal is an error outside silent mode, so it is refused here.
pub const MAX_INDEX: u32 = i32::MAX as u32;

/// Maximum length of a number literal, in characters.
pub const MAX_NUMBER_LEN: usize = 32;

/// Maximum absolute value of a number literal's exponent (`1e308`): the
/// `double` range. PostgreSQL parses literals as `numeric`, so `1e100000` would
/// be a 100 001-digit number that every comparison has to walk (and
/// `1e1000000` is a parse error).
pub const MAX_EXPONENT: u32 = 308;

/// Maximum number of `like_regex` conditions. PostgreSQL compiles each
/// pattern (caching only 32 per backend), so this bounds compile work per
/// evaluation.
pub const MAX_REGEXES: usize = 4;

/// Most a filter may cost, in [`cost`] units (a comparison is one, a
/// `like_regex` four plus its weight): what the dearest pattern alone costs
/// (weight 16), or 16 comparisons and a small pattern. Below the per-object
/// cap in [`crate::watches`], so that a service can still put a few plain
/// filters next to its dearest one.
pub const MAX_COST: u32 = 20;

/// Maximum length of a `like_regex` pattern, in characters, after decoding
/// the jsonpath string escapes. Together with [`MAX_REGEX_REPEAT`] and
/// [`MAX_REGEX_WEIGHT`] this keeps the compiled automaton small, which is
/// what makes matching linear in the string.
pub const MAX_REGEX_LEN: usize = 128;

/// Largest bound in a counted repetition `{m}`, `{m,}`, `{m,n}`. PostgreSQL
/// expands counted repetitions by copying the repeated sub-automaton, so
/// large or nested counts blow up compile time and memory (PostgreSQL itself
/// refuses counts above 255 with an error). No more than the weight allows.
pub const MAX_REGEX_REPEAT: u32 = 16;

/// Maximum "weight" of a `like_regex` pattern: the number of atoms after
/// expanding counted repetitions (`(ab){3}` weighs 6, `((a{8}){8}){8}` 512).
/// This catches nested counts that are each small but multiply. Matching
/// costs up to the weight per character read, and more than that past 16
/// (measured in [`cost`]: weight 32 costs four times weight 16), so 16 it is:
/// enough for `^src/.*\.rs$` (10), `^(?:feat|fix)(\(.+\))?: ` (14) or
/// `^[0-9a-f]{12}` (13); compare whole commit ids with `==` instead.
pub const MAX_REGEX_WEIGHT: u64 = 16;

/// Maximum number of code points the character ranges (`[a-z]`) of one
/// pattern may span in all when the `i` (case-insensitive) flag is set.
/// PostgreSQL case-folds every code point of every range at compile time: a
/// full-Unicode range costs ~8 ms, ten ranges of 4,096 code points 0.46 ms,
/// and compiling happens again whenever a backend has met more than 32
/// patterns since.
pub const MAX_REGEX_CI_RANGE: u32 = 4096;

/// Every message starts with this, so that an API error names the field.
const PREFIX: &str = "filters.match: ";

/// A parsed, allowed `match` filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchFilter {
    /// The filter text to store and hand to PostgreSQL: the input with
    /// leading and trailing ASCII whitespace removed, otherwise unchanged (it
    /// is exactly the text that was validated).
    pub text: String,
    /// true: a predicate (`$.forced == true`), which must evaluate to true
    /// (use `jsonb_path_match`, and treat NULL/unknown as no match); false: a
    /// path (`$.paths[*] ? (@ starts with "docs/")`), which must select at
    /// least one item (use `jsonb_path_exists`).
    pub is_predicate: bool,
    /// What evaluating it costs, in [`cost`] units: 1 to [`MAX_COST`].
    pub cost: u32,
}

/// Why a filter was refused. The message starts with `filters.match: ` and
/// then says what is wrong, and where (`at character N`, counting from 1 in
/// the trimmed text) when that helps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterError {
    message: String,
}

impl FilterError {
    fn new(message: impl Into<String>) -> Self {
        FilterError {
            message: format!("{PREFIX}{}", message.into()),
        }
    }

    fn at(message: impl Into<String>, pos: usize) -> Self {
        FilterError {
            message: format!("{PREFIX}{} (at character {pos})", message.into()),
        }
    }

    /// The full message, `filters.match: …`.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for FilterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FilterError {}

/// Parses `text` and returns it as a [`MatchFilter`] if it lies in the
/// allowed subset (see the module documentation), or says what is not
/// allowed. Never evaluates anything and never panics.
pub fn parse(text: &str) -> Result<MatchFilter, FilterError> {
    let text = text.trim_matches(is_blank);
    check_characters(text)?;
    let mut p = Parser::new(Lexer::new(text).run()?);
    if let Tok::Word(w) = p.peek() {
        if w.eq_ignore_ascii_case("strict") {
            return Err(p.err_here(
                "`strict` mode is not allowed; filters always run in lax mode (omit the prefix)",
            ));
        }
        if w.eq_ignore_ascii_case("lax") {
            p.bump();
        }
    }
    let expr = p.condition()?;
    if *p.peek() != Tok::End {
        return Err(p.unexpected());
    }
    Ok(MatchFilter {
        text: text.to_string(),
        is_predicate: is_predicate(expr)?,
        cost: check_cost(p.cost)?,
    })
}

/// The length, and no control characters but the blanks between tokens.
fn check_characters(text: &str) -> Result<(), FilterError> {
    if text.is_empty() {
        return Err(FilterError::new("the filter is empty"));
    }
    let len = text.chars().count();
    if len > MAX_LEN {
        return Err(FilterError::new(format!(
            "the filter is {len} characters long; at most {MAX_LEN} are allowed"
        )));
    }
    for (i, c) in text.chars().enumerate() {
        if c == '\0' {
            return Err(FilterError::at("NUL characters are not allowed", i + 1));
        }
        if c.is_control() && !is_blank(c) {
            return Err(FilterError::at(
                format!("control character U+{:04X} is not allowed", c as u32),
                i + 1,
            ));
        }
    }
    Ok(())
}

fn is_predicate(expr: Expr) -> Result<bool, FilterError> {
    match expr {
        Expr::Pred => Ok(true),
        Expr::Path => Ok(false),
        Expr::Lit => Err(FilterError::new(
            "a bare literal is not a filter; write a path such as `$.pull_request` \
             or a condition such as `$.forced == true`",
        )),
    }
}

/// A filter costs at least one unit (walking the payload is not free) and at
/// most [`MAX_COST`].
fn check_cost(cost: u64) -> Result<u32, FilterError> {
    let cost = cost.max(1);
    match u32::try_from(cost) {
        Ok(cost) if cost <= MAX_COST => Ok(cost),
        _ => Err(FilterError::new(format!(
            "the filter costs {cost} units; at most {MAX_COST} are allowed (each comparison, \
             `starts with` and `exists` costs {}, a `like_regex` {} plus the atoms of its \
             pattern)",
            cost::CONDITION,
            cost::REGEX_BASE
        ))),
    }
}
