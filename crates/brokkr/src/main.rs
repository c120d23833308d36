//! The `brokkr` command: see the library's documentation for what it offers.

fn main() -> std::process::ExitCode {
    brokkr::main()
}
