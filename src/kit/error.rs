//! The kit's error type, below the HTTP layer: migrating the inbox, the
//! inbox's SQL, and calls to the producer's watches API.

/// What can go wrong in the kit's library calls. The events endpoint has its
/// own answers ([`crate::kit::answer::Refusal`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// Bad input to a kit call (a URL, a watch).
    #[error("invalid input: {0}")]
    Invalid(String),
    /// The producer's watches API could not be reached, or answered
    /// something that is not HTTP or not the expected JSON.
    #[error("the producer's watches API ({url}): {message}")]
    Http { url: String, message: String },
    /// The producer answered with an error status; `message` is its own.
    #[error("the producer's watches API answered {status}: {message}")]
    Refused { status: u16, message: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
