//! The seam between Rust and SQL (issue 35; `src/db/mod.rs`): every
//! statement is a named function in `src/db/`, checked at build time
//! against `.sqlx/`. This test reads the source, not the binary: it fails
//! when a file outside `src/db/` names one of sqlx's query functions or
//! macros, and when a file inside it sends a statement the build cannot
//! check, unless that file is one of the few whose statements are made at
//! run time for a reason its module doc gives.

use std::fs;
use std::path::{Path, PathBuf};

/// sqlx's ways of sending a statement, as they appear after `sqlx::` or in
/// a `use sqlx::{...}` list (longest first: `query_as` is not `query`).
const SENDERS: [&str; 9] = [
    "query_file_scalar",
    "query_file_as",
    "query_as_with",
    "query_scalar",
    "query_with",
    "query_file",
    "query_as",
    "raw_sql",
    "query",
];

/// The files of `src/db/` allowed statements the build does not check,
/// how many, and why: a new one fails the test until it is counted here
/// with its reason.
const UNCHECKED: [(&str, usize, &str); 3] = [
    (
        "src/db/schema.rs",
        5,
        "applies the SQL files themselves (several statements each, and roles.sql), \
         and keeps their bookkeeping in a schema named at run time",
    ),
    (
        "src/db/connection.rs",
        3,
        "the pooler probe's begin, commit and backend pid go by the simple query protocol: \
         a prepared statement would itself fail behind the pooler it looks for",
    ),
    (
        "src/db/operator/listing.rs",
        1,
        "explain(): EXPLAIN with the tests' options, in front of a checked statement's own text",
    ),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Each use of a sender in `text`: (line number, the sender, whether it is
/// the compile-checked macro form `name!`). Comments are skipped.
fn senders(text: &str) -> Vec<(usize, &'static str, bool)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let in_use = code.trim_start().starts_with("use sqlx::");
        for (at, _) in code.match_indices("sqlx::") {
            let rest = &code[at + "sqlx::".len()..];
            if in_use {
                let words: Vec<&str> = rest
                    .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .collect();
                for sender in SENDERS.iter().filter(|s| words.contains(s)) {
                    found.push((n + 1, *sender, false));
                }
                continue;
            }
            let word_end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            if let Some(sender) = SENDERS.iter().find(|s| **s == &rest[..word_end]) {
                found.push((n + 1, *sender, rest[word_end..].starts_with('!')));
            }
        }
    }
    found
}

fn relative(path: &Path) -> String {
    path.strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap()
        .to_string_lossy()
        .replace('\\', "/")
}

#[test]
fn no_file_outside_src_db_sends_a_statement() {
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let offences: Vec<String> = files
        .iter()
        .filter(|f| !relative(f).starts_with("src/db/"))
        .flat_map(|f| {
            let text = fs::read_to_string(f).unwrap();
            senders(&text)
                .into_iter()
                .map(move |(line, sender, _)| format!("{}:{line}: sqlx::{sender}", relative(f)))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        offences.is_empty(),
        "statements belong in src/db/, as named functions with compile-checked queries: {offences:#?}"
    );
}

#[test]
fn src_db_checks_every_statement_at_build_time_but_where_it_says_why() {
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src/db"),
        &mut files,
    );
    assert!(files.len() > 3, "src/db/ has its rooms: {files:?}");
    let mut checked = 0;
    let mut offences = Vec::new();
    for f in &files {
        let name = relative(f);
        let text = fs::read_to_string(f).unwrap();
        let mut unchecked = Vec::new();
        for (line, sender, is_macro) in senders(&text) {
            if is_macro {
                checked += 1;
            } else {
                unchecked.push(format!(
                    "{name}:{line}: sqlx::{sender} (not the {sender}! macro)"
                ));
            }
        }
        let allowed = UNCHECKED
            .iter()
            .find(|(file, ..)| *file == name)
            .map_or(0, |(_, n, _)| *n);
        if unchecked.len() != allowed {
            offences.push(format!(
                "{name}: {} unchecked, {allowed} allowed: {unchecked:#?}",
                unchecked.len()
            ));
        }
    }
    assert!(
        offences.is_empty(),
        "statements the build does not check: {offences:#?}"
    );
    assert!(
        checked > 100,
        "only {checked} compile-checked statements in src/db/"
    );
}

#[test]
fn the_scan_finds_each_form_it_forbids() {
    let text = "let a = sqlx::query(\"x\");\n\
                let b = sqlx::query_as!(T, \"x\");\n\
                use sqlx::{raw_sql, PgPool};\n\
                /// sqlx::query(\"in a doc comment\")\n\
                let c = sqlx::query_scalar::<_, i64>(\"x\");\n\
                sqlx::queryable();\n\
                let d = sqlx::query_file_as!(T, \"f.sql\");\n";
    assert_eq!(
        senders(text),
        vec![
            (1, "query", false),
            (2, "query_as", true),
            (3, "raw_sql", false),
            (5, "query_scalar", false),
            (7, "query_file_as", true),
        ]
    );
}
