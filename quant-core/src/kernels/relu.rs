//! ReLU with the numbers of dfdx's `ReLU`, split across threads (the kernels of
//! `quant_dfdx::nn::Relu`).
//!
//! dfdx's ReLU runs on one thread: its forward pass copies the input and then replaces each
//! value, its backward pass is a scalar loop with a bounds check per value. In a CNN's training
//! step on several threads they were about a twentieth of the samples, all on one thread
//! beside idle ones. The arithmetic here is dfdx's, element by element, so the bits are the
//! same (`max(x, 0)` forward, keeping `-0`; `dx += [x > 0]·dy` backward, the product kept so
//! that a `NaN` or infinite `dy` where `x ≤ 0` gives `NaN`, as dfdx's does); only the split
//! and the loops' vectorisation differ, and neither changes a value.

use rayon::prelude::*;

use crate::error::{check_len, Result};

/// Values from which the ReLU passes run in parallel (rayon). A value costs well under a
/// nanosecond (the passes wait on memory), so a split pays from tens of thousands of values;
/// a 28x28 CNN's first activations at batch 64 are 800,000.
pub const RELU_PARALLEL: usize = 1 << 16;
/// Values per parallel piece. Every value is computed alone, so any split gives the same bits.
const RELU_CHUNK: usize = 1 << 14;

fn parallel(len: usize) -> bool {
    len >= RELU_PARALLEL && rayon::current_num_threads() > 1
}

/// `y = max(x, 0)` element by element: dfdx's `ReLU` bit for bit. `NaN` becomes 0, as
/// `f32::max` guarantees; `-0` stays `-0`, as dfdx's compiled loop gives (its `f32::max`; a
/// test compares them). Rust leaves that sign open, so it is written out as a select rather
/// than left to how `f32::max` happens to compile here.
///
/// # Errors
/// `y` not as long as `x`.
pub fn relu_forward_into(x: &[f32], y: &mut [f32]) -> Result<()> {
    check_len("ReLU output", x.len(), y.len())?;
    let forward = |x: &[f32], y: &mut [f32]| {
        for (x, y) in x.iter().zip(y.iter_mut()) {
            *y = if *x >= 0.0 { *x } else { 0.0 };
        }
    };
    if parallel(x.len()) {
        x.par_chunks(RELU_CHUNK)
            .zip(y.par_chunks_mut(RELU_CHUNK))
            .for_each(|(x, y)| forward(x, y));
    } else {
        forward(x, y);
    }
    Ok(())
}

/// `dx += (x > 0 ? 1 : 0) · dy` element by element: dfdx's `ReLU` backward pass bit for bit.
///
/// # Errors
/// `dy` or `dx` not as long as `x`.
pub fn relu_backward_into(x: &[f32], dy: &[f32], dx: &mut [f32]) -> Result<()> {
    check_len("ReLU output gradient", x.len(), dy.len())?;
    check_len("ReLU input gradient", x.len(), dx.len())?;
    let backward = |x: &[f32], dy: &[f32], dx: &mut [f32]| {
        for ((x, dy), dx) in x.iter().zip(dy).zip(dx.iter_mut()) {
            let slope = if *x > 0.0 { 1.0f32 } else { 0.0 };
            *dx += slope * *dy;
        }
    };
    if parallel(x.len()) {
        x.par_chunks(RELU_CHUNK)
            .zip(dy.par_chunks(RELU_CHUNK))
            .zip(dx.par_chunks_mut(RELU_CHUNK))
            .for_each(|((x, dy), dx)| backward(x, dy, dx));
    } else {
        backward(x, dy, dx);
    }
    Ok(())
}
