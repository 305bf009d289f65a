//! One convention for a page of a listing, whichever audience asks: the
//! size a query may ask for, and where the next page starts.
//!
//! Every listing, the consumer API's, the admin API's and the panel's, is
//! newest first (kinds: by name) and takes its cursor as `after`: the last
//! row of the page before, "what comes after it in this listing's order".
//! A page reads one row more than it shows, so that its cursor
//! (`next_after`, the panel's "Older" link) comes only when something
//! follows ([`cut`]).
//!
//! The admin API named its cursor `before`/`next_before` until issue 35,
//! and gave one whenever a page was full. Both names stay for its clients
//! and are deprecated ([`given`], [`AdminCursors`]): `next_before`
//! keeps its old meaning, so a client paging by it sees what it saw.

use crate::http::HttpError;

/// The page size `given` asks for (`default` when it asks for none), when
/// it lies in 1 to `max`; otherwise the message that says so, which each
/// API answers with its own status (the consumer API's 400, the admin
/// API's 422).
pub fn size(given: Option<i64>, default: i64, max: i64) -> Result<i64, String> {
    let size = given.unwrap_or(default);
    if (1..=max).contains(&size) {
        Ok(size)
    } else {
        Err(format!("limit must be 1 to {max}"))
    }
}

/// The consumer API's page: 100 rows when `limit` is not given.
pub const CONSUMER_DEFAULT: i64 = 100;

/// The consumer API's largest page: one page is one index range scan of at
/// most this many rows; asking for more is a 400
/// (tests/consumer_deliveries.rs).
pub const CONSUMER_MAX: i64 = 1000;

/// The page size a consumer API listing's `limit` asks for: 1 to
/// [`CONSUMER_MAX`], [`CONSUMER_DEFAULT`] when it asks for none, a 400
/// otherwise.
pub fn consumer_size(limit: Option<i64>) -> Result<i64, HttpError> {
    size(limit, CONSUMER_DEFAULT, CONSUMER_MAX).map_err(HttpError::BadRequest)
}

/// A page of `size` rows: `read` of one row more ([`ahead`]), [`cut`] with
/// the `cursor` of its last row when more follow.
pub async fn read<T, C, E>(
    size: i64,
    read: impl AsyncFnOnce(i64) -> Result<Vec<T>, E>,
    cursor: impl FnOnce(&T) -> C,
) -> Result<(Vec<T>, Option<C>), HttpError>
where
    HttpError: From<E>,
{
    let rows = read(ahead(size)).await?;
    Ok(cut(rows, size, cursor))
}

/// How many rows to read for a page of `size`: one more, to learn whether
/// another page follows without counting.
pub fn ahead(size: i64) -> i64 {
    size + 1
}

/// Rows read [`ahead`] of a page of `size`: the page, and the cursor of
/// its last row when more follow.
pub fn cut<T, C>(mut rows: Vec<T>, size: i64, cursor: impl FnOnce(&T) -> C) -> (Vec<T>, Option<C>) {
    let more = rows.len() as i64 > size;
    rows.truncate(size as usize);
    let next = if more { rows.last().map(cursor) } else { None };
    (rows, next)
}

/// The cursor a listing was given: `after`, or its deprecated name
/// `before` (the admin API's until issue 35); both at once is refused with
/// the message that says so.
pub fn given<C>(after: Option<C>, before: Option<C>) -> Result<Option<C>, String> {
    match (after, before) {
        (Some(_), Some(_)) => Err("give after or its old name before, not both".into()),
        (after, before) => Ok(after.or(before)),
    }
}

/// An admin API page's cursors: `next_after`, and for the deprecation
/// period its old name `next_before` with its old meaning.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct AdminCursors {
    /// Pass as `after` for the next (older) page; null on the last.
    next_after: Option<i64>,
    /// Deprecated: `next_after`'s old name, given whenever the page is
    /// full (so on a full last page too).
    #[schema(deprecated)]
    next_before: Option<i64>,
}

impl AdminCursors {
    /// The cursors of `rows`, a page of `size` whose next page starts
    /// after `next_after` ([`cut`]).
    pub fn of<T>(rows: &[T], size: i64, next_after: Option<i64>, id: impl FnOnce(&T) -> i64) -> Self {
        AdminCursors {
            next_after,
            next_before: cursor_if_full(rows, size, id),
        }
    }
}

/// The admin API's deprecated `next_before`: the last row's cursor whenever
/// the page is full, even when nothing follows.
fn cursor_if_full<T, C>(rows: &[T], size: i64, cursor: impl FnOnce(&T) -> C) -> Option<C> {
    if rows.len() as i64 == size {
        rows.last().map(cursor)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_outside_its_bounds_is_refused_with_them() {
        assert_eq!(size(None, 100, 1000), Ok(100));
        assert_eq!(size(Some(1000), 100, 1000), Ok(1000));
        assert_eq!(
            size(Some(0), 100, 1000),
            Err("limit must be 1 to 1000".into())
        );
        assert_eq!(
            size(Some(1001), 100, 1000),
            Err("limit must be 1 to 1000".into())
        );
    }

    #[test]
    fn a_cursor_only_when_a_row_follows_the_page() {
        let (page, next) = cut(vec![9, 8, 7], 2, |r| *r);
        assert_eq!((page, next), (vec![9, 8], Some(8)));
        let (page, next) = cut(vec![9, 8], 2, |r| *r);
        assert_eq!((page, next), (vec![9, 8], None));
    }

    #[test]
    fn a_cursor_by_its_name_or_its_old_one_but_not_both() {
        assert_eq!(given(Some(7), None), Ok(Some(7)));
        assert_eq!(given(None, Some(7)), Ok(Some(7)));
        assert_eq!(given::<i64>(None, None), Ok(None));
        assert!(given(Some(7), Some(8)).is_err());
    }

    #[test]
    fn the_admin_cursor_comes_with_every_full_page() {
        assert_eq!(cursor_if_full(&[9, 8], 2, |r| *r), Some(8));
        assert_eq!(cursor_if_full(&[9], 2, |r| *r), None);
    }
}
