//! [`quant_dfdx::nn::Relu`] against dfdx's `ReLU` (the same numbers, bit for bit): forward and
//! backward on the MNIST CNN's first activations at batch 64 (64 × 16 × 28 × 28: 802,816
//! values), on all of rayon's threads and on one.
//!
//! ```text
//! cargo bench -p quant-benches --bench relu
//! ```
//!
//! dfdx's passes run on one thread whatever the pool; ours split across it, so the first
//! comparison is the one a multi-core training step sees. Rounds alternate the two layers
//! (`common::compare`). Memory comes from mimalloc, as in the `quant` binary's training steps:
//! with glibc's `malloc` each round's buffers go back to the system and page faults are most of
//! the time.

mod common;

use dfdx::prelude::*;
use quant_dfdx::nn::Relu;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const N: usize = 64 * 16 * 28 * 28;
const ROUNDS: usize = 101;

fn main() {
    let dev = Cpu::default();
    // Half the values negative, in no pattern a branch predictor could learn.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let values = (0..N)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    let x = dev.tensor_from_vec(values, (N,));
    let run = || {
        common::compare(
            "ReLU forward + backward",
            N,
            ROUNDS,
            ("dfdx ReLU", || common::step(&x, |x| ReLU.forward(x))),
            ("quant_dfdx Relu", || common::step(&x, |x| Relu.forward(x))),
        )
    };
    run();
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool")
        .install(run);
}
