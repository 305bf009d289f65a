//! The library's error type: what can go wrong below the HTTP layer.

/// An error from the database, from configuration, or from bad input to a
/// library call. The API maps these to HTTP statuses in [`crate::api::error`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("invalid input: {0}")]
    Invalid(String),
    /// A named thing (a service, a delivery) does not exist.
    #[error("{0}")]
    NotFound(String),
    #[error("configuration: {0}")]
    Config(String),
    /// The database could not be reached: the cause, and what to check.
    #[error("{0}")]
    Connect(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
