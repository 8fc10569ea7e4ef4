//! Fake-quantization kernels on slices, without dfdx.
//!
//! The functions named after PyTorch's (`fake_quantize_per_tensor_affine`,
//! `fake_quantize_per_channel_affine`, `fake_quantize_learnable_per_tensor_affine_backward`) take
//! the same arguments in the same order and agree with PyTorch's CPU kernels bit for bit in
//! the forward pass: `q = round_half_even(x * (1/scale)) + zero_point`,
//! `y = (clamp(q, quant_min, quant_max) - zero_point) * scale`, in `f32`.
//! The `_into` variants write into a caller's buffer, take a
//! [`RoundingPolicy`](crate::RoundingPolicy) and a [`ChannelLayout`](crate::ChannelLayout), and
//! are what the dfdx ops use. `quant-core/tests/integration/pytorch_reference.rs` checks all of this
//! against vectors that real PyTorch produced (`tools/gen_pytorch_fixtures.py`).
//!
//! # PyTorch's LSQ backward
//! PyTorch's learnable (LSQ) backward rounds `x * (1/scale) + zero_point`, where its forward
//! rounds `x * (1/scale)` and then adds `zero_point`. At an exact tie with an odd zero point the
//! two disagree (`x/s = 0.5, z = 1`: the forward gives `q = 1`, the backward `q = 2`). We follow
//! PyTorch in each, so [`fake_quantize_learnable_affine_backward_into`] matches its gradients
//! exactly. Two things we do not copy:
//! - PyTorch's *per-tensor* backward rounds a learnable zero point as `trunc(clamp(z + 0.5))`
//!   where its forward and its per-channel backward use `round_half_even(clamp(z))`; they
//!   differ for every negative zero point (`z = -5` becomes `-4` in the backward) and at
//!   halves. We use the forward's rounding everywhere ([`round_zero_point`]), so forward and
//!   backward see the same grid.
//! - PyTorch's AVX2/AVX512 builds of the LSQ backward contract `z + x * (1/s)` into one fused
//!   multiply-add, so one ulp from a tie their result depends on the CPU. We compute the
//!   product and the sum separately, as its portable (`DEFAULT`) build does, on every CPU.
//!
//! # Non-finite inputs
//! `±Inf` saturates to the nearest end of the grid. `NaN` propagates: the output is `NaN`,
//! its gradient mask is 0 and it adds nothing to scale or zero-point gradients. (PyTorch's
//! CPU kernel casts `NaN` to an integer, which is undefined behaviour in C++.) Quantizing to
//! integers ([`quantize_into`]) rejects `NaN` with an error. Parameters (scales, zero points,
//! ranges) are validated: they are never allowed to be `NaN`.
//!
//! # Speed
//! Rounding uses the `1.5 * 2^23` addition trick, exact round-half-even for `|v| <= 2^22`
//! (the input is clamped to the grid first, which commutes with rounding because the bounds
//! are integers), so every loop vectorises on baseline x86-64 (SSE2) without `roundps`. On
//! x86-64 CPUs with AVX2 (detected at run time) the same loops run compiled for AVX2: twice
//! the lanes, same results bit for bit (no FMA contraction: Rust never fuses `a * b + c`).
//! The LSQ backward with round half to even, the training hot spot, has a hand-written AVX2
//! loop (LLVM would not keep the sums in registers), lane for lane the portable arithmetic.
//! (512-bit forms of both, the LSQ loop adding its 16 lanes to the sums as two 8-lane halves
//! in the same order, ran the W4A4 QAT steps no faster on an AVX-512 Xeon: these loops wait
//! on memory, not arithmetic.)
//! Gradient sums accumulate in `f32` lanes over blocks of at most 4 terms per lane and in
//! `f64` across blocks, so they stay within about 1e-7 relative of an exact sum of the terms
//! (relative to the sum of their absolute values, when terms of both signs cancel).
//! Tensors of at least [`PARALLEL_THRESHOLD`] elements are split across rayon's threads into
//! jobs whose boundaries depend only on the tensor's size, so results do not depend on the
//! number of threads.
//!
//! Grids wider than `2^21` levels on either side of zero take exact scalar paths that follow
//! PyTorch's own arithmetic there, which differs between its per-tensor kernel (`f32` codes
//! and products) and its per-channel kernel (`int64` codes, a `double` product).
//!
//! # Layout of this module
//! One element driver (`driver`: the walk over `[outer, channels, inner]` layouts, the
//! thread-count-independent parallel split, the AVX2/baseline dispatch) runs every kernel
//! family; each family is a small kernel type plus its public functions, in its own file:
//! forward fake quantization (`fake_quant`), the straight-through backward (`ste`), LSQ's
//! backward (`lsq`), PACT and DSQ (`pact`, `dsq`) and integer codes (`codes`). `gelu` and
//! `relu` are the float layers here: dfdx's `AccurateGeLU` bit for bit, vectorised, and its
//! `ReLU` bit for bit, split across threads. `params` holds
//! the validated per-channel constants, `round` the rounding policies, `torch` PyTorch's exact
//! arithmetic for grids too wide for the fast paths. [`affine`] (with the `dfdx` feature)
//! holds a fully connected layer's products with the numbers of dfdx's `Linear`, [`attention`]
//! self-attention's core (scores, softmax, weighted values) with the numbers of dfdx's ops,
//! fused or (for the quantized attention, with its own ops between them) as two products,
//! [`pool`] the 2x2 max pooling that halves an image, with PyTorch's choice among ties,
//! [`channel_sums`] per-channel sums over a batch in dfdx's order (BatchNorm's statistics), `exp`
//! the vectorised `f64` exponential of the exact softmax's gradient (QAT's attention),
//! [`passes`] plain fills and adds split across threads.

#[macro_use]
pub(crate) mod round;
#[cfg(feature = "dfdx")]
pub mod affine;
#[cfg(feature = "dfdx")]
pub mod attention;
pub mod channel_sums;
mod codes;
pub(crate) mod driver;
mod dsq;
#[cfg(feature = "dfdx")]
pub(crate) mod exp;
mod fake_quant;
pub(crate) mod gelu;
mod lsq;
mod pact;
mod params;
pub mod passes;
pub mod pool;
mod relu;
mod ste;
mod torch;

pub use codes::{dequantize_into, quantize_into, QuantInt};
pub(crate) use driver::VectorPath;
pub use dsq::{dsq_backward_into, dsq_forward_into, dsq_qparams, DSQ_ALPHA_RANGE};
#[cfg(feature = "dfdx")]
pub(crate) use exp::exp_nonpositive_in_place;
pub use fake_quant::{
    fake_quantize_affine_into, fake_quantize_per_channel_affine, fake_quantize_per_tensor_affine,
    fake_quantize_per_tensor_affine_into,
};
pub use gelu::{gelu_backward_into, gelu_forward_into};
pub use lsq::{
    fake_quantize_learnable_affine_backward_into,
    fake_quantize_learnable_per_tensor_affine_backward, round_zero_point, round_zero_points,
};
pub use pact::{pact_alpha, pact_backward_into, pact_forward_into};
pub use relu::{relu_backward_into, relu_forward_into, RELU_PARALLEL};
#[cfg(feature = "dfdx")]
pub(crate) use round::round_ties_even_f64;
pub(crate) use round::{round_small_f64, small_int_f64};
pub use ste::fake_quantize_affine_backward_into;

/// Element count from which kernels split work across rayon's thread pool.
pub const PARALLEL_THRESHOLD: usize = 1 << 18;

/// Least number of elements in one parallel job of the row-wise kernels that training runs
/// (the QAT softmax, GELU and layer normalisation, both ways). Their rows are independent, so
/// they split from far smaller tensors than the kernels with sums: a QAT transformer's
/// activations (64 × 16 × 64 values for the MNIST ViT) stay below [`PARALLEL_THRESHOLD`]; left
/// on one thread, these kernels were much of why its QAT step took about as long on two
/// threads as on one.
const ROW_JOB_ELEMENTS: usize = 1 << 14;

/// Rows of `row_len` values per parallel job of a row-wise kernel over `len` values: a
/// multiple of `group` rows, at least [`ROW_JOB_ELEMENTS`] values, and every row in one job
/// below two jobs' worth. It depends only on the sizes; the rows being independent, the split
/// changes which thread computes a row, never its bits.
pub(crate) fn rows_per_job(len: usize, row_len: usize, group: usize) -> usize {
    let (row_len, group) = (row_len.max(1), group.max(1));
    let rows = len / row_len;
    let per_job = ROW_JOB_ELEMENTS.div_ceil(row_len).next_multiple_of(group);
    if rows < 2 * per_job {
        rows.max(1)
    } else {
        per_job
    }
}
