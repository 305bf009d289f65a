//! `watchpump emit`: the payload as given (an argument, stdin or a file),
//! the change emitted with the count of deliveries it made, and emit()'s
//! refusals as messages.

use crate::error::{Error, Result};

/// The payload of `watchpump emit`: the argument itself, `-` for stdin or
/// `@FILE`; a JSON object without NUL characters (jsonb cannot hold them).
pub(super) fn read_payload(arg: &str) -> Result<serde_json::Value> {
    use std::io::Read;
    let text = match arg {
        "-" => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| Error::Invalid(format!("cannot read the payload from stdin: {e}")))?;
            text
        }
        _ => match arg.strip_prefix('@') {
            Some(path) => std::fs::read_to_string(path).map_err(|e| {
                Error::Invalid(format!("cannot read the payload from {path:?}: {e}"))
            })?,
            None => arg.to_string(),
        },
    };
    let payload: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Invalid(format!("payload is not JSON: {e}")))?;
    if !payload.is_object() {
        return Err(Error::Invalid("payload must be a JSON object".into()));
    }
    if holds_nul(&payload) {
        return Err(Error::Invalid(
            "payload contains a NUL character (\\u0000), which PostgreSQL's jsonb cannot store"
                .into(),
        ));
    }
    Ok(payload)
}

fn holds_nul(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(items) => items.iter().any(holds_nul),
        serde_json::Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || holds_nul(v)),
        _ => false,
    }
}

/// `watchpump emit`: the change and how many deliveries it made.
pub(super) async fn emit_one(
    pool: &sqlx::PgPool,
    object: &str,
    kind: &str,
    payload: &serde_json::Value,
) -> std::result::Result<(i64, i64), sqlx::Error> {
    let mut tx = pool.begin().await?;
    let counted = crate::db::operator::emit_counted(&mut tx, object, kind, payload).await?;
    tx.commit().await?;
    Ok(counted)
}

/// emit()'s refusals (bad input, strict mode's 22023 and 23514) as the
/// message it raised; a schema older than this binary as what to run.
pub(super) fn emit_error(e: sqlx::Error) -> Error {
    let code = match &e {
        sqlx::Error::Database(d) => d.code().map(|c| c.to_string()),
        _ => None,
    };
    match code.as_deref() {
        // undefined_function, undefined_table, invalid_schema_name
        Some("42883" | "42P01" | "3F000") => Error::NotFound(format!(
            "{e}: the watchpump schema is missing or older than this binary; run `watchpump migrate`"
        )),
        Some("23514") => match e {
            sqlx::Error::Database(d) => Error::Invalid(
                d.message()
                    .trim_start_matches("watchpump.emit: ")
                    .to_string(),
            ),
            e => Error::Database(e),
        },
        _ => Error::raised(e),
    }
}
