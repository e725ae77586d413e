//! The `tap-probe` binary: everything is in the library, so the integration tests and the
//! fuzz target reach the same code.
#![expect(
    unused_crate_dependencies,
    reason = "the library uses the package's dependencies; the binary only calls it"
)]

fn main() -> std::process::ExitCode {
    tap_probe::main()
}
