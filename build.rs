//! Lists the SQL files the schemas embed, so that a new migration or room
//! is a new file and nothing else: `sql/migrations/*.sql` then
//! `sql/functions/*.sql` for the producer's `watchpump` schema
//! (`src/schema.rs`), `sql/kit/migrations/*.sql` then
//! `sql/kit/functions/*.sql` for the kit's `watchpump_inbox`
//! (`src/kit/schema.rs`); each directory in name order. Migrations are
//! applied once each, function files again whenever their text changes
//! (`src/sql_files.rs`). The files are still embedded at build time
//! (`include_str!`): nothing reads them at run time.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;
use std::{env, fs};

fn main() {
    // A directory: cargo looks at every file under it, so an added,
    // removed or edited file builds again.
    println!("cargo:rerun-if-changed=sql");
    let out = env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    for (schema, dir) in [("watchpump", "sql"), ("kit", "sql/kit")] {
        let code = sql_files(dir);
        fs::write(Path::new(&out).join(format!("{schema}_sql_files.rs")), code)
            .expect("writing into OUT_DIR");
    }
}

/// A `&[SqlFile]` expression of `dir`'s migrations, then its functions.
fn sql_files(dir: &str) -> String {
    let mut names = BTreeSet::new();
    let mut code = String::from("&[\n");
    for (sub, reapply_on_change) in [("migrations", false), ("functions", true)] {
        for name in names_in(&format!("{dir}/{sub}")) {
            // One bookkeeping table holds both kinds, by name.
            assert!(
                names.insert(name.clone()),
                "{dir}: {name}.sql is both a migration and a function file: \
                 the schema's bookkeeping knows a file by its name alone"
            );
            let path = format!("/{dir}/{sub}/{name}.sql");
            writeln!(
                code,
                "    SqlFile {{ name: {name:?}, sql: include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), {path:?})), reapply_on_change: {reapply_on_change} }},"
            )
            .unwrap();
        }
    }
    code.push(']');
    code
}

/// The names (without `.sql`) of the SQL files in `dir`, sorted; each must
/// be `NNNN_words.sql`, so that name order is the order they are applied in.
fn names_in(dir: &str) -> Vec<String> {
    let manifest = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let entries =
        fs::read_dir(Path::new(&manifest).join(dir)).unwrap_or_else(|e| panic!("{dir}: {e}"));
    let mut names: Vec<String> = entries
        .map(|entry| entry.unwrap_or_else(|e| panic!("{dir}: {e}")).file_name())
        .filter_map(|file| file.to_str()?.strip_suffix(".sql").map(str::to_owned))
        .collect();
    for name in &names {
        let (number, words) = name.split_at(name.len().min(4));
        assert!(
            number.len() == 4
                && number.bytes().all(|b| b.is_ascii_digit())
                && words.len() > 1
                && words.starts_with('_')
                && words[1..]
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
            "{dir}/{name}.sql: a SQL file is named NNNN_words.sql (four digits, then \
             lower-case words joined by _), and applied in name order"
        );
    }
    names.sort();
    names
}
