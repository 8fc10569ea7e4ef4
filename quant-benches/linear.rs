//! [`quant_dfdx::nn::Linear`] against dfdx's `Linear` (the same numbers, bit for bit): forward
//! and backward on a transformer's token batches (64 sequences of 16 tokens, 64 features to
//! 128 and back, and 64 to 64) and on a batch of 64 vectors (256 to 256), one thread.
//!
//! ```text
//! cargo bench -p quant-benches --bench linear
//! ```
//!
//! Rounds alternate the two layers (`common::compare`).

mod common;

use dfdx::prelude::*;
use quant_dfdx::nn::builders;

const ROUNDS: usize = 201;

fn tokens<const I: usize, const O: usize>(dev: &Cpu) {
    let theirs = dev.build_module::<Linear<I, O>, f32>();
    let ours = dev.build_module::<builders::Linear<I, O>, f32>();
    let x: Tensor<(usize, Const<16>, Const<I>), f32, Cpu> =
        dev.sample_normal_like(&(64, Const, Const));
    common::compare(
        &format!("Linear<{I}, {O}> forward + backward, input (64, 16, {I})"),
        x.shape().num_elements(),
        ROUNDS,
        ("dfdx Linear", || common::step(&x, |x| theirs.forward(x))),
        ("quant_dfdx Linear", || {
            common::step(&x, |x| ours.forward(x))
        }),
    );
}

fn main() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool");
    pool.install(|| {
        let dev = Cpu::default();
        tokens::<64, 128>(&dev);
        tokens::<128, 64>(&dev);
        tokens::<64, 64>(&dev);
        let theirs = dev.build_module::<Linear<256, 256>, f32>();
        let ours = dev.build_module::<builders::Linear<256, 256>, f32>();
        let x: Tensor<(usize, Const<256>), f32, Cpu> = dev.sample_normal_like(&(64, Const));
        common::compare(
            "Linear<256, 256> forward + backward, input (64, 256)",
            x.shape().num_elements(),
            ROUNDS,
            ("dfdx Linear", || common::step(&x, |x| theirs.forward(x))),
            ("quant_dfdx Linear", || {
                common::step(&x, |x| ours.forward(x))
            }),
        );
    });
}
