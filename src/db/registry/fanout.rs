//! What the bounds on a new watch read (`watchpump.watches`,
//! `watchpump.fanout_budgets`): the filters the per-service filter cap
//! ([`crate::watches::cap`]) sums, and the holdings, locks and budgets of the
//! fan-out budget ([`crate::watches::fanout`]), which the operator sets.

use sqlx::{PgConnection, PgExecutor, PgPool};

/// The filter texts, as the consumers sent them, of the service's live
/// watches on `object`, on its prefixes, and (for a prefix) under it.
pub async fn covering_filters(
    tx: &mut PgConnection,
    service_id: i64,
    object: &str,
) -> sqlx::Result<Vec<String>> {
    // Two branches so that the first uses the index on object; the second
    // only runs for a prefix (a one-time filter on the parameter).
    sqlx::query_scalar!(
        r#"select coalesce(filters->>'match', match_path::text) as "filter!" from watchpump.watches
           where object = any (watchpump.object_prefixes($2))
             and service_id = $1 and removed_at is null and match_path is not null
           union all
           select coalesce(filters->>'match', match_path::text) from watchpump.watches
           where right($2, 1) = '/' and starts_with(object, $2) and object <> $2
             and service_id = $1 and removed_at is null and match_path is not null"#,
        service_id,
        object
    )
    .fetch_all(tx)
    .await
}

/// How many live watches the service holds on exactly `object`.
pub async fn count_live_watches_on(
    tx: &mut PgConnection,
    service_id: i64,
    object: &str,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"select count(*) as "count!" from watchpump.watches
           where object = $2 and service_id = $1 and removed_at is null"#,
        service_id,
        object
    )
    .fetch_one(tx)
    .await
}

/// The advisory lock of a top segment's fan-out budget, until the
/// transaction ends: two creates under one top wait for each other.
pub async fn lock_fanout_top(tx: &mut PgConnection, top: &str) -> sqlx::Result<()> {
    sqlx::query!(
        r#"select pg_advisory_xact_lock(hashtextextended('watchpump.fanout:' || $1, 0)) as "locked""#,
        top
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// `watchpump.fanout_budget()` of the top segment `top`.
pub async fn fanout_budget(conn: impl PgExecutor<'_>, top: &str) -> sqlx::Result<i32> {
    sqlx::query_scalar!(r#"select watchpump.fanout_budget($1) as "budget!""#, top)
        .fetch_one(conn)
        .await
}

/// One service's live watches on one object: how many have no filter, and
/// the filter texts of the others.
pub struct Holding {
    pub object: String,
    pub service_id: i64,
    pub unfiltered: i64,
    pub filters: Vec<String>,
}

/// The live watches that can cover `object` (on it, on its prefixes, and
/// for a prefix under it), or every live watch when `object` is None.
pub async fn holdings(conn: &mut PgConnection, object: Option<&str>) -> sqlx::Result<Vec<Holding>> {
    sqlx::query_as!(
        Holding,
        r#"select object, service_id,
                  count(*) filter (where match_path is null) as "unfiltered!",
                  coalesce(array_agg(coalesce(filters->>'match', match_path::text))
                           filter (where match_path is not null), '{}') as "filters!"
           from watchpump.watches
           where removed_at is null
             and ($1::text is null
                  or object = any (watchpump.object_prefixes($1))
                  or (right($1, 1) = '/' and starts_with(object, $1)))
           group by object, service_id"#,
        object
    )
    .fetch_all(conn)
    .await
}

/// Every service's id and name, removed ones too.
pub struct ServiceName {
    pub id: i64,
    pub name: String,
}

pub async fn service_names(conn: &mut PgConnection) -> sqlx::Result<Vec<ServiceName>> {
    sqlx::query_as!(ServiceName, "select id, name from watchpump.services")
        .fetch_all(conn)
        .await
}

/// The top segments with a budget the operator set.
pub async fn budgeted_tops(conn: &mut PgConnection) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!("select top_segment from watchpump.fanout_budgets")
        .fetch_all(conn)
        .await
}

pub async fn set_fanout_budget(
    pool: &PgPool,
    top: &str,
    units: i32,
    actor: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "insert into watchpump.fanout_budgets (top_segment, units, set_by)
         values ($1, $2, $3)
         on conflict (top_segment) do update
         set units = excluded.units, set_at = now(), set_by = excluded.set_by",
        top,
        units,
        actor
    )
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn clear_fanout_budget(pool: &PgPool, top: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "delete from watchpump.fanout_budgets where top_segment = $1",
        top
    )
    .execute(pool)
    .await?;
    Ok(())
}
