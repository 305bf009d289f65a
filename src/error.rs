//! The library's error type: what can go wrong below the HTTP layer.

/// An error from the database, from configuration, or from bad input to a
/// library call. The HTTP front ends map these to statuses in
/// [`crate::http::error`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("invalid input: {0}")]
    Invalid(String),
    /// A named thing (a service, a delivery) does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A thing not in a state that allows what was asked (retrying a
    /// delivery that is on its way).
    #[error("{0}")]
    Conflict(String),
    #[error("configuration: {0}")]
    Config(String),
    /// The database could not be reached: the cause, and what to check.
    #[error("{0}")]
    Connect(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// An error a `watchpump.*` SQL function raised on purpose, by its
    /// SQLSTATE (`sql/functions/0600_operator.sql` lists them): P0002 no
    /// such thing, 55000 not in a state that allows it, 22023 and 22004 a
    /// bad argument; the function's name is taken off the message. Any
    /// other error stays a database error.
    pub fn raised(e: sqlx::Error) -> Error {
        if let sqlx::Error::Database(d) = &e {
            let message = d
                .message()
                .split_once(": ")
                .filter(|(f, _)| f.starts_with("watchpump."))
                .map_or(d.message(), |(_, m)| m)
                .to_string();
            match d.code().as_deref() {
                Some("P0002") => return Error::NotFound(message),
                Some("55000") => return Error::Conflict(message),
                Some("22023") | Some("22004") => return Error::Invalid(message),
                _ => {}
            }
        }
        Error::Database(e)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
