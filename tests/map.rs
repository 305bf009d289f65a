//! The map and the front door (issue 35) stay true to the tree:
//!
//! - `src/lib.rs`'s "Where a change goes" has a row for each kind of change
//!   a newcomer makes most (a field of the delivery body, an admin action,
//!   a consumer endpoint, a metric, the retry policy, a bound), each row
//!   names at most three files, and every file it names exists: a map
//!   that points at a moved file sends its reader nowhere.
//! - A file of `src/` over 400 lines says why in its module doc (a line
//!   with `Over 400 lines:` and the reason), so that length is a decision,
//!   not drift.
//! - The README's and `docs/`'s links between each other resolve, anchors
//!   included, and none leaves the repository.
//!
//! Plain text reads: no database, no build of the crate's items.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The kinds of change the map must route, as its rows' first cells say
/// them.
const REQUIRED_ROWS: [&str; 6] = [
    "a field of the delivery body",
    "an admin action",
    "a consumer endpoint",
    "a metric",
    "the retry policy",
    "a bound",
];

/// How many files one row may name: more, and the row is a tour, not a map.
const MAX_FILES_A_ROW: usize = 3;

/// Past this many lines a file needs a reason at its top.
const MAX_LINES: usize = 400;

/// The marker of that reason.
const REASON: &str = "Over 400 lines:";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The rows of the table under `# Where a change goes` in `src/lib.rs`'s
/// module doc, each as its cells (header and separator left out).
fn map_rows() -> Vec<Vec<String>> {
    let lib = read(&root().join("src/lib.rs"));
    let doc = lib
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| l.trim_start_matches("//!").trim());
    let section = doc
        .skip_while(|l| *l != "# Where a change goes")
        .skip(1)
        .take_while(|l| !l.starts_with('#'));
    let rows: Vec<Vec<String>> = section
        .filter(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect();
    assert!(
        rows.len() > 2,
        "src/lib.rs has no \"# Where a change goes\" table in its module doc"
    );
    rows.into_iter()
        .skip(2)
        .filter(|r| !r.iter().all(|c| c.chars().all(|ch| ch == '-')))
        .collect()
}

/// The repository paths a row names: its backticked words with a `/` in
/// them (`src/retry.rs`, `src/db/`), not URL paths (`/api/v1/...`) nor
/// patterns (`src/db/<room>.rs`).
fn named_paths(cells: &[String]) -> Vec<String> {
    let row = cells.join(" | ");
    row.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| t.contains('/') && !t.starts_with('/'))
        .filter(|t| !t.contains(|c: char| c.is_whitespace() || "<>*{}$".contains(c)))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_map_has_a_row_for_each_kind_of_change() {
    let rows = map_rows();
    let firsts: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    let missing: Vec<&str> = REQUIRED_ROWS
        .iter()
        .copied()
        .filter(|want| !firsts.contains(want))
        .collect();
    assert!(
        missing.is_empty(),
        "src/lib.rs's \"Where a change goes\" has no row for {missing:?} (its rows: {firsts:?})"
    );
}

#[test]
fn each_row_names_at_most_three_files_and_each_exists() {
    let mut wrong = Vec::new();
    for row in map_rows() {
        let paths = named_paths(&row);
        if paths.is_empty() {
            wrong.push(format!("{:?} names no file", row[0]));
        }
        if paths.len() > MAX_FILES_A_ROW {
            wrong.push(format!(
                "{:?} names {} files, at most {MAX_FILES_A_ROW}: {paths:?}",
                row[0],
                paths.len()
            ));
        }
        for path in paths {
            if !root().join(&path).exists() {
                wrong.push(format!("{:?} names {path}, which does not exist", row[0]));
            }
        }
    }
    assert!(wrong.is_empty(), "src/lib.rs's map:\n{}", wrong.join("\n"));
}

/// Every `.rs` file under `dir`, in name order.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The reason a file's module doc (its leading `//!` lines) gives for its
/// length, if it gives one: the words after the marker, up to the end of
/// its paragraph.
fn reason_for_length(source: &str) -> Option<String> {
    let doc: Vec<&str> = source
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| l.trim_start_matches("//!").trim())
        .collect();
    let at = doc.iter().position(|l| l.contains(REASON))?;
    let first = doc[at].split_once(REASON)?.1;
    let rest = doc[at + 1..].iter().take_while(|l| !l.is_empty());
    let reason = std::iter::once(first)
        .chain(rest.copied())
        .collect::<Vec<_>>()
        .join(" ");
    // A reason is a sentence, not a word or two.
    (reason.split_whitespace().count() >= 5).then_some(reason)
}

#[test]
fn files_over_400_lines_say_why_at_their_top() {
    let mut silent = Vec::new();
    for path in rust_files(&root().join("src")) {
        let source = read(&path);
        let lines = source.lines().count();
        if lines > MAX_LINES && reason_for_length(&source).is_none() {
            let shown = path.strip_prefix(root()).unwrap().display().to_string();
            silent.push(format!("{shown} ({lines} lines)"));
        }
    }
    assert!(
        silent.is_empty(),
        "over {MAX_LINES} lines without a `//! {REASON} <why>` paragraph in the module doc \
         (give one, or split the file):\n{}",
        silent.join("\n")
    );
}

/// The anchors a Markdown file's headings make, as GitHub makes them:
/// lower case, punctuation but `-` and `_` dropped, spaces as `-`, and a
/// repeated heading numbered (`-1`, `-2`).
fn anchors(markdown: &str) -> Vec<String> {
    let mut made: Vec<String> = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let title = line.trim_start_matches('#');
        if fenced || title.len() == line.len() || !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        made.push(if *n == 0 { slug } else { format!("{slug}-{n}") });
        *n += 1;
    }
    made
}

/// The targets of a Markdown file's inline links (`[text](target)`), code
/// blocks left out.
fn link_targets(markdown: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for piece in line.split("](").skip(1) {
            if let Some(end) = piece.find(')') {
                let target = &piece[..end];
                if !target.is_empty() && !target.contains(char::is_whitespace) {
                    targets.push(target.to_owned());
                }
            }
        }
    }
    targets
}

#[test]
fn the_readme_and_docs_links_resolve_inside_the_repository() {
    let mut pages = vec![root().join("README.md"), root().join("BENCHMARKS.md")];
    let mut docs: Vec<PathBuf> = fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    let mut broken = Vec::new();
    for page in &pages {
        let text = read(page);
        let shown = page.strip_prefix(root()).unwrap().display().to_string();
        if text.contains("../shared") {
            broken.push(format!("{shown} points outside the repository (../shared)"));
        }
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let dest = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            let Ok(dest) = dest.canonicalize() else {
                broken.push(format!("{shown}: {target}: no such file"));
                continue;
            };
            if !dest.starts_with(root().canonicalize().unwrap()) {
                broken.push(format!("{shown}: {target}: outside the repository"));
            } else if !anchor.is_empty()
                && dest.extension().is_some_and(|e| e == "md")
                && !anchors(&read(&dest)).iter().any(|a| a == anchor)
            {
                broken.push(format!("{shown}: {target}: no such heading"));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
