//! The SQL's own import graph (issue 35): each file of `sql/functions` is a
//! room on a numbered floor (`0300_settle.sql` is on floor 3), and a room
//! calls only what its own file, an earlier room of its floor or a lower
//! floor defines, never a later file (the floors and what each holds:
//! the top of `sql/functions/0000_vocabulary.sql`). Migrations define
//! what is below every floor.
//!
//! This reads the files as text: the functions and views each file
//! defines, and in each definition the calls `watchpump.<name>(` of
//! functions and the views it reads, comments left out. It fails naming
//! every call that goes up, and every function or view defined in two
//! rooms (the later would silently replace the earlier).

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// A function or view of a room, and what its body names.
#[derive(Debug)]
struct Definition {
    /// The room's index in name order.
    room: usize,
    name: String,
    view: bool,
    body: String,
}

/// The SQL files of `dir`, in name order: (file name, text).
fn sql_files(dir: &str) -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<(String, String)> = fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "sql"))
        .map(|path| {
            let name = path.file_name().unwrap().to_str().unwrap().to_owned();
            (name, fs::read_to_string(&path).unwrap())
        })
        .collect();
    files.sort();
    files
}

/// `sql` without its `--` comments (a `--` inside a string literal is
/// kept), in lower case.
fn without_comments(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            in_string = c != '\'';
            out.push(c);
        } else if c == '\'' {
            in_string = true;
            out.push(c);
        } else if c == '-' && chars.peek() == Some(&'-') {
            for c in chars.by_ref() {
                if c == '\n' {
                    out.push('\n');
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out.to_lowercase()
}

/// Where each `create [or replace] function|view watchpump.<name>` begins
/// in `sql` (lower case, no comments): (offset of the body after the name,
/// name, whether it is a view).
fn headers(sql: &str) -> Vec<(usize, usize, String, bool)> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = sql[from..].find("create ").map(|i| from + i) {
        from = at + "create ".len();
        let mut rest = sql[from..].trim_start();
        if let Some(r) = rest.strip_prefix("or replace ") {
            rest = r.trim_start();
        }
        let (view, rest) = match (rest.strip_prefix("function "), rest.strip_prefix("view ")) {
            (Some(r), _) => (false, r.trim_start()),
            (_, Some(r)) => (true, r.trim_start()),
            _ => continue,
        };
        let Some(rest) = rest.strip_prefix("watchpump.") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let body = sql.len() - rest.len() + name.len();
        found.push((at, body, name, view));
    }
    found
}

/// The names `watchpump.<name>` in `body`, each with whether a `(` follows
/// it (a call).
fn references(body: &str) -> Vec<(String, bool)> {
    body.match_indices("watchpump.")
        .map(|(at, prefix)| {
            let rest = &body[at + prefix.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let call = rest[name.len()..].trim_start().starts_with('(');
            (name, call)
        })
        .filter(|(name, _)| !name.is_empty())
        .collect()
}

/// The definitions of `rooms` (file name, text), in order.
fn definitions(rooms: &[(String, String)]) -> Vec<Definition> {
    let mut all = Vec::new();
    for (room, (_, text)) in rooms.iter().enumerate() {
        let sql = without_comments(text);
        let found = headers(&sql);
        for (i, (_, body, name, view)) in found.iter().enumerate() {
            let end = found.get(i + 1).map_or(sql.len(), |next| next.0);
            all.push(Definition {
                room,
                name: name.clone(),
                view: *view,
                body: sql[*body..end].to_owned(),
            });
        }
    }
    all
}

/// The floor of a room: the hundreds of its number (`0550_pause.sql`: 5).
fn floor(room: &str) -> u32 {
    room.get(..4)
        .and_then(|n| n.parse::<u32>().ok())
        .map_or(0, |n| n / 100)
}

/// What is wrong with `rooms` (file name, text, in name order) over
/// `below` (what migrations define): each call or view read that goes to
/// a later room, each name defined by two rooms.
fn violations(rooms: &[(String, String)], below: &[(String, String)]) -> Vec<String> {
    let defined = definitions(rooms);
    let mut problems = Vec::new();
    // Where each name is defined: its first room; migrations' are None.
    let mut home: BTreeMap<String, (Option<usize>, bool)> = BTreeMap::new();
    for d in definitions(below) {
        home.insert(d.name, (None, d.view));
    }
    for d in &defined {
        match home.get(&d.name) {
            Some((Some(first), _)) if *first != d.room => problems.push(format!(
                "watchpump.{}: defined in {} and again in {} (one room each)",
                d.name, rooms[*first].0, rooms[d.room].0
            )),
            Some((Some(_), _)) => {}
            _ => {
                home.insert(d.name.clone(), (Some(d.room), d.view));
            }
        }
    }
    for d in &defined {
        for (name, call) in references(&d.body) {
            let Some(&(Some(room), view)) = home.get(&name) else {
                continue;
            };
            // A function is reached by a call, a view by reading it.
            if room > d.room && call != view {
                let (caller, callee) = (&rooms[d.room].0, &rooms[room].0);
                problems.push(format!(
                    "{caller} (floor {}): {}{} {} watchpump.{name}{}, defined in {callee} (floor {}): \
                     a room calls only its own floor's earlier rooms and the floors below",
                    floor(caller),
                    d.name,
                    if d.view { " (a view)" } else { "()" },
                    if view { "reads" } else { "calls" },
                    if view { "" } else { "()" },
                    floor(callee),
                ));
            }
        }
    }
    problems.dedup();
    problems
}

#[test]
fn no_room_calls_a_function_or_reads_a_view_of_a_higher_floor() {
    let rooms = sql_files("sql/functions");
    let problems = violations(&rooms, &sql_files("sql/migrations"));
    assert!(
        problems.is_empty(),
        "the SQL's floors (sql/functions/0000_vocabulary.sql) are broken:\n  {}",
        problems.join("\n  ")
    );
}

/// The reading itself: it finds the rooms' functions, views and calls, so
/// that the test above cannot pass by reading nothing.
#[test]
fn the_rooms_are_read_with_their_functions_views_and_calls() {
    let rooms = sql_files("sql/functions");
    assert!(
        rooms.len() >= 8,
        "{:?}",
        rooms.iter().map(|r| &r.0).collect::<Vec<_>>()
    );
    let defined = definitions(&rooms);
    assert!(defined.len() >= 90, "{} definitions", defined.len());
    let find = |name: &str| {
        defined
            .iter()
            .find(|d| d.name == name)
            .unwrap_or_else(|| panic!("no definition of watchpump.{name}"))
    };
    let claim = references(&find("claim").body);
    for callee in ["stream_lock", "supersede_older"] {
        assert!(claim.contains(&(callee.to_owned(), true)), "{claim:?}");
    }
    assert!(find("deliveries").view && !find("claim").view);
    assert!(references(&find("ping").body).contains(&("deliveries".to_owned(), false)));
    for (room, _) in &rooms {
        assert!(
            room.len() > 5 && room[..4].bytes().all(|b| b.is_ascii_digit()),
            "{room}"
        );
    }
}

#[test]
fn a_call_up_a_floor_and_a_room_defining_another_rooms_function_are_named() {
    let rooms = vec![
        (
            "0000_low.sql".to_owned(),
            "-- watchpump.high() in a comment is no call\n\
             create or replace function watchpump.low() returns int language sql as $$\n\
                 select watchpump.high() + length('--') $$;\n\
             create or replace function watchpump.fine() returns int language sql as $$\n\
                 select watchpump.low() $$;"
                .to_owned(),
        ),
        (
            "0100_high.sql".to_owned(),
            "create or replace view watchpump.listing as select 1;\n\
             create or replace function watchpump.high() returns int language sql as $$\n\
                 select count(*) from watchpump.listing $$;\n\
             create function watchpump.low() returns int language sql as $$ select 2 $$;"
                .to_owned(),
        ),
        (
            "0200_top.sql".to_owned(),
            "create or replace function watchpump.top() returns void language plpgsql as $$\n\
             begin perform watchpump.high(); perform from watchpump.listing; \
             perform watchpump.from_a_migration(); end $$;"
                .to_owned(),
        ),
    ];
    let below = vec![(
        "0001_core.sql".to_owned(),
        "create function watchpump.from_a_migration() returns void language sql as $$ $$;"
            .to_owned(),
    )];
    let problems = violations(&rooms, &below);
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(
        problems[0].contains("watchpump.low: defined in 0000_low.sql and again in 0100_high.sql")
    );
    assert!(
        problems[1].starts_with("0000_low.sql (floor 0): low() calls watchpump.high(), defined in 0100_high.sql (floor 1)"),
        "{problems:#?}"
    );
}
