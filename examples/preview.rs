//! `cargo run --example preview`, with `make run` running: one preview per
//! open merge request of `acme/web` (`consumers/preview.rs`). Try
//! `target/release/watchpump emit acme/web/merge_requests/7 opened '{"head": "a1b2"}'`.

#[path = "consumers/mod.rs"]
mod consumers;
#[path = "consumers/run.rs"]
mod run;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    run::main(consumers::preview::consumer(), |_| {}).await
}
