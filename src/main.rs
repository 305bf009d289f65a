//! The `watchpump` binary: see [`watchpump::cli`].

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    watchpump::cli::main()
}
