//! The twins of dfdx's transformer modules: [`QMultiHeadAttention`] (`MultiHeadAttention`) and
//! [`QTransformerEncoderBlock`] (`TransformerEncoderBlock`; dfdx's `TransformerEncoder` is a
//! `Repeated` of blocks, so it converts with them).

use dfdx::nn::modules::{LayerNorm1D, MultiHeadAttention, ReLU, TransformerEncoderBlock};
use dfdx::prelude::*;

use quant_core::error::check_len;
use quant_core::{QuantError, Result};

use super::{
    join_name, visit_layer_slots, AddQuantizer, Float, LinearParams, QLinear, QResidual,
    QuantInput, QuantizedModule, Slot, SlotVisitor, TensorQuantizer,
};
use crate::convert::{Convert, LayerKind};
use crate::lower::QuantizeNodes;
use quant_core::int8::nonlinear::attention_scale;
use quant_core::int8::nonlinear::IntSoftmax;
use quant_runtime::graph::{GraphBuilder, Op, ValueId};
use quant_runtime::GraphError;

/// A [`QLinear`] whose quantizers are [`TensorQuantizer`]s on dtype `E`, device `D`.
pub type QLinearOn<const I: usize, const O: usize, E = f32, D = Cpu> =
    QLinear<I, O, TensorQuantizer<O, E, D>, TensorQuantizer<1, E, D>, E, D>;

/// The activation quantizers of an attention layer's two matrix products, all per tensor.
#[derive(Debug, Clone)]
pub struct AttentionQuantizers<E: Dtype = f32, D: Storage<E> = Cpu> {
    /// `Q` (after `w_q`), the left input of `Q·Kᵀ`: slot `query` of `<attn>.scores`.
    pub query: TensorQuantizer<1, E, D>,
    /// `K` (after `w_k`), the right input of `Q·Kᵀ`: slot `key` of `<attn>.scores`.
    pub key: TensorQuantizer<1, E, D>,
    /// The softmax output, the left input of `probs·V`: slot `probs` of `<attn>.context`.
    pub probs: TensorQuantizer<1, E, D>,
    /// `V` (after `w_v`), the right input of `probs·V`: slot `value` of `<attn>.context`.
    pub value: TensorQuantizer<1, E, D>,
}

impl AttentionQuantizers {
    /// Unconfigured (pass-through) quantizers.
    pub fn new(dev: &Cpu) -> Self {
        AttentionQuantizers {
            query: TensorQuantizer::new(dev),
            key: TensorQuantizer::new(dev),
            probs: TensorQuantizer::new(dev),
            value: TensorQuantizer::new(dev),
        }
    }

    /// Visits the slots of the two matrix products of attention layer `name`: `<name>.scores`
    /// (`query`, `key`) and `<name>.context` (`probs`, `value`).
    ///
    /// # Errors
    /// The first error of `f`.
    pub fn visit_slots(&mut self, name: &str, f: &mut SlotVisitor<'_>) -> Result<()> {
        visit_layer_slots(
            &join_name(name, "scores"),
            LayerKind::AttentionScores,
            [(Slot::QUERY, &mut self.query), (Slot::KEY, &mut self.key)],
            f,
        )?;
        visit_layer_slots(
            &join_name(name, "context"),
            LayerKind::AttentionContext,
            [
                (Slot::PROBS, &mut self.probs),
                (Slot::VALUE, &mut self.value),
            ],
            f,
        )
    }
}

impl AttentionQuantizers {
    /// The integer softmax the integer runtime runs on the scores, when `query` and `key`
    /// quantize (so the scores are integers at `s_q · s_k / √d`, `d` features per head):
    /// [`SOFTMAX_BITS`](quant_core::int8::nonlinear::SOFTMAX_BITS) bits, fixed point; `None` while either passes values through.
    ///
    /// # Errors
    /// Parameters that cannot be read, or scores the kernel cannot be prepared for.
    pub fn softmax_kernel(&self, head_features: usize, keys: usize) -> Result<Option<IntSoftmax>> {
        match (self.query.code_grid()?, self.key.code_grid()?) {
            (Some(q), Some(k)) => {
                let scale = attention_scale(q.scale as f64, k.scale as f64, head_features);
                IntSoftmax::deployed(scale as f32, keys).map(Some)
            }
            _ => Ok(None),
        }
    }
}

tensor_collection! {
    impl[E: Dtype, D: Device<E>] AttentionQuantizers<E, D> => AttentionQuantizers<E2, D2>;
    AttentionQuantizers { query, key, probs, value }
}

/// The twin of dfdx's `MultiHeadAttention<M, H, K, V>`: the same computation (`H` heads,
/// scores scaled by `1/√(K/H)`, softmax over the keys), quantized as NVIDIA's
/// pytorch-quantization quantizes BERT: the four projections are [`QLinear`] layers (weights
/// per output channel, input per tensor), and activation quantizers sit on the inputs of both
/// batched matrix products, so that each can run on integers:
///
/// | layer | kind | slots | quantizes |
/// |---|---|---|---|
/// | `<attn>.w_q`, `.w_k`, `.w_v`, `.w_o` | [`LayerKind::Linear`] | `weights`, `input` | the projections |
/// | `<attn>.scores` | [`LayerKind::AttentionScores`] | `query`, `key` | the inputs of `Q·Kᵀ` |
/// | `<attn>.context` | [`LayerKind::AttentionContext`] | `probs`, `value` | the inputs of `softmax(·)·V`: the softmax output and `V` |
///
/// A policy configures them by kind (`[kinds.AttentionScores]`, `[kinds.AttentionContext]`;
/// `input = ...` for both slots of a kind, `slots.probs = ...` for one) or by name (an
/// override with `pattern = "*.scores"`). Both kinds are quantized by the policy's `[input]`
/// defaults, like the inputs of layers with weights: an integer matrix product needs both
/// operands on a grid.
///
/// Once `query` and `key` quantize, the scores are integers at `s_q · s_k / √d`, and the
/// softmax is the integer runtime's ([`quant_core::int8::nonlinear::IntSoftmax`], fixed point, to
/// [`SOFTMAX_BITS`](quant_core::int8::nonlinear::SOFTMAX_BITS) bits), simulated ([`quant_core::dfdx_ops::int_softmax`]) so that the
/// fake-quantized and the integer model agree; the `probs` quantizer then requantizes it.
/// Self-attention lowers to the graph ops [`Op::AttentionScores`], [`Op::Softmax`] and
/// [`Op::AttentionContext`] between the projections.
///
/// It takes what dfdx's takes: a sequence `[seq, M]` or a batch `[batch, seq, M]` for
/// self-attention, or a tuple `(queries, keys, values)` of either rank, keys and values without
/// a tape.
#[derive(Debug, Clone)]
pub struct QMultiHeadAttention<
    const M: usize,
    const H: usize,
    const K: usize = M,
    const V: usize = M,
    E: Dtype = f32,
    D: Storage<E> = Cpu,
> {
    /// The query projection `[M] → [K]`.
    pub w_q: QLinearOn<M, K, E, D>,
    /// The key projection `[M] → [K]`.
    pub w_k: QLinearOn<M, K, E, D>,
    /// The value projection `[M] → [V]`.
    pub w_v: QLinearOn<M, V, E, D>,
    /// The output projection `[V] → [M]`.
    pub w_o: QLinearOn<V, M, E, D>,
    /// The quantizers of the two matrix products' inputs.
    pub matmul_inputs: AttentionQuantizers<E, D>,
}

tensor_collection! {
    impl[
        const M: usize,
        const H: usize,
        const K: usize,
        const V: usize,
        E: Dtype + num_traits::Float + rand_distr::uniform::SampleUniform,
        D: Device<E>,
    ] QMultiHeadAttention<M, H, K, V, E, D> => QMultiHeadAttention<M, H, K, V, E2, D2>;
    QMultiHeadAttention { w_q, w_k, w_v, w_o, matmul_inputs }
}

impl<const M: usize, const H: usize, const K: usize, const V: usize>
    QMultiHeadAttention<M, H, K, V>
{
    /// Wraps a float attention layer (weights copied) with unconfigured quantizers: until
    /// configured, it computes what the float layer computes.
    pub fn from_attention(attention: &impl AttentionParams<M, K, V>) -> Self {
        let dev = attention.w_q().weight().device();
        QMultiHeadAttention {
            w_q: QLinear::from_linear(attention.w_q()),
            w_k: QLinear::from_linear(attention.w_k()),
            w_v: QLinear::from_linear(attention.w_v()),
            w_o: QLinear::from_linear(attention.w_o()),
            matmul_inputs: AttentionQuantizers::new(dev),
        }
    }
}

/// A float attention layer [`QMultiHeadAttention::from_attention`] wraps: dfdx's
/// `MultiHeadAttention` or [`crate::nn::MultiHeadAttention`], `M` features, queries and keys
/// `K` wide, values `V` wide.
pub trait AttentionParams<const M: usize, const K: usize, const V: usize> {
    /// The queries' projection.
    fn w_q(&self) -> &dyn LinearParams<M, K>;
    /// The keys' projection.
    fn w_k(&self) -> &dyn LinearParams<M, K>;
    /// The values' projection.
    fn w_v(&self) -> &dyn LinearParams<M, V>;
    /// The output projection.
    fn w_o(&self) -> &dyn LinearParams<V, M>;
}

/// [`AttentionParams`] for an attention type with fields `w_q`, `w_k`, `w_v`, `w_o`.
macro_rules! attention_params {
    ($($ty:ty),+) => {$(
        impl<const M: usize, const H: usize, const K: usize, const V: usize>
            AttentionParams<M, K, V> for $ty
        {
            fn w_q(&self) -> &dyn LinearParams<M, K> {
                &self.w_q
            }
            fn w_k(&self) -> &dyn LinearParams<M, K> {
                &self.w_k
            }
            fn w_v(&self) -> &dyn LinearParams<M, V> {
                &self.w_v
            }
            fn w_o(&self) -> &dyn LinearParams<V, M> {
                &self.w_o
            }
        }

        impl<const M: usize, const H: usize, const K: usize, const V: usize> Convert for $ty {
            type Quantized = QMultiHeadAttention<M, H, K, V>;

            fn convert(&self) -> Self::Quantized {
                QMultiHeadAttention::from_attention(self)
            }
        }
    )+};
}

attention_params!(
    MultiHeadAttention<M, H, K, V, f32, Cpu>,
    crate::nn::MultiHeadAttention<M, H, K, V, f32, Cpu>
);

/// An error unless `H` heads divide `K` and `V` (dfdx's builder checks it at compile time; a
/// layer built another way may not).
fn check_heads(heads: usize, k: usize, v: usize) -> Result<()> {
    if heads == 0 || !k.is_multiple_of(heads) || !v.is_multiple_of(heads) {
        return Err(QuantError::InvalidValue {
            what: "attention heads".into(),
            value: heads.to_string(),
            expected: format!("a number of heads that divides K_DIM = {k} and V_DIM = {v}"),
        });
    }
    Ok(())
}

/// The batched attention of queries `$q` on keys `$k` and values `$v` (all taped), calling the
/// projections with `$forward` and the quantizers with `$quantize`: the body of both the
/// `Module` and the `ModuleMut` forward pass.
macro_rules! attend {
    ($self:ident, $q:expr, $k:expr, $v:expr, $forward:ident, $quantize:ident) => {{
        let (q, k, v) = ($q, $k, $v);
        check_heads(H, K, V)?;
        let b = q.shape().0;
        let s2 = v.shape().1;
        check_len(
            "attention keys (batch size of the queries)",
            b.size(),
            k.shape().0.size(),
        )?;
        check_len(
            "attention values (batch size of the queries)",
            b.size(),
            v.shape().0.size(),
        )?;
        check_len(
            "attention keys (sequence length of the values)",
            s2.size(),
            k.shape().1.size(),
        )?;

        let v = $self.w_v.$forward(v)?;
        let v = $self.matmul_inputs.value.$quantize(v)?;
        let k = $self.w_k.$forward(k)?;
        let k = $self.matmul_inputs.key.$quantize(k)?;
        let q = $self.w_q.$forward(q)?;
        let q = $self.matmul_inputs.query.$quantize(q)?;

        // The two products are one op each (dfdx's bits, without its permuted copies).
        let scale = (1.0 / ((K / H) as f64).sqrt()) as f32;
        let scores = crate::nn::attention_scores::<H, _, _, _, K, _>(q, k, scale)?;
        let probs = match $self.matmul_inputs.softmax_kernel(K / H, s2.size())? {
            Some(kernel) => quant_core::dfdx_ops::int_softmax(scores, &kernel)?,
            None => scores.try_softmax::<Axis<3>>()?,
        };
        let probs = $self.matmul_inputs.probs.$quantize(probs)?;
        let tokens = crate::nn::attention_context(probs, v)?;
        $self.w_o.$forward(tokens)
    }};
}

/// Queries `[batch, s1, M]`, keys and values `[batch, s2, M]`.
type Batch<B, S, const M: usize, T> = Tensor<(B, S, Const<M>), f32, Cpu, T>;

impl<const M: usize, const H: usize, const K: usize, const V: usize>
    QMultiHeadAttention<M, H, K, V>
{
    fn attend<B: Dim, S1: Dim, S2: Dim, T: Tape<f32, Cpu> + Merge<T>>(
        &self,
        q: Batch<B, S1, M, T>,
        k: Batch<B, S2, M, T>,
        v: Batch<B, S2, M, T>,
    ) -> Result<Batch<B, S1, M, T>> {
        attend!(self, q, k, v, try_forward, fake_quantize)
    }

    fn attend_mut<B: Dim, S1: Dim, S2: Dim, T: Tape<f32, Cpu> + Merge<T>>(
        &mut self,
        q: Batch<B, S1, M, T>,
        k: Batch<B, S2, M, T>,
        v: Batch<B, S2, M, T>,
    ) -> Result<Batch<B, S1, M, T>> {
        attend!(self, q, k, v, try_forward_mut, fake_quantize_mut)
    }
}

/// `Module` and `ModuleMut` of [`QMultiHeadAttention`] for one input form: `$input` with the
/// dimension parameters `$g`, turned into batched, taped `(q, k, v)` by `$split`, the output
/// taken back by `$join`.
macro_rules! attention_modules {
    ($([$($g:ident),*] $input:ty => $output:ty, |$x:ident| $split:expr, |$y:ident| $join:expr;)+) => {$(
        impl<const M: usize, const H: usize, const K: usize, const V: usize, $($g: Dim,)*
             T: Tape<f32, Cpu> + Merge<T>> Module<$input> for QMultiHeadAttention<M, H, K, V>
        {
            type Output = $output;
            type Error = QuantError;

            fn try_forward(&self, $x: $input) -> Result<Self::Output> {
                let (q, k, v) = $split;
                let $y = self.attend(q, k, v)?;
                $join
            }
        }

        impl<const M: usize, const H: usize, const K: usize, const V: usize, $($g: Dim,)*
             T: Tape<f32, Cpu> + Merge<T>> ModuleMut<$input> for QMultiHeadAttention<M, H, K, V>
        {
            type Output = $output;
            type Error = QuantError;

            fn try_forward_mut(&mut self, $x: $input) -> Result<Self::Output> {
                let (q, k, v) = $split;
                let $y = self.attend_mut(q, k, v)?;
                $join
            }
        }
    )+};
}

/// `[1, s, M]` from `[s, M]`, keeping the tape.
fn batch_of_one<S: Dim, const M: usize, T: Tape<f32, Cpu>>(
    x: Tensor<(S, Const<M>), f32, Cpu, T>,
) -> Result<Batch<Const<1>, S, M, T>> {
    let s = x.shape().0;
    Ok(x.try_reshape_like(&(Const::<1>, s, Const::<M>))?)
}

/// `[s, M]` from `[1, s, M]`, keeping the tape.
fn sequence_of<S: Dim, const M: usize, T: Tape<f32, Cpu>>(
    y: Batch<Const<1>, S, M, T>,
) -> Result<Tensor<(S, Const<M>), f32, Cpu, T>> {
    let s = y.shape().1;
    Ok(y.try_reshape_like(&(s, Const::<M>))?)
}

attention_modules!(
    // Self-attention on a batch: queries, keys and values are the input (one tensor id, so the
    // gradients of all three add up in it).
    [B, S] Batch<B, S, M, T> => Batch<B, S, M, T>,
        |x| (x.with_empty_tape(), x.with_empty_tape(), x), |y| Ok(y);
    // Self-attention on one sequence, as a batch of one.
    [S] Tensor<(S, Const<M>), f32, Cpu, T> => Tensor<(S, Const<M>), f32, Cpu, T>,
        |x| {
            let x = batch_of_one(x)?;
            (x.with_empty_tape(), x.with_empty_tape(), x)
        },
        |y| sequence_of(y);
    // Cross-attention on a batch: keys and values without a tape, as dfdx takes them.
    [B, S1, S2] (
        Batch<B, S1, M, T>,
        Tensor<(B, S2, Const<M>), f32, Cpu>,
        Tensor<(B, S2, Const<M>), f32, Cpu>,
    ) => Batch<B, S1, M, T>,
        |x| (x.0, x.1.retaped::<T>(), x.2.retaped::<T>()), |y| Ok(y);
    // Cross-attention on one sequence.
    [S1, S2] (
        Tensor<(S1, Const<M>), f32, Cpu, T>,
        Tensor<(S2, Const<M>), f32, Cpu>,
        Tensor<(S2, Const<M>), f32, Cpu>,
    ) => Tensor<(S1, Const<M>), f32, Cpu, T>,
        |x| (
            batch_of_one(x.0)?,
            batch_of_one(x.1.retaped::<T>())?,
            batch_of_one(x.2.retaped::<T>())?,
        ),
        |y| sequence_of(y);
);

impl<const M: usize, const H: usize, const K: usize, const V: usize> QuantizedModule
    for QMultiHeadAttention<M, H, K, V>
{
    fn visit_slots(&mut self, name: &str, f: &mut SlotVisitor<'_>) -> Result<()> {
        self.w_q.visit_slots(&join_name(name, "w_q"), f)?;
        self.w_k.visit_slots(&join_name(name, "w_k"), f)?;
        self.w_v.visit_slots(&join_name(name, "w_v"), f)?;
        self.matmul_inputs.visit_slots(name, f)?;
        self.w_o.visit_slots(&join_name(name, "w_o"), f)
    }

    /// Self-attention on `x` (`[tokens, M]`): the projections, `<name>.scores`
    /// ([`Op::AttentionScores`]), `<name>.softmax`, `<name>.context`
    /// ([`Op::AttentionContext`]) and `w_o`, with the quantizers of the matrix products'
    /// inputs on their inputs.
    fn lower(&self, name: &str, g: &mut GraphBuilder, x: ValueId) -> Result<ValueId, GraphError> {
        let inputs = &self.matmul_inputs;
        let q = self.w_q.lower(&join_name(name, "w_q"), g, x)?;
        let k = self.w_k.lower(&join_name(name, "w_k"), g, x)?;
        let v = self.w_v.lower(&join_name(name, "w_v"), g, x)?;
        let scores = join_name(name, "scores");
        let context = join_name(name, "context");
        let q = g.quantize(&join_name(&scores, Slot::QUERY.name), &inputs.query, q)?;
        let k = g.quantize(&join_name(&scores, Slot::KEY.name), &inputs.key, k)?;
        let v = g.quantize(&join_name(&context, Slot::VALUE.name), &inputs.value, v)?;
        let s = g.add(
            &scores,
            Op::AttentionScores(quant_runtime::graph::AttentionScores { heads: H }),
            &[q, k],
        )?;
        let p = g.add(join_name(name, "softmax"), Op::Softmax, &[s])?;
        let p = g.quantize(&join_name(&context, Slot::PROBS.name), &inputs.probs, p)?;
        let c = g.add(
            &context,
            Op::AttentionContext(quant_runtime::graph::AttentionContext { heads: H }),
            &[p, v],
        )?;
        self.w_o.lower(&join_name(name, "w_o"), g, c)
    }
}

/// The feed-forward part of an encoder block, as dfdx's `Residual<(Linear, ReLU, Linear)>`
/// converts.
pub type QFeedForward<const M: usize, const F: usize, E = f32, D = Cpu> =
    QResidual<(QLinearOn<M, F, E, D>, Float<ReLU>, QLinearOn<F, M, E, D>), E, D>;

/// The twin of dfdx's `TransformerEncoderBlock<M, H, F>` (post-norm, as dfdx's):
/// `x = norm1(x + self_attn(x))`, then `norm2(x + ff(x))`.
///
/// Names: `<block>.self_attn` (a [`QMultiHeadAttention`]), `<block>.add` (the add around
/// attention, [`LayerKind::Add`]: both inputs on one grid), `<block>.norm1` and
/// `<block>.norm2` ([`LayerKind::LayerNorm`], slot `input`), and the feed-forward residual
/// `<block>.ff` (its add, [`LayerKind::Add`]) with its layers `<block>.ff.0.0` and
/// `<block>.ff.0.2`.
#[derive(Debug, Clone)]
pub struct QTransformerEncoderBlock<
    const M: usize,
    const H: usize,
    const F: usize,
    E: Dtype = f32,
    D: Storage<E> = Cpu,
> {
    /// Self-attention.
    pub self_attn: QMultiHeadAttention<M, H, M, M, E, D>,
    /// The add of the attention's residual connection.
    pub add: AddQuantizer<E, D>,
    /// Layer normalisation after attention.
    pub norm1: QuantInput<LayerNorm1D<M, E, D>, E, D>,
    /// The feed-forward residual.
    pub ff: QFeedForward<M, F, E, D>,
    /// Layer normalisation after the feed-forward part.
    pub norm2: QuantInput<LayerNorm1D<M, E, D>, E, D>,
}

tensor_collection! {
    impl[
        const M: usize,
        const H: usize,
        const F: usize,
        E: Dtype + num_traits::Float + rand_distr::uniform::SampleUniform,
        D: Device<E>,
    ] QTransformerEncoderBlock<M, H, F, E, D> => QTransformerEncoderBlock<M, H, F, E2, D2>;
    QTransformerEncoderBlock { self_attn, add, norm1, ff, norm2 }
}

/// `Module` and `ModuleMut` of [`QTransformerEncoderBlock`] on `[seq, M]` and
/// `[batch, seq, M]`.
macro_rules! block_modules {
    ($([$($g:ident),*] $shape:ty;)+) => {$(
        impl<const M: usize, const H: usize, const F: usize, $($g: Dim,)*
             T: Tape<f32, Cpu> + Merge<T>> Module<Tensor<$shape, f32, Cpu, T>>
            for QTransformerEncoderBlock<M, H, F>
        {
            type Output = Tensor<$shape, f32, Cpu, T>;
            type Error = QuantError;

            fn try_forward(&self, x: Tensor<$shape, f32, Cpu, T>) -> Result<Self::Output> {
                let y = self.self_attn.try_forward(x.with_empty_tape())?;
                let x = self.add.add(x, y)?;
                let x = self.norm1.try_forward(x)?;
                let x = self.ff.try_forward(x)?;
                self.norm2.try_forward(x)
            }
        }

        impl<const M: usize, const H: usize, const F: usize, $($g: Dim,)*
             T: Tape<f32, Cpu> + Merge<T>> ModuleMut<Tensor<$shape, f32, Cpu, T>>
            for QTransformerEncoderBlock<M, H, F>
        {
            type Output = Tensor<$shape, f32, Cpu, T>;
            type Error = QuantError;

            fn try_forward_mut(&mut self, x: Tensor<$shape, f32, Cpu, T>) -> Result<Self::Output> {
                let y = self.self_attn.try_forward_mut(x.with_empty_tape())?;
                let x = self.add.add_mut(x, y)?;
                let x = self.norm1.try_forward_mut(x)?;
                let x = self.ff.try_forward_mut(x)?;
                self.norm2.try_forward_mut(x)
            }
        }
    )+};
}

block_modules!(
    [S] (S, Const<M>);
    [B, S] (B, S, Const<M>);
);

impl<const M: usize, const H: usize, const F: usize> QuantizedModule
    for QTransformerEncoderBlock<M, H, F>
{
    fn visit_slots(&mut self, name: &str, f: &mut SlotVisitor<'_>) -> Result<()> {
        self.self_attn
            .visit_slots(&join_name(name, "self_attn"), f)?;
        self.add.visit_slots(&join_name(name, "add"), f)?;
        self.norm1.visit_slots(&join_name(name, "norm1"), f)?;
        self.ff.visit_slots(&join_name(name, "ff"), f)?;
        self.norm2.visit_slots(&join_name(name, "norm2"), f)
    }

    fn lower(&self, name: &str, g: &mut GraphBuilder, x: ValueId) -> Result<ValueId, GraphError> {
        let y = self.self_attn.lower(&join_name(name, "self_attn"), g, x)?;
        let x = self.add.lower(&join_name(name, "add"), g, x, y)?;
        let x = self.norm1.lower(&join_name(name, "norm1"), g, x)?;
        let x = self.ff.lower(&join_name(name, "ff"), g, x)?;
        self.norm2.lower(&join_name(name, "norm2"), g, x)
    }
}

impl<const M: usize, const H: usize, const F: usize> Convert
    for TransformerEncoderBlock<M, H, F, f32, Cpu>
{
    type Quantized = QTransformerEncoderBlock<M, H, F>;

    fn convert(&self) -> Self::Quantized {
        QTransformerEncoderBlock {
            self_attn: self.self_attn.convert(),
            add: AddQuantizer::new(&Cpu::default()),
            norm1: self.norm1.convert(),
            ff: self.ff.convert(),
            norm2: self.norm2.convert(),
        }
    }
}
