//! The workspace's integration tests, in one binary (one link of dfdx and tract instead of one
//! per file). The slow checks (full-schedule accuracy runs, long ONNX runs) are `#[ignore]`d
//! with the reason: the README's slow tier runs them (`cargo test-slow`). The macros' trybuild
//! tests are in `tests/ui/`, a package of their own.

mod accuracy;
mod cli;
mod derive;
mod determinism;
mod error_messages;
mod hostile;
mod loaders_fuzz;
#[cfg(feature = "tract")]
mod onnx;
mod properties;
mod registry;
mod safety;
mod sensitivity;
