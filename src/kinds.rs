//! The kinds catalogue: each kind of change the producer emits, declared
//! with a JSON Schema of its payload and an example payload, so that a
//! consumer team can read every field without opening the producer's source
//! (`GET /api/v1/kinds`, `watchpump kinds list`, docs/protocol.md).
//!
//! Declaring kinds changes nothing for `emit()` until the producer turns on
//! strict mode (`update watchpump.settings set strict_kinds = true`): then
//! `watchpump.check_kind()` (`sql/functions/0100_kinds.sql`) refuses an
//! undeclared kind or a payload that does not fit its schema. With it off,
//! `emit()` reads its settings row and nothing else.
//!
//! # The schema subset, and why
//!
//! Strict mode checks inside the producer's transaction, so what a schema
//! may cost is bounded here, when it is added, never by running it:
//!
//! | bound | value | why |
//! |---|---|---|
//! | keywords | `type`, `required`, `properties`, `items` (one schema), `enum`, `additionalProperties: false`; annotations `title`, `description`, `$schema`, `$comment`, `examples` | each payload node is checked against at most one schema node, so a check is one pass over the payload |
//! | `enum` values | strings, numbers, booleans, null | the check looks a value up in a set made from the list, by a key only scalars have; an object or an array would have to be compared with each member |
//! | size | [`MAX_SCHEMA_BYTES`] (16 KiB) | the size of the set and property look-ups, and of the one-off preparation of the schema each check begins with |
//! | depth | [`MAX_DEPTH`] (8 levels of `properties`/`items`) | the recursion of the check |
//!
//! Anything else (`$ref`, `anyOf`, `pattern`, `minimum`, …) is refused with
//! a message naming it; the unit tests below prove each bound, and
//! `tests/kinds.rs` the refusals through the CLI and strict mode in emit().
//!
//! # What a check costs
//!
//! The schema bounds what one visit of a payload node costs, not how many
//! nodes there are: that is the payload's, up to 1 MiB (16 MiB if the
//! producer raises `watchpump.max_payload_bytes`). So a check counts its
//! work, one unit for each node it visits and each key or required name it
//! looks up, and stops at [`MAX_CHECK_UNITS`] with SQLSTATE 54000
//! (`watchpump.kind_max_visits()`, `sql/functions/0100_kinds.sql`, says
//! the same number). `tests/kinds.rs`
//! `a_1_mib_payload_against_the_costliest_schema_stops_at_the_work_cap`
//! emits a 1 MiB payload against the costliest schema this module accepts.

use serde::Deserialize;
use serde_json::Value;
use sqlx::{PgConnection, PgPool};

use crate::db::kinds as db;
pub use crate::db::kinds::Kind;
use crate::error::{Error, Result};

/// Largest schema accepted, as compact JSON text.
pub const MAX_SCHEMA_BYTES: usize = 16 * 1024;
/// Deepest nesting of `properties` and `items` accepted.
pub const MAX_DEPTH: usize = 8;
/// Longest kind name (as `watchpump.kinds` checks too).
pub const MAX_NAME_LEN: usize = 100;
/// Largest example payload accepted.
pub const MAX_EXAMPLE_BYTES: usize = 16 * 1024;
/// The most units of work (payload nodes visited, keys and required names
/// looked up) one strict-mode check may spend before `emit()` refuses the
/// change with SQLSTATE 54000: twice the 100,000 paths of the payload that
/// found the enum scan (issue 34). The costliest schema this module
/// accepts spends it in about a second (docs/security.md, "Bounds").
pub const MAX_CHECK_UNITS: i32 = 200_000;

const TYPES: &[&str] = &[
    "object", "array", "string", "number", "integer", "boolean", "null",
];
const ANNOTATIONS: &[&str] = &["title", "description", "$schema", "$comment", "examples"];

/// A kind to declare, as `watchpump kinds add` reads it (and as each entry
/// of a kinds file such as `kinds/git.json` reads).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewKind {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub schema: Value,
    pub example: Value,
}

/// A kinds file: `{"kinds": [NewKind, ...]}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KindsFile {
    pub kinds: Vec<NewKind>,
}

impl KindsFile {
    pub fn parse(text: &str) -> Result<KindsFile> {
        serde_json::from_str(text).map_err(|e| {
            Error::Invalid(format!(
                "not a kinds file ({{\"kinds\": [{{\"name\", \"description\", \"schema\", \"example\"}}, ...]}}): {e}"
            ))
        })
    }
}

/// Declares `new`, or replaces the declaration of a kind of that name;
/// returns whether it was new. Refuses (changing nothing) a bad name, a
/// schema outside the subset, or an example that does not fit the schema.
pub async fn add(pool: &PgPool, new: &NewKind) -> Result<bool> {
    let mut tx = pool.begin().await?;
    let created = add_in(&mut tx, new).await?;
    tx.commit().await?;
    Ok(created)
}

/// [`add`] in the caller's transaction: a kinds file is declared whole or
/// not at all.
pub async fn add_in(conn: &mut PgConnection, new: &NewKind) -> Result<bool> {
    validate_name(&new.name)?;
    check_schema(&new.schema)
        .map_err(|why| Error::Invalid(format!("the schema of kind {:?}: {why}", new.name)))?;
    if !new.example.is_object() {
        return Err(Error::Invalid(format!(
            "the example of kind {:?} must be a JSON object, as payloads are",
            new.name
        )));
    }
    if new.example.to_string().len() > MAX_EXAMPLE_BYTES {
        return Err(Error::Invalid(format!(
            "the example of kind {:?} is larger than {MAX_EXAMPLE_BYTES} bytes",
            new.name
        )));
    }
    let misfit = db::kind_violation(conn, &new.schema, &new.example).await?;
    if let Some(why) = misfit {
        return Err(Error::Invalid(format!(
            "the example of kind {:?} does not fit its schema: {why}",
            new.name
        )));
    }
    let created = db::upsert_kind(
        conn,
        &new.name,
        &new.description,
        &new.schema,
        &new.example,
    )
    .await
    .map_err(|e| match e {
        // The table bounds the schema as PostgreSQL stores it, where a
        // number takes more room than its text: say so, not the constraint.
        sqlx::Error::Database(d) if d.constraint() == Some("kinds_schema_size") => {
            Error::Invalid(format!(
                "the schema of kind {:?} takes more than {MAX_SCHEMA_BYTES} bytes as PostgreSQL stores it \
                 (jsonb, where a number takes more room than its text): make it smaller",
                new.name
            ))
        }
        e => Error::Database(e),
    })?;
    Ok(created)
}

/// Declared kinds by name, after `after` (keyset pages), `limit` at most.
pub async fn list(pool: &PgPool, after: &str, limit: i64) -> Result<Vec<Kind>> {
    Ok(db::kinds_after(pool, after, limit).await?)
}

/// Removes a declaration. In strict mode, emitting that kind is refused
/// from then on.
pub async fn remove(pool: &PgPool, name: &str) -> Result<()> {
    if !db::delete_kind(pool, name).await? {
        return Err(Error::NotFound(format!("no kind {name:?} is declared")));
    }
    Ok(())
}

fn validate_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.chars().count() > MAX_NAME_LEN
        || name.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(Error::Invalid(format!(
            "kind name {name:?} must be 1-{MAX_NAME_LEN} characters without spaces or control characters"
        )));
    }
    Ok(())
}

/// Whether `schema` is within the subset `watchpump.check_kind()` checks
/// (see the module's documentation); the reason when it is not.
pub fn check_schema(schema: &Value) -> std::result::Result<(), String> {
    let size = schema.to_string().len();
    if size > MAX_SCHEMA_BYTES {
        return Err(format!(
            "{size} bytes, more than the {MAX_SCHEMA_BYTES} a schema may have"
        ));
    }
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(
            "the top level must be {\"type\": \"object\", ...}: payloads are objects".into(),
        );
    }
    check_node(schema, "$", 0)
}

fn check_node(node: &Value, at: &str, depth: usize) -> std::result::Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "{at}: nested deeper than {MAX_DEPTH} levels of properties and items"
        ));
    }
    let Some(map) = node.as_object() else {
        return Err(format!("{at}: a schema must be a JSON object"));
    };
    for (key, value) in map {
        match key.as_str() {
            "type" => check_type(value, at)?,
            "required" => {
                let names = value.as_array().filter(|a| a.iter().all(Value::is_string));
                if names.is_none() {
                    return Err(format!(
                        "{at}: \"required\" must be a list of property names"
                    ));
                }
            }
            "properties" => {
                let Some(properties) = value.as_object() else {
                    return Err(format!("{at}: \"properties\" must be an object of schemas"));
                };
                for (name, sub) in properties {
                    check_node(sub, &format!("{at}.{name}"), depth + 1)?;
                }
            }
            "items" => check_node(value, &format!("{at}[*]"), depth + 1)?,
            "enum" => {
                let Some(values) = value.as_array().filter(|a| !a.is_empty()) else {
                    return Err(format!("{at}: \"enum\" must be a non-empty list"));
                };
                if let Some(i) = values.iter().position(|v| v.is_object() || v.is_array()) {
                    return Err(format!(
                        "{at}: \"enum\" may list strings, numbers, booleans and null, not {} (value {i})",
                        if values[i].is_object() { "an object" } else { "an array" }
                    ));
                }
            }
            "additionalProperties" => {
                if !value.is_boolean() {
                    return Err(format!(
                        "{at}: \"additionalProperties\" may only be true or false here, not a schema"
                    ));
                }
            }
            k if ANNOTATIONS.contains(&k) => {}
            other => {
                return Err(format!(
                "{at}: {other:?} is not supported; a schema may use type, required, properties, \
                     items, enum, additionalProperties (true or false) and the annotations {}",
                ANNOTATIONS.join(", ")
            ))
            }
        }
    }
    Ok(())
}

fn check_type(value: &Value, at: &str) -> std::result::Result<(), String> {
    let known = |v: &Value| v.as_str().is_some_and(|t| TYPES.contains(&t));
    let ok = match value {
        Value::Array(types) => !types.is_empty() && types.iter().all(known),
        v => known(v),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{at}: \"type\" must be one of, or a list of, {}",
            TYPES.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_subset_is_accepted() {
        let git = json!({"type": "object", "required": ["after"],
            "properties": {"after": {"type": "string", "description": "the new head"},
                           "paths": {"type": "array", "items": {"type": "string"}},
                           "state": {"enum": ["open", "merged", 1, 2.5, true, null]},
                           "n": {"type": ["integer", "null"]}},
            "additionalProperties": false});
        assert_eq!(check_schema(&git), Ok(()));
    }

    #[test]
    fn anything_outside_the_subset_is_refused_by_name() {
        for (schema, says) in [
            (json!({"type": "array"}), "top level"),
            (
                json!({"type": "object", "anyOf": []}),
                "\"anyOf\" is not supported",
            ),
            (
                json!({"type": "object", "properties": {"a": {"$ref": "#"}}}),
                "$.a: \"$ref\"",
            ),
            (
                json!({"type": "object", "properties": {"a": {"pattern": "x*"}}}),
                "\"pattern\"",
            ),
            (
                json!({"type": "object", "additionalProperties": {"type": "string"}}),
                "true or false",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "date"}}}),
                "\"type\" must be",
            ),
            (
                json!({"type": "object", "required": "a"}),
                "list of property names",
            ),
            (
                json!({"type": "object", "properties": {"a": {"enum": []}}}),
                "non-empty",
            ),
            (
                json!({"type": "object", "properties": {"a": {"enum": ["x", {"y": 1}]}}}),
                "$.a: \"enum\" may list strings, numbers, booleans and null, not an object (value 1)",
            ),
            (
                json!({"type": "object", "properties": {"a": {"enum": [[1]]}}}),
                "not an array (value 0)",
            ),
        ] {
            let why = check_schema(&schema).unwrap_err();
            assert!(why.contains(says), "{schema}: {why}");
        }
    }

    #[test]
    fn depth_and_size_are_bounded() {
        let mut deep = json!({"type": "string"});
        for _ in 0..MAX_DEPTH {
            deep = json!({"type": "array", "items": deep});
        }
        let too_deep = json!({"type": "object", "properties": {"a": deep.clone()}});
        assert!(check_schema(&too_deep)
            .unwrap_err()
            .contains("deeper than 8"));
        let deep_ok = deep["items"].clone();
        let ok = json!({"type": "object", "properties": {"a": deep_ok}});
        assert_eq!(check_schema(&ok), Ok(()));

        let wide: serde_json::Map<String, Value> = (0..2000)
            .map(|i| (format!("p{i}"), json!({"type": "string"})))
            .collect();
        let big = json!({"type": "object", "properties": wide});
        assert!(check_schema(&big).unwrap_err().contains("16384"));
    }

    #[test]
    fn names_are_bounded_and_printable() {
        assert!(validate_name("push").is_ok());
        assert!(validate_name("merge_request.opened").is_ok());
        for bad in ["", "two words", "tab\t", &"k".repeat(101)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }
}
