//! A fully connected layer with the numbers of dfdx's `Linear` and one matrix product for a
//! whole batch of sequences: the layer and its op. The products are
//! [`quant_core::kernels::affine`]'s, which says why they give dfdx's bits; where they cannot
//! (sizes outside their bounds, CPUs without FMA, single vectors) dfdx's own ops run.

use dfdx::prelude::*;
use dfdx::shapes::Dtype;
use dfdx::tensor::CpuError;
use dfdx::tensor_ops::Device;
use quant_core::dfdx_ops::{DynQuantization, Scratch};
use quant_core::kernels::affine::Affine;
use quant_core::{QuantError, Result};

use crate::layers::fan_in_uniform;

use super::tape::{read, record};

pub mod builder {
    /// Builds a [`Linear`](super::Linear) from `I` features to `O`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Linear<const I: usize, const O: usize>;
}

impl<const I: usize, const O: usize, E: Dtype, D: Device<E>> BuildOnDevice<D, E>
    for builder::Linear<I, O>
where
    Linear<I, O, E, D>: BuildModule<D, E>,
{
    type Built = Linear<I, O, E, D>;
    fn try_build_on_device(device: &D) -> std::result::Result<Self::Built, D::Err> {
        Self::Built::try_build(device)
    }
}

/// A fully connected layer, `x · Wᵀ + b`: dfdx's `Linear` bit for bit (outputs, and the
/// gradients of the input, `weight` and `bias`), with one matrix product for a whole batch of
/// sequences where dfdx takes one per sequence (about two thirds of the time of a ViT-sized
/// layer's forward and backward pass: `cargo bench -p quant-benches --bench linear`). A drop-in
/// for it: the same
/// parameters under the same names (`weight` `(O, I)`, `bias` `(O)`), initialised from the same
/// random draws, and it converts, quantizes and exports as the same layer kind (`Linear`).
/// Inputs `(I)`, `(B, I)` and `(B, S, I)`.
///
/// ```
/// use dfdx::prelude::*;
/// use quant_dfdx::nn::builders;
///
/// let dev = Cpu::seed_from_u64(0);
/// let ours = dev.build_module::<builders::Linear<8, 4>, f32>();
/// let dev = Cpu::seed_from_u64(0);
/// let dfdx = dev.build_module::<Linear<8, 4>, f32>();
/// assert_eq!(ours.weight.as_vec(), dfdx.weight.as_vec());
/// let x: Tensor<Rank3<2, 5, 8>, f32, _> = dev.sample_normal();
/// assert_eq!(ours.forward(x.clone()).as_vec(), dfdx.forward(x).as_vec());
/// ```
#[derive(Debug, Clone)]
pub struct Linear<const I: usize, const O: usize, E: Dtype = f32, D: Storage<E> = Cpu> {
    /// The weights, `(O, I)`.
    pub weight: Tensor<Rank2<O, I>, E, D>,
    /// The bias, `(O)`.
    pub bias: Tensor<Rank1<O>, E, D>,
}

impl<const I: usize, const O: usize, E: Dtype, D: Storage<E>> NonMutableModule
    for Linear<I, O, E, D>
{
}

impl<
        const I: usize,
        const O: usize,
        E: Dtype + num_traits::Float + rand_distr::uniform::SampleUniform,
        D: Device<E>,
    > TensorCollection<E, D> for Linear<I, O, E, D>
{
    type To<E2: Dtype, D2: Device<E2>> = Linear<I, O, E2, D2>;

    fn iter_tensors<V: ModuleVisitor<Self, E, D>>(
        visitor: &mut V,
    ) -> std::result::Result<Option<Self::To<V::E2, V::D2>>, V::Err> {
        // dfdx's initialisation, draw for draw: uniform in ±1/√I for both.
        visitor.visit_fields(
            (
                Self::tensor(
                    "weight",
                    |s| &s.weight,
                    |s| &mut s.weight,
                    TensorOptions::reset_with(|t| t.try_fill_with_distr(fan_in_uniform(I))),
                ),
                Self::tensor(
                    "bias",
                    |s| &s.bias,
                    |s| &mut s.bias,
                    TensorOptions::reset_with(|t| t.try_fill_with_distr(fan_in_uniform(I))),
                ),
            ),
            |(weight, bias)| Linear { weight, bias },
        )
    }
}

impl<const I: usize, const O: usize, X> Module<X> for Linear<I, O, f32, Cpu>
where
    X: LinearInput<I, O>,
{
    type Output = X::Output;
    type Error = CpuError;

    fn try_forward(&self, x: X) -> std::result::Result<Self::Output, CpuError> {
        x.linear(
            self.weight.retaped::<X::Tape>(),
            self.bias.retaped::<X::Tape>(),
        )
        .map_err(super::to_cpu_error)
    }
}

/// An input of [`linear`]: `(I)`, `(B, I)` or `(B, S, I)` on the CPU, with any tape.
pub trait LinearInput<const I: usize, const O: usize>: Sized {
    /// The input's tape, which the weights and the bias take for the op.
    type Tape: Tape<f32, Cpu> + Merge<Self::Tape>;
    /// The output: the input's shape with `O` for `I`.
    type Output;

    /// `self · weightᵀ + bias`.
    ///
    /// # Errors
    /// The device's (allocation).
    fn linear(
        self,
        weight: Tensor<Rank2<O, I>, f32, Cpu, Self::Tape>,
        bias: Tensor<Rank1<O>, f32, Cpu, Self::Tape>,
    ) -> Result<Self::Output>;

    /// `q_in(self) · q_w(weight)ᵀ + bias`, `q_w` the weights' quantization and `q_in` the
    /// input's, if any (quantizers' ops, [`DynQuantization`]): the numbers of
    /// [`linear`](Self::linear) on the fake-quantized input and weights, with gradients for the
    /// input, `weight` and the quantizers' parameters. Where the one-product path runs, the
    /// quantized input and weights stay inside the op (no dfdx tensors, so no zeroed gradient
    /// buffers for them); elsewhere each quantizer's op runs as a tensor op of its own.
    ///
    /// # Errors
    /// The quantizers'; the device's (allocation).
    fn linear_quantized(
        self,
        input: Option<DynQuantization>,
        weight: &Tensor<Rank2<O, I>, f32, Cpu>,
        weights: DynQuantization,
        bias: Tensor<Rank1<O>, f32, Cpu, Self::Tape>,
    ) -> Result<Self::Output>;
}

/// [`LinearInput::linear_quantized`] as separate ops: each quantizer's op on its tensor, then
/// [`LinearInput::linear`].
fn linear_quantized_ops<S: Shape, const I: usize, const O: usize, T>(
    x: Tensor<S, f32, Cpu, T>,
    input: Option<DynQuantization>,
    weight: &Tensor<Rank2<O, I>, f32, Cpu>,
    weights: DynQuantization,
    bias: Tensor<Rank1<O>, f32, Cpu, T>,
) -> Result<<Tensor<S, f32, Cpu, T> as LinearInput<I, O>>::Output>
where
    T: Tape<f32, Cpu> + Merge<T>,
    Tensor<S, f32, Cpu, T>: LinearInput<I, O, Tape = T>,
{
    let x = match input {
        Some(q) => quant_core::dfdx_ops::elementwise_op(x, q.forward, q.backward, q.accumulate)?,
        None => x,
    };
    x.linear(quantized_weight(weight, weights)?, bias)
}

/// The weights through their quantizer's op, as a tensor on a tape of its own.
fn quantized_weight<const I: usize, const O: usize, T: Tape<f32, Cpu>>(
    weight: &Tensor<Rank2<O, I>, f32, Cpu>,
    q: DynQuantization,
) -> Result<Tensor<Rank2<O, I>, f32, Cpu, T>> {
    quant_core::dfdx_ops::elementwise_op(weight.retaped::<T>(), q.forward, q.backward, q.accumulate)
}

/// `x · weightᵀ + bias` for `x` of shape `(I)`, `(B, I)` or `(B, S, I)`: the [`Linear`]
/// layer's op, dfdx's `x.matmul(weight.permute()) + bias` bit for bit; records its backward
/// pass on an `OwnedTape` (`x`, `weight` and `bias` get gradients).
///
/// # Errors
/// The device's (allocation).
pub fn linear<const I: usize, const O: usize, X: LinearInput<I, O>>(
    x: X,
    weight: Tensor<Rank2<O, I>, f32, Cpu, X::Tape>,
    bias: Tensor<Rank1<O>, f32, Cpu, X::Tape>,
) -> Result<X::Output> {
    x.linear(weight, bias)
}

impl<const I: usize, const O: usize, T> LinearInput<I, O> for Tensor<Rank1<I>, f32, Cpu, T>
where
    T: Tape<f32, Cpu> + Merge<T>,
{
    type Tape = T;
    type Output = Tensor<Rank1<O>, f32, Cpu, T>;

    fn linear(
        self,
        weight: Tensor<Rank2<O, I>, f32, Cpu, T>,
        bias: Tensor<Rank1<O>, f32, Cpu, T>,
    ) -> Result<Self::Output> {
        // One row is `gemm`'s vector path: dfdx's ops.
        Ok(self
            .try_matmul(weight.try_permute::<_, Axes2<1, 0>>()?)?
            .try_add(bias)?)
    }

    fn linear_quantized(
        self,
        input: Option<DynQuantization>,
        weight: &Tensor<Rank2<O, I>, f32, Cpu>,
        weights: DynQuantization,
        bias: Tensor<Rank1<O>, f32, Cpu, T>,
    ) -> Result<Self::Output> {
        linear_quantized_ops(self, input, weight, weights, bias)
    }
}

impl<B: Dim, const I: usize, const O: usize, T> LinearInput<I, O>
    for Tensor<(B, Const<I>), f32, Cpu, T>
where
    T: Tape<f32, Cpu> + Merge<T>,
{
    type Tape = T;
    type Output = Tensor<(B, Const<O>), f32, Cpu, T>;

    fn linear(
        self,
        weight: Tensor<Rank2<O, I>, f32, Cpu, T>,
        bias: Tensor<Rank1<O>, f32, Cpu, T>,
    ) -> Result<Self::Output> {
        let (batch, _) = *self.shape();
        // dfdx takes one product for the batch: one sequence of `batch` rows.
        let Some(plan) = Affine::new(1, batch.size(), I, O, T::OWNS_TAPE) else {
            let y = self.try_matmul(weight.try_permute::<_, Axes2<1, 0>>()?)?;
            let shape = *y.shape();
            return Ok(y.try_add(bias.try_broadcast_like(&shape)?)?);
        };
        affine(self, weight, bias, plan, (batch, Const::<O>))
    }

    fn linear_quantized(
        self,
        input: Option<DynQuantization>,
        weight: &Tensor<Rank2<O, I>, f32, Cpu>,
        weights: DynQuantization,
        bias: Tensor<Rank1<O>, f32, Cpu, T>,
    ) -> Result<Self::Output> {
        let (batch, _) = *self.shape();
        let Some(plan) = Affine::new(1, batch.size(), I, O, T::OWNS_TAPE) else {
            return linear_quantized_ops(self, input, weight, weights, bias);
        };
        let shape = (batch, Const::<O>);
        affine_quantized(self, input, weight, weights, bias, plan, shape)
    }
}

impl<B: Dim, S: Dim, const I: usize, const O: usize, T> LinearInput<I, O>
    for Tensor<(B, S, Const<I>), f32, Cpu, T>
where
    T: Tape<f32, Cpu> + Merge<T>,
{
    type Tape = T;
    type Output = Tensor<(B, S, Const<O>), f32, Cpu, T>;

    fn linear(
        self,
        weight: Tensor<Rank2<O, I>, f32, Cpu, T>,
        bias: Tensor<Rank1<O>, f32, Cpu, T>,
    ) -> Result<Self::Output> {
        let (batch, seq, _) = *self.shape();
        let Some(plan) = Affine::new(batch.size(), seq.size(), I, O, T::OWNS_TAPE) else {
            let y = self.try_matmul(weight.try_permute::<_, Axes2<1, 0>>()?)?;
            let shape = *y.shape();
            return Ok(y.try_add(bias.try_broadcast_like(&shape)?)?);
        };
        affine(self, weight, bias, plan, (batch, seq, Const::<O>))
    }

    fn linear_quantized(
        self,
        input: Option<DynQuantization>,
        weight: &Tensor<Rank2<O, I>, f32, Cpu>,
        weights: DynQuantization,
        bias: Tensor<Rank1<O>, f32, Cpu, T>,
    ) -> Result<Self::Output> {
        let (batch, seq, _) = *self.shape();
        let Some(plan) = Affine::new(batch.size(), seq.size(), I, O, T::OWNS_TAPE) else {
            return linear_quantized_ops(self, input, weight, weights, bias);
        };
        let shape = (batch, seq, Const::<O>);
        affine_quantized(self, input, weight, weights, bias, plan, shape)
    }
}

/// `plan`'s forward product, `x · wᵀ + bias`; a length that does not match is an error naming
/// the layer's input.
fn product<const I: usize>(plan: &Affine, x: &[f32], w: &[f32], bias: &[f32]) -> Result<Vec<f32>> {
    plan.forward(x, w, bias)
        .ok_or_else(|| QuantError::LengthMismatch {
            what: "Linear input".into(),
            expected: plan.total_rows() * I,
            actual: x.len(),
        })
}

/// The bias's gradient as dfdx's broadcast add gives it: each row of the output's gradient
/// (rows as long as the bias) added in order.
fn add_bias_gradient(db: &mut [f32], dy: &[f32]) {
    for row in dy.chunks_exact(db.len().max(1)) {
        for (d, g) in db.iter_mut().zip(row) {
            *d += *g;
        }
    }
}

/// The one-product path: `plan`'s products, recorded as one op.
fn affine<Sx: Shape, So: Shape, const I: usize, const O: usize, T>(
    x: Tensor<Sx, f32, Cpu, T>,
    weight: Tensor<Rank2<O, I>, f32, Cpu, T>,
    bias: Tensor<Rank1<O>, f32, Cpu, T>,
    plan: Affine,
    out_shape: So,
) -> Result<Tensor<So, f32, Cpu, T>>
where
    T: Tape<f32, Cpu> + Merge<T>,
{
    // Gradient buffers follow physical storage: work on contiguous tensors only.
    let (x, x_tape) = x.try_contiguous()?.split_tape();
    let (weight, w_tape) = weight.try_contiguous()?.split_tape();
    let (bias, b_tape) = bias.try_contiguous()?.split_tape();
    let mut tape = x_tape.merge(w_tape).merge(b_tape);

    let x_data = read(&x);
    let w_data = read(&weight);
    let y = product::<I>(&plan, &x_data, &w_data, &read(&bias))?;
    let out = x.device().try_tensor_from_vec(y, out_shape)?;

    let (x_ghost, w_ghost, b_ghost) = (x.ghost(), weight.ghost(), bias.ghost());
    record(&out, &mut tape, move |dy, grads| {
        add_bias_gradient(grads.get_or_alloc_mut(&b_ghost)?, dy);
        plan.input_gradient(grads.get_or_alloc_mut(&x_ghost)?, dy, &w_data)
            .ok_or(CpuError::WrongNumElements)?;
        plan.weight_gradient(grads.get_or_alloc_mut(&w_ghost)?, &x_data, dy)
            .ok_or(CpuError::WrongNumElements)
    });
    Ok(out.put_tape(tape))
}

/// The one-product path with the input (when `input` is given) and the weights quantized
/// inside the op: [`affine`]'s products on `q_in(x)` and `q_w(weight)`, whose gradients go from
/// pooled buffers (each task of a product zeroes its rows as it starts) straight into the
/// quantizers' backward passes, which add into `x`'s and `weight`'s gradients and their
/// parameters'. The same additions, in the same order, as the quantizers' ops followed by
/// [`affine`]: the same bits.
fn affine_quantized<Sx: Shape, So: Shape, const I: usize, const O: usize, T>(
    x: Tensor<Sx, f32, Cpu, T>,
    input: Option<DynQuantization>,
    weight: &Tensor<Rank2<O, I>, f32, Cpu>,
    weights: DynQuantization,
    bias: Tensor<Rank1<O>, f32, Cpu, T>,
    plan: Affine,
    out_shape: So,
) -> Result<Tensor<So, f32, Cpu, T>>
where
    T: Tape<f32, Cpu> + Merge<T>,
{
    let (x, x_tape) = x.try_contiguous()?.split_tape();
    let (bias, b_tape) = bias.try_contiguous()?.split_tape();
    let mut tape = x_tape.merge(b_tape);

    let x_data = read(&x);
    // The input's quantization: its output, and the rest of its op for the backward pass.
    let input = match input {
        Some(q) => {
            let mut quantized = Scratch::output(x_data.len());
            let state = (q.forward)(&x_data, &mut quantized)?;
            Some((quantized, state, q.backward, q.accumulate))
        }
        None => None,
    };
    let w_data = read(weight);
    let mut w_quantized = Scratch::output(w_data.len());
    let w_state = (weights.forward)(&w_data, &mut w_quantized)?;
    let product_input: &[f32] = input.as_ref().map_or(&x_data, |(q, ..)| q);
    let y = product::<I>(&plan, product_input, &w_quantized, &read(&bias))?;
    let out = x.device().try_tensor_from_vec(y, out_shape)?;

    let (x_ghost, w_ghost, b_ghost) = (x.ghost(), weight.ghost(), bias.ghost());
    let (w_backward, w_accumulate) = (weights.backward, weights.accumulate);
    record(&out, &mut tape, move |dy, grads| {
        add_bias_gradient(grads.get_or_alloc_mut(&b_ghost)?, dy);
        let quantized_input = match input {
            Some((quantized, state, backward, accumulate)) => {
                let mut dx_quantized = Scratch::output(quantized.len());
                plan.input_gradient_fresh(&mut dx_quantized, dy, &w_quantized)
                    .ok_or(CpuError::WrongNumElements)?;
                let dx = grads.get_or_alloc_mut(&x_ghost)?;
                let dparams = backward(state, &x_data, &dx_quantized, dx);
                Scratch::recycle(dx_quantized);
                accumulate(dparams, grads)?;
                Some(quantized)
            }
            None => {
                plan.input_gradient(grads.get_or_alloc_mut(&x_ghost)?, dy, &w_quantized)
                    .ok_or(CpuError::WrongNumElements)?;
                None
            }
        };
        // The input's gradient is done with the quantized weights: their buffer takes their
        // gradient, which the product writes whole (one weights-sized buffer fewer in the
        // step's working set, and one already in cache).
        let mut dw_quantized = w_quantized;
        let product_input: &[f32] = quantized_input.as_deref().unwrap_or(&x_data);
        plan.weight_gradient_fresh(&mut dw_quantized, product_input, dy)
            .ok_or(CpuError::WrongNumElements)?;
        if let Some(quantized) = quantized_input {
            Scratch::recycle(quantized);
        }
        let dparams = w_backward(
            w_state,
            &w_data,
            &dw_quantized,
            grads.get_or_alloc_mut(&w_ghost)?,
        );
        Scratch::recycle(dw_quantized);
        w_accumulate(dparams, grads)
    });
    Ok(out.put_tape(tape))
}
