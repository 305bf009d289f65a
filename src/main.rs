//! The `watchpump` binary: see [`watchpump::cli`].

fn main() -> std::process::ExitCode {
    watchpump::cli::main()
}
