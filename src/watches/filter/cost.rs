//! What a filter costs `emit()`, in units: one unit is one comparison
//! evaluated on every node of the payload.
//!
//! The grammar keeps every filter linear in the payload (see the module
//! documentation), but linear with very different constants, and the
//! per-object cap in [`crate::watches`] needs to add filters up. Measured on
//! the bench machine (PostgreSQL 15, a payload of 2,000 paths of about 40
//! characters, each filter selecting nothing so that every item is read):
//!
//! | filter | per evaluation |
//! |---|---|
//! | `$.paths[*] ? (@ starts with "zzz")` | 0.2-0.3 ms |
//! | eight `@ == "..."` joined by `\|\|` | 2.5-2.7 ms |
//! | eight `@ < "..."` (the dearest comparison) | 2.8-3.6 ms |
//! | eight `exists(@.a)` | 0.9 ms |
//! | `@ like_regex "Q"` | 0.8 ms |
//! | `@ like_regex "^src/.*\\.rsx$"` | 1.7 ms |
//! | `@ like_regex` of weight 16 (`.*` fifteen times, then `Q`) | 4-5 ms |
//! | `@ like_regex` of weight 32 | 18-20 ms |
//! | `@ like_regex` of weight 64 | 60-84 ms |
//!
//! So a comparison, `starts with` or `exists` costs [`CONDITION`] (about
//! 0.36 ms at worst on that payload), and a `like_regex` costs
//! [`REGEX_BASE`] plus its weight (the atoms of its pattern once counted
//! repetitions are expanded): PostgreSQL's matcher is a lazily built DFA
//! whose states are sets of NFA states, rebuilt for every string it
//! matches, so each character costs up to the number of states, and past 16
//! the measured cost grows faster than the weight (hence
//! [`super::MAX_REGEX_WEIGHT`]). The walk itself (steps, wildcards, the
//! filter's loop) costs less than a comparison per node; a filter costs at
//! least one unit, so that a filter without conditions is not free.

/// A comparison, `starts with` or `exists`.
pub const CONDITION: u64 = 1;

/// A `like_regex` before its pattern's weight: matching even a one-character
/// pattern costs about three comparisons (compiling is cached per backend,
/// 32 patterns at a time).
pub const REGEX_BASE: u64 = 4;

/// What a `like_regex` whose pattern weighs `weight` costs.
pub fn like_regex(weight: u64) -> u64 {
    REGEX_BASE + weight
}
