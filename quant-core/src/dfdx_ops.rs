//! Differentiable fake-quantization ops on dfdx tensors, with hand-written fused backward
//! passes (one pass over the data each way, never a chain of dfdx primitives).
//!
//! Every op works with `OwnedTape` (training: records its backward) and `NoneTape`
//! (evaluation: records nothing), accepts non-contiguous inputs (they are made contiguous
//! first, which dfdx differentiates), and composes with any other dfdx op. Parameter tensors
//! (scales, clip values, ranges) are ordinary module parameters without a tape: their
//! gradients are added to the same `Gradients` as the input's, keyed by their ids, the way
//! dfdx's own layers do it.
//!
//! ```
//! use dfdx::prelude::*;
//! use quant_core::dfdx_ops;
//! use quant_core::{IntegerGrid, RoundingPolicy};
//!
//! let dev = Cpu::default();
//! let scale: Tensor<Rank1<1>, f32, Cpu> = dev.tensor([0.5]);
//! let x = dev.tensor([0.3f32, -0.9, 4.0]);
//! let grads = scale.alloc_grads();
//! let y = dfdx_ops::lsq(x.trace(grads), &scale, None, None, IntegerGrid::new(4, true, false)?, RoundingPolicy::HalfEven, None)?;
//! assert_eq!(y.array(), [0.5, -1.0, 3.5]);
//! let grads = y.sum().backward();
//! assert!(grads.get(&scale).array()[0] != 0.0);
//! # Ok::<(), quant_core::QuantError>(())
//! ```

use std::sync::Arc;

pub(crate) mod nonlinear;
pub use nonlinear::{
    int_gelu, int_gelu_quantized, int_layer_norm, int_layer_norm_quantized, int_softmax, CodeGrid,
};

use dfdx::prelude::*;
use dfdx::tensor::{CpuError, Gradients};

use crate::error::{QuantError, Result};
use crate::grid::{IntegerGrid, QParams};
use crate::kernels;
use crate::quantizer::{
    ChannelLayout, ParamBank, ParamBankMut, ParamDecl, QuantizerInput, TrainableQuantizer,
    MAX_PARAMETERS,
};
use crate::vocab::RoundingPolicy;

type Accumulate =
    Box<dyn FnOnce(&mut Gradients<f32, Cpu>, &[f32]) -> std::result::Result<(), CpuError>>;

/// A parameter tensor's values, and (when it trains) how to add into its gradient.
pub struct ParamInput {
    data: Vec<f32>,
    accumulate: Option<Accumulate>,
}

impl ParamInput {
    /// Reads `t`; its gradient is recorded when `trainable`. `t` must be contiguous, as every
    /// module parameter is.
    pub fn new<S: Shape>(t: &Tensor<S, f32, Cpu>, trainable: bool) -> ParamInput {
        let accumulate: Option<Accumulate> = if trainable {
            let ghost = t.ghost();
            Some(Box::new(
                move |grads: &mut Gradients<f32, Cpu>, d: &[f32]| {
                    let slot = grads.get_or_alloc_mut(&ghost)?;
                    for (g, v) in slot.iter_mut().zip(d) {
                        *g += *v;
                    }
                    Ok(())
                },
            ))
        } else {
            None
        };
        ParamInput {
            data: read_contiguous(t),
            accumulate,
        }
    }

    /// The values.
    pub fn data(&self) -> &[f32] {
        &self.data
    }
}

/// The values of a contiguous tensor (after `try_contiguous`, or a module parameter), in
/// order, with one `memcpy`: dfdx's `as_vec` walks a strided index per element, which costs more
/// than the quantization itself.
pub fn read_contiguous<S: Shape, T>(t: &Tensor<S, f32, Cpu, T>) -> Vec<f32> {
    let len = t.shape().num_elements();
    let mut buf = vec![0.0f32; len];
    if len > 0 {
        t.copy_into(&mut buf);
    }
    buf
}

pub use crate::scratch::{Scratch, MAX_SCRATCH_BYTES};

impl Scratch {
    /// The values of a contiguous tensor, as [`read_contiguous`], in a pooled buffer.
    pub fn copy_of<S: Shape, T>(t: &Tensor<S, f32, Cpu, T>) -> Scratch {
        let mut buf = Scratch::with_len(t.shape().num_elements());
        if !buf.is_empty() {
            t.copy_into(&mut buf);
        }
        buf
    }
}

/// The values of `t` where they lie, without a copy, when `t` is laid out row-major (its
/// strides those of its shape, as after `try_contiguous`); `None` for any other layout (a
/// broadcast or permuted view).
///
/// dfdx 0.13 keeps a tensor's storage private and offers only copies of it (`as_vec`,
/// `copy_into`), but its `Index` hands out a reference into the storage: the layout is read
/// from the addresses of one element per axis, and the whole range from the first and last
/// elements, which dfdx's `Index` bounds-checks.
pub fn in_place<S: Shape, T>(t: &Tensor<S, f32, Cpu, T>) -> Option<&[f32]> {
    let numel = t.shape().num_elements();
    if numel == 0 {
        return Some(&[]);
    }
    let dims = t.shape().concrete();
    let mut index = S::Concrete::default();
    let first: *const f32 = &t[index];
    let offset = |element: &f32| (element as *const f32 as usize).wrapping_sub(first as usize);
    let mut row_major_stride = 1usize;
    for axis in (0..S::NUM_DIMS).rev() {
        if dims[axis] > 1 {
            index[axis] = 1;
            if offset(&t[index]) != row_major_stride * std::mem::size_of::<f32>() {
                return None;
            }
            index[axis] = 0;
        }
        row_major_stride *= dims[axis];
    }
    for axis in 0..S::NUM_DIMS {
        index[axis] = dims[axis] - 1;
    }
    if offset(&t[index]) != (numel - 1) * std::mem::size_of::<f32>() {
        return None;
    }
    // SAFETY: `first` and the last element are elements of one buffer (dfdx's `Index` checks
    // the last against its length), `numel - 1` elements apart, so the `numel` values from
    // `first` on are initialised `f32`s of that buffer. dfdx writes a tensor's storage through
    // `&mut Tensor` after `Arc::make_mut` (which copies storage that other tensors share), or
    // reuses the storage of a tensor moved into an op when no other tensor shares it; neither
    // can happen to this storage while `t` is borrowed.
    Some(unsafe { std::slice::from_raw_parts(first, numel) })
}

/// A tensor's values, held for an op (and its backward pass) without copying them where the
/// layout allows: the tensor's own storage, shared as dfdx's ops share theirs, when it is laid
/// out row-major ([`in_place`]), else a copy in row-major order.
pub struct TensorValues<S: Shape> {
    tensor: Tensor<S, f32, Cpu>,
    copy: Option<Vec<f32>>,
}

impl<S: Shape> TensorValues<S> {
    /// The values of `t`, in row-major order.
    pub fn of<T>(t: &Tensor<S, f32, Cpu, T>) -> TensorValues<S> {
        let tensor = t.retaped::<NoneTape>();
        // Not in place only for a non-empty view (`as_vec` walks its strides).
        let copy = in_place(&tensor).is_none().then(|| tensor.as_vec());
        TensorValues { tensor, copy }
    }
}

impl<S: Shape> std::ops::Deref for TensorValues<S> {
    type Target = [f32];
    #[inline]
    fn deref(&self) -> &[f32] {
        match &self.copy {
            Some(copy) => copy,
            // `of` found the storage in place; the same tensor gives the same answer.
            None => in_place(&self.tensor).unwrap_or_default(),
        }
    }
}

std::thread_local! {
    static RELEASE_USED_GRADIENTS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// While the returned guard lives, the backward passes of this crate's ops and of
/// quant-dfdx's layers that run on this thread free their output's gradient as soon as they
/// have used it, instead of putting it back into the `Gradients` (dfdx's own ops keep theirs).
///
/// dfdx keeps every intermediate tensor's gradient until the backward pass ends, then drops
/// those of the non-leaves (gradients from `alloc_grads`): a QAT step, with a quantizer on
/// every activation, holds many more such buffers than the float step, each a fresh zeroed
/// allocation on pages the step has not touched yet. Freed as soon as used, they are reused
/// by the next op's gradient, still in cache: on the digits ViT (Zen 4) this took the W4A4
/// QAT step's `memset` and page clearing from 14% to 9% of its time. Those of
/// [`elementwise_op`]'s ops go to the [`Scratch`] pool instead, as the storage of the next
/// step's outputs, which then need no zeroing.
///
/// For a backward pass whose caller reads only the leaves' gradients (the parameters' and the
/// input's), as a training step does: with `alloc_grads` that is all dfdx keeps anyway. Under
/// the guard, an intermediate tensor's gradient in leaky `Gradients` is left empty (no values:
/// dfdx's `Gradients::get` would make a tensor without its data). The setting is the
/// thread's: rayon tasks the thread runs while it waits inside the backward pass see it too.
///
/// ```
/// use dfdx::prelude::*;
/// use quant_core::{dfdx_ops, IntegerGrid, RoundingPolicy};
///
/// let dev = Cpu::default();
/// let scale: Tensor<Rank1<1>, f32, Cpu> = dev.tensor([0.5]);
/// let grid = IntegerGrid::new(4, true, false)?;
/// let step = || -> Result<dfdx::tensor::Gradients<f32, Cpu>, quant_core::QuantError> {
///     let x = dev.tensor([0.3f32, -0.9, 4.0]).trace(scale.alloc_grads());
///     let y = dfdx_ops::lsq(x, &scale, None, None, grid, RoundingPolicy::HalfEven, None)?;
///     Ok((y * 2.0).sum().backward())
/// };
/// let kept = step()?;
/// let released = {
///     let _released = dfdx_ops::release_used_gradients();
///     step()?
/// };
/// assert_eq!(kept.get(&scale).array(), released.get(&scale).array());
/// # Ok::<(), quant_core::QuantError>(())
/// ```
#[must_use = "the gradients are released only while the guard lives"]
pub fn release_used_gradients() -> UsedGradientsReleased {
    UsedGradientsReleased {
        previous: RELEASE_USED_GRADIENTS.with(|r| r.replace(true)),
    }
}

/// The guard of [`release_used_gradients`]: dropping it restores what was in force before.
#[derive(Debug)]
pub struct UsedGradientsReleased {
    previous: bool,
}

impl Drop for UsedGradientsReleased {
    fn drop(&mut self) {
        RELEASE_USED_GRADIENTS.with(|r| r.set(self.previous));
    }
}

/// Whether a backward pass puts its output's gradient back after using it (outside
/// [`release_used_gradients`]) rather than freeing it.
pub fn keep_used_gradients() -> bool {
    !RELEASE_USED_GRADIENTS.with(|r| r.get())
}

/// The forward half of a custom op: reads the input, the parameters, writes every element of
/// the output (whose values before are unspecified, as in [`elementwise_op`]).
pub type ForwardFn<'a> = dyn FnOnce(&[f32], &[&[f32]], &mut [f32]) -> Result<()> + 'a;
/// The backward half of a custom op: given the input, the parameters and the output
/// gradient, adds into the input gradient and the (zeroed) parameter gradients.
pub type BackwardFn = dyn FnOnce(&[f32], &[&[f32]], &[f32], &mut [f32], &mut [Vec<f32>]);

/// Builds a differentiable elementwise op with parameters: runs `forward` now and, when `x`
/// carries an `OwnedTape`, records `backward` on it.
///
/// Every one-input op here and every quantizer chosen at run time goes through
/// [`elementwise_op`], the one place that talks to dfdx's tape for them ([`add`], with two
/// inputs, is the other).
pub fn custom_op<S: Shape, T: Tape<f32, Cpu>>(
    x: Tensor<S, f32, Cpu, T>,
    params: Vec<ParamInput>,
    forward: Box<ForwardFn<'_>>,
    backward: Box<BackwardFn>,
) -> Result<Tensor<S, f32, Cpu, T>> {
    custom_op_quantized(x, None, params, forward, backward)
}

/// [`custom_op`] on `x` as `quantization` (when given) quantizes it inside the op:
/// [`elementwise_op_quantized`].
pub fn custom_op_quantized<S: Shape, T: Tape<f32, Cpu>>(
    x: Tensor<S, f32, Cpu, T>,
    quantization: Option<DynQuantization>,
    params: Vec<ParamInput>,
    forward: Box<ForwardFn<'_>>,
    backward: Box<BackwardFn>,
) -> Result<Tensor<S, f32, Cpu, T>> {
    let forward = |x: &[f32], y: &mut [f32]| {
        let views: Vec<&[f32]> = params.iter().map(|p| p.data.as_slice()).collect();
        forward(x, &views, y)?;
        Ok(params)
    };
    let backward = move |params: Vec<ParamInput>, x: &[f32], dy: &[f32], dx: &mut [f32]| {
        let views: Vec<&[f32]> = params.iter().map(|p| p.data.as_slice()).collect();
        let mut dparams: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.data.len()]).collect();
        backward(x, &views, dy, dx, &mut dparams);
        (params, dparams)
    };
    let accumulate = |(params, dparams): (Vec<ParamInput>, Vec<Vec<f32>>),
                      grads: &mut Gradients<f32, Cpu>| {
        for (p, d) in params.into_iter().zip(&dparams) {
            if let Some(acc) = p.accumulate {
                acc(grads, d)?;
            }
        }
        Ok(())
    };
    match quantization {
        Some(q) => elementwise_op_quantized(x, q, forward, backward, accumulate),
        None => elementwise_op(x, forward, backward, accumulate),
    }
}

/// [`elementwise_op`] on `x` quantized by `quantization` inside the op: the same bits as
/// `quantization` run as an op of its own ([`fake_quantize_dyn`]) and then this op, without a
/// dfdx tensor for the quantized values and the gradient dfdx would allocate for it. `forward`
/// and `backward` see the quantized values (in a pooled buffer) as their input; the gradient
/// `backward` adds to is a pooled zeroed buffer that then goes to the quantizer's backward
/// pass.
pub fn elementwise_op_quantized<S, T, C, G, F, B, A>(
    x: Tensor<S, f32, Cpu, T>,
    quantization: DynQuantization,
    forward: F,
    backward: B,
    accumulate: A,
) -> Result<Tensor<S, f32, Cpu, T>>
where
    S: Shape,
    T: Tape<f32, Cpu>,
    C: 'static,
    F: FnOnce(&[f32], &mut [f32]) -> Result<C>,
    B: FnOnce(C, &[f32], &[f32], &mut [f32]) -> G + 'static,
    A: FnOnce(G, &mut Gradients<f32, Cpu>) -> std::result::Result<(), CpuError> + 'static,
{
    let DynQuantization {
        forward: quantize,
        backward: quantize_backward,
        accumulate: quantize_accumulate,
    } = quantization;
    elementwise_op(
        x,
        |x, y| {
            // Written whole: from the pool, not zeroed.
            let mut quantized = Scratch::output(x.len());
            let quantize_state = quantize(x, &mut quantized)?;
            let state = forward(&quantized, y)?;
            Ok((quantize_state, quantized, state))
        },
        move |(quantize_state, quantized, state), x, dy, dx| {
            let mut d_quantized = Scratch::zeros(x.len());
            let op_grads = backward(state, &quantized, dy, &mut d_quantized);
            Scratch::recycle(quantized);
            let quantizer_grads = quantize_backward(quantize_state, x, &d_quantized, dx);
            Scratch::recycle(d_quantized);
            (op_grads, quantizer_grads)
        },
        move |(op_grads, quantizer_grads), grads| {
            accumulate(op_grads, grads)?;
            quantize_accumulate(quantizer_grads, grads)
        },
    )
}

/// Runs an elementwise op and records its backward pass: the protocol every op here follows.
///
/// `forward(x, y)` reads the input (made contiguous, and read in place: [`TensorValues`], which
/// the backward pass keeps) and writes every element of the output `y` (same length; its
/// values before are unspecified: `y` is a [`Scratch`] buffer, which may hold an earlier
/// tensor's values); what it returns is handed to `backward`. With an `OwnedTape`,
/// `backward(state, x, dy, dx)` adds the input's gradient into `dx` and returns what
/// `accumulate(.., grads)` then adds into the parameters' gradients. The output gradient is
/// taken out of its slot while the input's is borrowed, and put back after (dfdx frees it with
/// the other intermediate gradients), or, under [`release_used_gradients`], given to the
/// [`Scratch`] pool, where the next step's output of the same op finds it.
pub fn elementwise_op<S, T, C, G, F, B, A>(
    x: Tensor<S, f32, Cpu, T>,
    forward: F,
    backward: B,
    accumulate: A,
) -> Result<Tensor<S, f32, Cpu, T>>
where
    S: Shape,
    T: Tape<f32, Cpu>,
    C: 'static,
    F: FnOnce(&[f32], &mut [f32]) -> Result<C>,
    B: FnOnce(C, &[f32], &[f32], &mut [f32]) -> G + 'static,
    A: FnOnce(G, &mut Gradients<f32, Cpu>) -> std::result::Result<(), CpuError> + 'static,
{
    let x = x.try_contiguous()?;
    let (x, mut tape) = x.split_tape();
    let x_data = TensorValues::of(&x);
    // From the pool (fed by used gradients): no zeroing before `forward` writes it whole.
    let mut y = Scratch::output(x_data.len());
    let state = forward(&x_data, &mut y)?;
    let out = x.device().try_tensor_from_vec(y, *x.shape())?;
    if T::OWNS_TAPE {
        let x_ghost = x.ghost();
        let out_ghost = out.ghost();
        tape.add_backward_op(move |grads| {
            grads.try_alloc_for(&x_ghost)?;
            // Take the output gradient out of its slot so the input's can be borrowed too.
            let dy: Vec<f32> = std::mem::take(&mut **grads.get_or_alloc_mut(&out_ghost)?);
            let param_grads = backward(state, &x_data, &dy, grads.get_or_alloc_mut(&x_ghost)?);
            drop(x_data);
            if keep_used_gradients() {
                **grads.get_or_alloc_mut(&out_ghost)? = dy;
            } else {
                Scratch::recycle(dy);
            }
            accumulate(param_grads, grads)
        });
    }
    Ok(out.put_tape(tape))
}

/// `a + b`, element by element: dfdx's `try_add` of two tensors of one shape, the same bits
/// forward and backward (each input's gradient gets the output's added once, as dfdx's
/// `+= 1·dy`), in plain passes over contiguous values instead of dfdx's strided indices. The
/// residual adds take it: `quant::nn::Residual`'s and those of the quantized models. With two
/// traced inputs it records its own backward pass, beside [`elementwise_op`]'s one-input
/// protocol.
///
/// # Errors
/// `a` and `b` of different sizes (`LengthMismatch`); the device's (allocation).
pub fn add<S: Shape, T: Tape<f32, Cpu> + Merge<T>>(
    a: Tensor<S, f32, Cpu, T>,
    b: Tensor<S, f32, Cpu, T>,
) -> Result<Tensor<S, f32, Cpu, T>> {
    check_add_shapes(a.shape(), b.shape())?;
    let (a, a_tape) = a.try_contiguous()?.split_tape();
    let (b, b_tape) = b.try_contiguous()?.split_tape();
    let mut tape = a_tape.merge(b_tape);
    let sum: Vec<f32> = {
        let (a_data, b_data) = (TensorValues::of(&a), TensorValues::of(&b));
        // Written whole: from the pool, not zeroed.
        let mut sum = Scratch::output(a_data.len());
        kernels::passes::sum_into(&mut sum, &a_data, &b_data);
        sum
    };
    let out = a.device().try_tensor_from_vec(sum, *a.shape())?;
    if T::OWNS_TAPE {
        let (a_ghost, b_ghost, out_ghost) = (a.ghost(), b.ghost(), out.ghost());
        tape.add_backward_op(move |grads| {
            grads.try_alloc_for(&a_ghost)?;
            grads.try_alloc_for(&b_ghost)?;
            // Taken out of its slot so the inputs' can be borrowed, as in `elementwise_op`.
            let dy: Vec<f32> = std::mem::take(&mut **grads.get_or_alloc_mut(&out_ghost)?);
            for input in [&a_ghost, &b_ghost] {
                kernels::passes::add_into(grads.get_or_alloc_mut(input)?, &dy);
            }
            if keep_used_gradients() {
                **grads.get_or_alloc_mut(&out_ghost)? = dy;
            } else {
                Scratch::recycle(dy);
            }
            Ok(())
        });
    }
    Ok(out.put_tape(tape))
}

/// An error unless the add's inputs have one shape.
fn check_add_shapes<S: Shape>(a: &S, b: &S) -> Result<()> {
    let (a_dims, b_dims) = (a.concrete(), b.concrete());
    if a_dims.as_ref() != b_dims.as_ref() {
        return Err(QuantError::LengthMismatch {
            what: format!(
                "elements of the add's second input (shape {:?}; the first is {:?})",
                b_dims.as_ref(),
                a_dims.as_ref()
            ),
            expected: a.num_elements(),
            actual: b.num_elements(),
        });
    }
    Ok(())
}

/// [`add`] of `a` and `b`, each first quantized by its op: `add(fake_quantize_dyn(a),
/// fake_quantize_dyn(b))` bit for bit (outputs, gradients), without tensors for the
/// quantized values, so without their zeroed gradient buffers and the add's backward pass: the
/// output's gradient goes straight to both quantizers' backward passes (`b`'s first, then
/// `a`'s, the order of the separate ops). A quantized residual add takes it in training.
///
/// # Errors
/// `a` and `b` of different sizes; a quantizer's forward pass; the device's.
pub fn add_quantized<S: Shape, T: Tape<f32, Cpu> + Merge<T>>(
    a: Tensor<S, f32, Cpu, T>,
    b: Tensor<S, f32, Cpu, T>,
    [a_quantization, b_quantization]: [DynQuantization; 2],
) -> Result<Tensor<S, f32, Cpu, T>> {
    check_add_shapes(a.shape(), b.shape())?;
    let (a, a_tape) = a.try_contiguous()?.split_tape();
    let (b, b_tape) = b.try_contiguous()?.split_tape();
    let mut tape = a_tape.merge(b_tape);
    let (a_data, b_data) = (TensorValues::of(&a), TensorValues::of(&b));
    // Every buffer written whole: from the pool, not zeroed.
    let mut a_quantized = Scratch::output(a_data.len());
    let a_state = (a_quantization.forward)(&a_data, &mut a_quantized)?;
    let mut b_quantized = Scratch::output(b_data.len());
    let b_state = (b_quantization.forward)(&b_data, &mut b_quantized)?;
    let mut sum = Scratch::output(a_data.len());
    kernels::passes::sum_into(&mut sum, &a_quantized, &b_quantized);
    Scratch::recycle(a_quantized);
    Scratch::recycle(b_quantized);
    let out = a.device().try_tensor_from_vec(sum, *a.shape())?;
    if T::OWNS_TAPE {
        let (a_ghost, b_ghost, out_ghost) = (a.ghost(), b.ghost(), out.ghost());
        tape.add_backward_op(move |grads| {
            grads.try_alloc_for(&a_ghost)?;
            grads.try_alloc_for(&b_ghost)?;
            let dy: Vec<f32> = std::mem::take(&mut **grads.get_or_alloc_mut(&out_ghost)?);
            // The sum's gradient is each quantized input's: no copies of `dy`.
            let b_params =
                (b_quantization.backward)(b_state, &b_data, &dy, grads.get_or_alloc_mut(&b_ghost)?);
            (b_quantization.accumulate)(b_params, grads)?;
            let a_params =
                (a_quantization.backward)(a_state, &a_data, &dy, grads.get_or_alloc_mut(&a_ghost)?);
            (a_quantization.accumulate)(a_params, grads)?;
            drop((a_data, b_data));
            if keep_used_gradients() {
                **grads.get_or_alloc_mut(&out_ghost)? = dy;
            } else {
                Scratch::recycle(dy);
            }
            Ok(())
        });
    }
    Ok(out.put_tape(tape))
}

fn shape_layout<S: Shape>(shape: &S, axis: Option<usize>) -> Result<ChannelLayout> {
    let dims = shape.concrete();
    ChannelLayout::new(dims.as_ref(), axis)
}

/// [`shape_layout`], which must have `channels` channels (one per parameter); `what` names
/// them in the error.
fn checked_layout<S: Shape>(
    shape: &S,
    axis: Option<usize>,
    channels: usize,
    what: impl FnOnce() -> String,
) -> Result<ChannelLayout> {
    let layout = shape_layout(shape, axis)?;
    if layout.channels != channels {
        return Err(QuantError::LengthMismatch {
            what: what(),
            expected: channels,
            actual: layout.channels,
        });
    }
    Ok(layout)
}

/// Straight-through fake quantization with fixed parameters (per tensor, or per channel on
/// `qparams.axis()`), the dfdx form of [`kernels::fake_quantize_affine_into`]. The gradient is
/// `dy` where the rounded value lies on the grid, 0 elsewhere.
pub fn fake_quantize<S: Shape, T: Tape<f32, Cpu>>(
    x: Tensor<S, f32, Cpu, T>,
    qparams: &QParams,
    grid: IntegerGrid,
    rounding: RoundingPolicy,
) -> Result<Tensor<S, f32, Cpu, T>> {
    let (axis, channels) = (qparams.axis(), qparams.channels());
    let layout = checked_layout(x.shape(), axis, channels, || {
        format!("channels along axis {axis:?}")
    })?;
    qparams.check_zero_points(grid)?;
    let q = qparams.clone();
    let (qmin, qmax) = (grid.quant_min(), grid.quant_max());
    let q2 = q.clone();
    custom_op(
        x,
        Vec::new(),
        Box::new(move |x, _, y| {
            kernels::fake_quantize_affine_into(
                x,
                y,
                layout,
                q.scales(),
                q.zero_points(),
                qmin,
                qmax,
                rounding,
            )
        }),
        Box::new(move |x, _, dy, dx, _| {
            // Cannot fail: the forward pass validated the same arguments.
            let _ = kernels::fake_quantize_affine_backward_into(
                x,
                dy,
                dx,
                layout,
                q2.scales(),
                q2.zero_points(),
                qmin,
                qmax,
                rounding,
            );
        }),
    )
}

/// LSQ's default gradient scale, `1 / sqrt(numel * quant_max)`.
pub fn lsq_grad_factor(numel: usize, grid: IntegerGrid) -> f32 {
    let qmax = grid.quant_max().max(1) as f64;
    (1.0 / ((numel.max(1) as f64) * qmax).sqrt()) as f32
}

/// Learned step size quantization (Esser et al.): fake quantization whose scale (and, for an
/// affine grid, zero point) are learned. `scale` holds one value per channel along `axis`
/// (`axis = None` and `C = 1` for per tensor); `zero_point`, when given, is a learnable float
/// rounded before use. `grad_factor` defaults to [`lsq_grad_factor`]. The backward pass is
/// PyTorch's `_fake_quantize_learnable_*_affine_backward`.
///
/// Scales are clamped to at least [`crate::grid::MIN_SCALE`] before use, so a step that pushes
/// a scale to zero or below does not break the forward pass.
pub fn lsq<S: Shape, T: Tape<f32, Cpu>, const C: usize>(
    x: Tensor<S, f32, Cpu, T>,
    scale: &Tensor<Rank1<C>, f32, Cpu>,
    zero_point: Option<&Tensor<Rank1<C>, f32, Cpu>>,
    axis: Option<usize>,
    grid: IntegerGrid,
    rounding: RoundingPolicy,
    grad_factor: Option<f32>,
) -> Result<Tensor<S, f32, Cpu, T>> {
    let layout = checked_layout(x.shape(), axis, C, || {
        format!("channels along axis {axis:?} (the scale tensor has {C})")
    })?;
    let g = grad_factor.unwrap_or_else(|| lsq_grad_factor(layout.numel(), grid));
    let mut params = vec![ParamInput::new(scale, true)];
    if let Some(z) = zero_point {
        params.push(ParamInput::new(z, true));
    }
    let learn_zero = zero_point.is_some();
    let (qmin, qmax) = (grid.quant_min(), grid.quant_max());
    let prepare = move |p: &[&[f32]]| -> Result<(Vec<f32>, Vec<f32>, Vec<i32>)> {
        let scales: Vec<f32> = p[0].iter().map(|s| s.max(crate::grid::MIN_SCALE)).collect();
        let zf: Vec<f32> = if learn_zero {
            p[1].to_vec()
        } else {
            vec![0.0; C]
        };
        let zi = kernels::round_zero_points(&zf, qmin, qmax)?;
        Ok((scales, zf, zi))
    };
    custom_op(
        x,
        params,
        Box::new(move |x, p, y| {
            let (s, _, z) = prepare(p)?;
            kernels::fake_quantize_affine_into(x, y, layout, &s, &z, qmin, qmax, rounding)
        }),
        Box::new(move |x, p, dy, dx, dp| {
            if let Ok((s, zf, _)) = prepare(p) {
                let mut ds = vec![0.0; C];
                let mut dz = vec![0.0; C];
                let dz_out = learn_zero.then_some(&mut dz[..]);
                let _ = kernels::fake_quantize_learnable_affine_backward_into(
                    x, dy, dx, layout, &s, &zf, qmin, qmax, g, rounding, &mut ds, dz_out,
                );
                dp[0].copy_from_slice(&ds);
                if learn_zero {
                    dp[1].copy_from_slice(&dz);
                }
            }
        }),
    )
}

/// PACT (Choi et al.): `y = fake_quant(clamp(x, 0, α))` on an unsigned grid with
/// `scale = α / quant_max`, zero point 0; `dx = dy·[0 ≤ x < α]`, `dα = Σ dy·[x ≥ α]`.
/// `α` is clamped to at least `quant_max ·` [`crate::grid::MIN_SCALE`] before use.
///
/// # Errors
/// A signed grid (PACT clips at 0).
pub fn pact<S: Shape, T: Tape<f32, Cpu>>(
    x: Tensor<S, f32, Cpu, T>,
    alpha: &Tensor<Rank0, f32, Cpu>,
    grid: IntegerGrid,
    rounding: RoundingPolicy,
) -> Result<Tensor<S, f32, Cpu, T>> {
    if grid.signed() {
        return Err(QuantError::InvalidValue {
            what: "grid.signed".into(),
            value: "true".into(),
            expected: "an unsigned grid: PACT clips activations to [0, alpha]".into(),
        });
    }
    let layout = shape_layout(x.shape(), None)?;
    custom_op(
        x,
        vec![ParamInput::new(alpha, true)],
        Box::new(move |x, p, y| kernels::pact_forward_into(x, y, layout, p[0][0], grid, rounding)),
        Box::new(move |x, p, dy, dx, dp| {
            dp[0][0] += kernels::pact_backward_into(x, dy, dx, p[0][0], grid);
        }),
    )
}

/// DSQ (Gong et al.): affine fake quantization over the learnable range `[lower, upper]`
/// (nudged so 0 is on the grid) whose backward pass is the derivative of the soft, tanh-shaped
/// surrogate with sharpness `alpha`; `alpha`, `lower` and `upper` all learn. See
/// [`kernels::dsq_backward_into`] for the exact surrogate.
#[allow(clippy::too_many_arguments)]
pub fn dsq<S: Shape, T: Tape<f32, Cpu>, const C: usize>(
    x: Tensor<S, f32, Cpu, T>,
    alpha: &Tensor<Rank1<C>, f32, Cpu>,
    lower: &Tensor<Rank1<C>, f32, Cpu>,
    upper: &Tensor<Rank1<C>, f32, Cpu>,
    axis: Option<usize>,
    grid: IntegerGrid,
    rounding: RoundingPolicy,
) -> Result<Tensor<S, f32, Cpu, T>> {
    let layout = checked_layout(x.shape(), axis, C, || {
        format!("channels along axis {axis:?} (the parameter tensors have {C})")
    })?;
    custom_op(
        x,
        vec![
            ParamInput::new(alpha, true),
            ParamInput::new(lower, true),
            ParamInput::new(upper, true),
        ],
        Box::new(move |x, p, y| {
            kernels::dsq_forward_into(x, y, layout, p[1], p[2], grid, rounding)
        }),
        Box::new(move |x, p, dy, dx, dp| {
            let (da, rest) = dp.split_at_mut(1);
            let (dl, du) = rest.split_at_mut(1);
            kernels::dsq_backward_into(
                x, dy, dx, layout, p[0], p[1], p[2], grid, &mut da[0], &mut dl[0], &mut du[0],
            );
        }),
    )
}

/// Runs a quantizer chosen at run time (`dyn TrainableQuantizer`) on a dfdx tensor.
///
/// The quantizer's parameter slots live in two banks of `MAX_PARAMETERS × channels` values:
/// `learned` (trainable, updated by the optimiser) and `fixed` (detached). Slot `k` is read from
/// `learned` when the quantizer declares it trainable, else from `fixed`. Gradients reach
/// `learned` only when `train_params` is true.
#[allow(clippy::too_many_arguments)]
pub fn fake_quantize_dyn<S: Shape, T: Tape<f32, Cpu>, P: Shape>(
    quantizer: &Arc<dyn TrainableQuantizer>,
    x: Tensor<S, f32, Cpu, T>,
    learned: &Tensor<P, f32, Cpu>,
    fixed: &Tensor<P, f32, Cpu>,
    grid: IntegerGrid,
    axis: Option<usize>,
    train_params: bool,
) -> Result<Tensor<S, f32, Cpu, T>> {
    let op = DynQuantization::new(
        quantizer,
        x.shape(),
        learned,
        fixed,
        grid,
        axis,
        train_params,
    )?;
    op.apply(x)
}

/// The forward half of [`DynQuantization`]: reads the input, writes every value of the output,
/// returns what the backward half needs.
pub type DynForward = Box<dyn FnOnce(&[f32], &mut [f32]) -> Result<Vec<f32>>>;
/// The backward half of [`DynQuantization`]: from the forward half's state, the input and the
/// output gradient, adds into the input gradient; returns the parameters' gradients.
pub type DynBackward = Box<dyn FnOnce(Vec<f32>, &[f32], &[f32], &mut [f32]) -> Vec<f32>>;
/// The last part of [`DynQuantization`]'s backward: adds the parameters' gradients into the
/// quantizer's learned bank's.
pub type DynAccumulate =
    Box<dyn FnOnce(Vec<f32>, &mut Gradients<f32, Cpu>) -> std::result::Result<(), CpuError>>;

/// [`fake_quantize_dyn`]'s op on a tensor of one shape, checked and taken apart, for an op of
/// its own that quantizes a tensor it reads: in training, `quant-dfdx`'s `QLinear` quantizes
/// its weights and its input inside its product so, a quantized add its operands
/// ([`add_quantized`]), a quantized LayerNorm or GELU its input ([`elementwise_op_quantized`]),
/// with no dfdx tensors for the quantized values and so no zeroed gradient buffers for them.
/// Run as [`elementwise_op`] runs the halves, it is [`fake_quantize_dyn`].
pub struct DynQuantization {
    /// Reads the input, writes the output.
    pub forward: DynForward,
    /// Adds into the input's gradient.
    pub backward: DynBackward,
    /// Adds into the parameters' gradients.
    pub accumulate: DynAccumulate,
}

impl DynQuantization {
    /// Runs the op on `x` as an op of its own ([`elementwise_op`]): [`fake_quantize_dyn`].
    ///
    /// # Errors
    /// The forward half's; the device's.
    pub fn apply<S: Shape, T: Tape<f32, Cpu>>(
        self,
        x: Tensor<S, f32, Cpu, T>,
    ) -> Result<Tensor<S, f32, Cpu, T>> {
        elementwise_op(x, self.forward, self.backward, self.accumulate)
    }

    /// The op of `quantizer` on a tensor of `shape` (see [`fake_quantize_dyn`] for the banks).
    ///
    /// # Errors
    /// The quantizer declares too many parameters; the banks' sizes differ or do not match the
    /// channels along `axis`; a parameter the quantizer rejects.
    #[allow(clippy::too_many_arguments)]
    pub fn new<S: Shape, P: Shape>(
        quantizer: &Arc<dyn TrainableQuantizer>,
        shape: &S,
        learned: &Tensor<P, f32, Cpu>,
        fixed: &Tensor<P, f32, Cpu>,
        grid: IntegerGrid,
        axis: Option<usize>,
        train_params: bool,
    ) -> Result<DynQuantization> {
        let decls = quantizer.parameters();
        if decls.len() > MAX_PARAMETERS {
            return Err(QuantError::TooManyParameters {
                quantizer: format!("{:?}", quantizer),
                count: decls.len(),
                max: MAX_PARAMETERS,
            });
        }
        let trainable = trainable_slots(&decls);
        let layout = shape_layout(shape, axis)?;
        let bank_len = learned.shape().num_elements();
        let bank_channels = bank_len / MAX_PARAMETERS;
        if fixed.shape().num_elements() != bank_len {
            return Err(QuantError::LengthMismatch {
                what: "fixed parameter slots (as many as the learned ones)".into(),
                expected: bank_len,
                actual: fixed.shape().num_elements(),
            });
        }
        if layout.channels != 1 && layout.channels != bank_channels {
            return Err(QuantError::LengthMismatch {
                what: format!(
                    "channels along axis {axis:?} (the parameter slots hold {bank_channels})"
                ),
                expected: bank_channels,
                actual: layout.channels,
            });
        }
        let bank = merged_bank(&trainable, bank_channels, learned, fixed);
        ParamBank::new(&bank, bank_channels)?;
        let learned_grad = train_params.then(|| learned.ghost());
        let q_fwd = quantizer.clone();
        let q_bwd = quantizer.clone();
        Ok(DynQuantization {
            forward: Box::new(move |x, y| {
                let input = QuantizerInput::new(x, layout, grid)?;
                q_fwd.forward(input, &ParamBank::new(&bank, bank_channels)?, y)?;
                Ok(bank)
            }),
            backward: Box::new(move |bank, x, dy, dx| {
                let mut dbank = vec![0.0; bank.len()];
                // Cannot fail: the forward pass checked the same input and bank.
                if let (Ok(input), Ok(view), Ok(mut dview)) = (
                    QuantizerInput::new(x, layout, grid),
                    ParamBank::new(&bank, bank_channels),
                    ParamBankMut::new(&mut dbank, bank_channels),
                ) {
                    q_bwd.backward(input, &view, dy, dx, &mut dview);
                }
                dbank
            }),
            accumulate: Box::new(move |dbank, grads| {
                let Some(ghost) = learned_grad else {
                    return Ok(());
                };
                let slot = grads.get_or_alloc_mut(&ghost)?;
                for (k, rows) in dbank.chunks(bank_channels.max(1)).enumerate() {
                    if trainable.get(k) == Some(&true) {
                        let at = k * bank_channels;
                        for (g, d) in slot[at..at + rows.len()].iter_mut().zip(rows) {
                            *g += *d;
                        }
                    }
                }
                Ok(())
            }),
        })
    }
}

/// Which of the [`MAX_PARAMETERS`] slots a quantizer declaring `decls` reads from its learned
/// bank (the others from its fixed bank).
fn trainable_slots(decls: &[ParamDecl]) -> [bool; MAX_PARAMETERS] {
    let mut trainable = [false; MAX_PARAMETERS];
    for (t, d) in trainable.iter_mut().zip(decls) {
        *t = d.trainable;
    }
    trainable
}

/// One bank of slots: slot `k` from `learned` where `trainable[k]`, else from `fixed`.
fn merged_bank<P: Shape>(
    trainable: &[bool; MAX_PARAMETERS],
    channels: usize,
    learned: &Tensor<P, f32, Cpu>,
    fixed: &Tensor<P, f32, Cpu>,
) -> Vec<f32> {
    let mut bank = read_contiguous(fixed);
    if trainable.iter().any(|t| *t) {
        let learned = Scratch::copy_of(learned);
        for (k, t) in trainable.iter().enumerate() {
            if *t {
                let r = k * channels..(k + 1) * channels;
                bank[r.clone()].copy_from_slice(&learned[r]);
            }
        }
    }
    bank
}
