//! Where a delivery is, as one enum: the six words the database uses, so
//! that a state is spelled once in Rust. The four settled states are the
//! check on `watchpump.settled.state` (`sql/migrations/0004_storage_v2.sql`);
//! a queued row is `in_flight` while its lease runs and `pending` otherwise,
//! as the view `watchpump.deliveries` (`sql/functions/0600_operator.sql`)
//! spells them. `tests/states.rs` holds the lists together.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A delivery's state. `Pending` and `InFlight` rows live in
/// `watchpump.queue`; the other four are settled and live in
/// `watchpump.settled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "producer", derive(utoipa::ToSchema))]
pub enum State {
    /// Waiting for its first or next attempt.
    Pending,
    /// Claimed by a pump and on the wire (a lease bounds it).
    InFlight,
    /// The consumer answered 2xx.
    Delivered,
    /// Newer news of the same (watch, object) took its place.
    Superseded,
    /// The consumer answered 410: its watch is gone, and with it the rest.
    Dropped,
    /// Its deadline passed, or the consumer refused it for good.
    Failed,
}

impl State {
    /// Every state, in the order the panel lists them.
    pub const ALL: [State; 6] = [
        State::Pending,
        State::InFlight,
        State::Delivered,
        State::Superseded,
        State::Dropped,
        State::Failed,
    ];

    /// The word the database stores.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::InFlight => "in_flight",
            State::Delivered => "delivered",
            State::Superseded => "superseded",
            State::Dropped => "dropped",
            State::Failed => "failed",
        }
    }

    /// Settled: no attempt will follow unless an operator retries it.
    pub fn is_settled(self) -> bool {
        !matches!(self, State::Pending | State::InFlight)
    }

    /// The states, comma-separated, for an error message.
    pub fn list() -> String {
        State::ALL.map(State::as_str).join(", ")
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A word that is not one of the six states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownState(pub String);

impl fmt::Display for UnknownState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown delivery state {:?}; one of {}",
            self.0,
            State::list()
        )
    }
}

impl std::error::Error for UnknownState {}

impl FromStr for State {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<State, UnknownState> {
        State::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_string()))
    }
}

/// For reading a `state` column (`#[sqlx(try_from = "String")]`).
impl TryFrom<String> for State {
    type Error = UnknownState;

    fn try_from(s: String) -> Result<State, UnknownState> {
        s.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_state_reads_back_from_its_word_and_serialises_as_it() {
        for state in State::ALL {
            assert_eq!(state.as_str().parse::<State>(), Ok(state));
            assert_eq!(
                serde_json::to_value(state).unwrap(),
                serde_json::json!(state.as_str())
            );
        }
        assert!("sent".parse::<State>().is_err());
        assert!("Pending".parse::<State>().is_err());
    }
}
