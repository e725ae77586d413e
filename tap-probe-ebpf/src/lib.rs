//! The eBPF objects are this package's binaries (`src/main.rs`, `src/bin/`). The library
//! target exists so that `tap-probe` can build-depend on the package, which makes cargo
//! rerun its build script when anything here changes.
#![no_std]
#![expect(
    unused_crate_dependencies,
    reason = "the binaries use the dependencies; the library is empty"
)]
