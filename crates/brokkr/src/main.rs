//! The `brokkr` command: see the library's documentation for what it offers.

/// mimalloc instead of the system allocator: a lifecycle (provision, bind, unbind, deprovision)
/// costs brokkr about a fifth less CPU, for about 16 MB more resident memory, the same at any
/// load or store size (docs/benchmarks.md, "The durable write path").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    brokkr::main()
}
