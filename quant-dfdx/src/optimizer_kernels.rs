//! dfdx's optimizer kernels for `f32` on the CPU, instantiated in this crate.
//!
//! Not public API. A crate that trains calls dfdx's `Adam` or `Sgd`, whose per-element kernels
//! are generic over the element type and so are compiled into that crate. The facade, its tests
//! and its examples compile without optimisation in the dev and test profiles (see the
//! workspace's `Cargo.toml`); there, Adam's loop ran unoptimised, with a library call for every
//! `powi` and `sqrt`. Rust's sharing of generic instances between crates built at opt-level 0
//! or 1 makes such a crate link to the copy instantiated here, in an optimised crate, instead.
//! Release builds instantiate the kernels where they are used and ignore this copy.

use dfdx::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use dfdx::prelude::*;

/// Runs one Adam and one SGD step on a one-weight linear layer, which instantiates both
/// kernels for `f32` on the CPU here.
#[doc(hidden)]
pub fn instantiate_f32_optimizer_kernels() -> Result<(), OptimizerUpdateError<CpuError>> {
    let dev = Cpu::default();
    let mut model = dev.build_module::<dfdx::nn::builders::Linear<1, 1>, f32>();
    let grads = model.alloc_grads();
    Adam::new(&model, AdamConfig::default()).update(&mut model, &grads)?;
    Sgd::new(&model, SgdConfig::default()).update(&mut model, &grads)
}
