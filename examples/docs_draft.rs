//! `cargo run --example docs_draft`, with `make run` running: a docs draft
//! for every push to `acme/web` that touches `docs/`
//! (`consumers/docs_draft.rs`). Try
//! `target/release/watchpump emit acme/web/refs/heads/main push '{"after": "77aa", "paths": ["docs/index.md"]}'`.

#[path = "consumers/mod.rs"]
mod consumers;
#[path = "consumers/run.rs"]
mod run;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    run::main(consumers::docs_draft::consumer(), |_| {}).await
}
