//! `cargo run --example deploy`, with `make run` running: app `web-prod`
//! follows pushes to `acme/web/refs/heads/main` and deploys the newest
//! (`consumers/deploy.rs`). Try
//! `target/release/watchpump emit acme/web/refs/heads/main push '{"after": "9f2c1e"}'`.

#[path = "consumers/mod.rs"]
mod consumers;
#[path = "consumers/run.rs"]
mod run;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    run::main(consumers::deploy::consumer(), |pool| {
        tokio::spawn(consumers::deploy::work(pool));
    })
    .await
}
