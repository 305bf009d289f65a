//! The kinds catalogue's statements (`sql/functions/0100_kinds.sql` and
//! its table `watchpump.kinds`). What a kind may declare is checked in
//! [`crate::kinds`].

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgConnection, PgPool};

/// A declared kind, as consumers read it.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Kind {
    pub name: String,
    pub description: String,
    #[schema(value_type = Object)]
    pub schema: Value,
    #[schema(value_type = Object)]
    pub example: Value,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// `watchpump.kind_violation()`: why `value` does not fit `schema`, or
/// None when it does.
pub async fn kind_violation(
    conn: &mut PgConnection,
    schema: &Value,
    value: &Value,
) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        r#"select watchpump.kind_violation($1, $2, '$') as "violation?""#,
        schema,
        value
    )
    .fetch_one(conn)
    .await
}

/// Declares a kind or replaces its declaration; whether it is new. A
/// schema too large as stored violates `kinds_schema_size`.
pub async fn upsert_kind(
    conn: &mut PgConnection,
    name: &str,
    description: &str,
    schema: &Value,
    example: &Value,
) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"insert into watchpump.kinds as k (name, description, schema, example)
           values ($1, $2, $3, $4)
           on conflict (name) do update
               set description = excluded.description, schema = excluded.schema,
                   example = excluded.example, updated_at = now()
           returning k.created_at = k.updated_at as "created!""#,
        name,
        description,
        schema,
        example
    )
    .fetch_one(conn)
    .await
}

/// Declared kinds by name, after `after`, `limit` at most.
pub async fn kinds_after(pool: &PgPool, after: &str, limit: i64) -> sqlx::Result<Vec<Kind>> {
    sqlx::query_as!(
        Kind,
        "select name, description, schema, example, created_at, updated_at
         from watchpump.kinds where name > $1 order by name limit $2",
        after,
        limit
    )
    .fetch_all(pool)
    .await
}

/// Removes a declaration; whether there was one.
pub async fn delete_kind(pool: &PgPool, name: &str) -> sqlx::Result<bool> {
    let removed = sqlx::query!("delete from watchpump.kinds where name = $1", name)
        .execute(pool)
        .await?
        .rows_affected();
    Ok(removed > 0)
}
