//! Multi-head self-attention whose four projections are [`Linear`]s: dfdx's
//! `MultiHeadAttention` bit for bit, with one matrix product per projection for the whole
//! batch.

use dfdx::prelude::*;
use dfdx::shapes::Dtype;
use dfdx::tensor::CpuError;
use dfdx::tensor_ops::Device;

use quant_core::kernels::attention::{Attention, AttentionProducts};
use quant_core::scratch::Scratch;

use super::tape::{accumulate, read, record};
use super::Linear;

pub mod builder {
    /// Builds a [`MultiHeadAttention`](super::MultiHeadAttention): `M` features, `H` heads,
    /// queries and keys `K` wide, values `V` wide.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct MultiHeadAttention<
        const M: usize,
        const H: usize,
        const K: usize = M,
        const V: usize = M,
    >;
}

impl<const M: usize, const H: usize, const K: usize, const V: usize, E: Dtype, D: Device<E>>
    BuildOnDevice<D, E> for builder::MultiHeadAttention<M, H, K, V>
where
    MultiHeadAttention<M, H, K, V, E, D>: BuildModule<D, E>,
{
    type Built = MultiHeadAttention<M, H, K, V, E, D>;
    fn try_build_on_device(device: &D) -> Result<Self::Built, D::Err> {
        Self::Built::try_build(device)
    }
}

/// Multi-head self-attention, `softmax(q·kᵀ/√(K/H))·v` per head between the projections `w_q`,
/// `w_k`, `w_v` and `w_o`: dfdx's `MultiHeadAttention` bit for bit (outputs and every
/// gradient), its projections [`Linear`]s, so each takes one matrix product for the whole
/// batch instead of one per sequence. A drop-in for it in self-attention (`src` of shape
/// `(S, M)` or `(B, S, M)`): the same parameters under the same names (safetensors files load
/// either way), the same initial draws, and it converts, quantizes and exports as the same
/// layer kind. Attention between different queries, keys and values is dfdx's.
///
/// ```
/// use dfdx::prelude::*;
/// use quant_dfdx::nn::builders;
///
/// let ours = Cpu::seed_from_u64(0).build_module::<builders::MultiHeadAttention<8, 2>, f32>();
/// let dev = Cpu::seed_from_u64(0);
/// let dfdx = dev.build_module::<MultiHeadAttention<8, 2>, f32>();
/// let x: Tensor<Rank3<2, 5, 8>, f32, _> = dev.sample_normal();
/// assert_eq!(ours.forward(x.clone()).as_vec(), dfdx.forward(x).as_vec());
/// ```
#[derive(Debug, Clone)]
pub struct MultiHeadAttention<
    const M: usize,
    const H: usize,
    const K: usize = M,
    const V: usize = M,
    E: Dtype = f32,
    D: Storage<E> = Cpu,
> {
    /// The queries' projection.
    pub w_q: Linear<M, K, E, D>,
    /// The keys' projection.
    pub w_k: Linear<M, K, E, D>,
    /// The values' projection.
    pub w_v: Linear<M, V, E, D>,
    /// The output projection.
    pub w_o: Linear<V, M, E, D>,
}

impl<const M: usize, const H: usize, const K: usize, const V: usize, E: Dtype, D: Storage<E>>
    NonMutableModule for MultiHeadAttention<M, H, K, V, E, D>
{
}

impl<const M: usize, const H: usize, const K: usize, const V: usize, E, D: Device<E>>
    TensorCollection<E, D> for MultiHeadAttention<M, H, K, V, E, D>
where
    E: Dtype + num_traits::Float + rand_distr::uniform::SampleUniform,
{
    type To<E2: Dtype, D2: Device<E2>> = MultiHeadAttention<M, H, K, V, E2, D2>;

    fn iter_tensors<W: ModuleVisitor<Self, E, D>>(
        visitor: &mut W,
    ) -> Result<Option<Self::To<W::E2, W::D2>>, W::Err> {
        visitor.visit_fields(
            (
                Self::module("w_q", |s| &s.w_q, |s| &mut s.w_q),
                Self::module("w_k", |s| &s.w_k, |s| &mut s.w_k),
                Self::module("w_v", |s| &s.w_v, |s| &mut s.w_v),
                Self::module("w_o", |s| &s.w_o, |s| &mut s.w_o),
            ),
            |(w_q, w_k, w_v, w_o)| MultiHeadAttention { w_q, w_k, w_v, w_o },
        )
    }
}

impl<const M: usize, const H: usize, const K: usize, const V: usize, B, S, T>
    Module<Tensor<(B, S, Const<M>), f32, Cpu, T>> for MultiHeadAttention<M, H, K, V, f32, Cpu>
where
    B: Dim,
    S: Dim,
    T: Tape<f32, Cpu> + Merge<T>,
{
    type Output = Tensor<(B, S, Const<M>), f32, Cpu, T>;
    type Error = CpuError;

    /// dfdx's self-attention, op for op (the projections' order included: the input's
    /// gradient is summed in the order dfdx sums it).
    fn try_forward(
        &self,
        src: Tensor<(B, S, Const<M>), f32, Cpu, T>,
    ) -> Result<Self::Output, CpuError> {
        if H == 0 || !K.is_multiple_of(H) || !V.is_multiple_of(H) {
            return Err(CpuError::WrongNumElements);
        }
        let (src, tape) = src.split_tape();
        let (b, s, _) = *src.shape();

        let v = self.w_v.try_forward(src.clone().retaped::<T>())?;
        let k = self.w_k.try_forward(src.clone().retaped::<T>())?;
        let q = self.w_q.try_forward(src.put_tape(tape))?;

        let scalar = (1.0 / ((K / H) as f64).sqrt()) as f32;
        if let Some(plan) = Attention::new(b.size(), s.size(), H, K / H, V / H) {
            let tokens = attention_core(q, k, v, plan, scalar)?;
            return self.w_o.try_forward(tokens);
        }
        let v = v.try_reshape_like(&(b, s, H, V / H))?;
        let v = v.try_permute::<_, Axes4<0, 2, 1, 3>>()?;
        let k = k.try_reshape_like(&(b, s, H, K / H))?;
        let k = k.try_permute::<_, Axes4<0, 2, 3, 1>>()?;
        let q = q.try_reshape_like(&(b, s, H, K / H))?;
        let q = q.try_permute::<_, Axes4<0, 2, 1, 3>>()?;

        let weights = q.try_matmul(k)?.try_mul(scalar)?;
        let weights = weights.try_softmax::<Axis<3>>()?;

        let tokens = weights.try_matmul(v)?;
        let tokens = tokens.try_permute::<_, Axes4<0, 2, 1, 3>>()?;
        let tokens = tokens.try_reshape_like(&(b, s, Const::<V>))?;

        self.w_o.try_forward(tokens)
    }
}

/// `(B, S, V)` values on a tape `T`.
type Tokens<B, S, const V: usize, T> = Tensor<(B, S, Const<V>), f32, Cpu, T>;

/// `softmax(q·kᵀ·scale)·v` per sequence and head on `(B, S, K)` queries and keys and `(B, S, V)`
/// values (heads side by side in the last axis), as one op: `plan`'s
/// ([`quant_core::kernels::attention`], dfdx's bits), its backward pass recorded on the tape.
fn attention_core<B: Dim, S: Dim, const K: usize, const V: usize, T>(
    q: Tensor<(B, S, Const<K>), f32, Cpu, T>,
    k: Tensor<(B, S, Const<K>), f32, Cpu, T>,
    v: Tensor<(B, S, Const<V>), f32, Cpu, T>,
    plan: Attention,
    scale: f32,
) -> Result<Tokens<B, S, V, T>, CpuError>
where
    T: Tape<f32, Cpu> + Merge<T>,
{
    // Gradient buffers follow physical storage: work on contiguous tensors only.
    let (q, q_tape) = q.try_contiguous()?.split_tape();
    let (k, k_tape) = k.try_contiguous()?.split_tape();
    let (v, v_tape) = v.try_contiguous()?.split_tape();
    let mut tape = q_tape.merge(k_tape).merge(v_tape);
    let (q_data, k_data, v_data) = (read(&q), read(&k), read(&v));
    let (y, softmax) = plan
        .forward(&q_data, &k_data, &v_data, scale)
        .ok_or(CpuError::WrongNumElements)?;
    let (b, s, _) = *v.shape();
    let out = v.device().try_tensor_from_vec(y, (b, s, Const::<V>))?;
    let ghosts = (q.ghost(), k.ghost(), v.ghost());
    record(&out, &mut tape, move |dy, grads| {
        // Each of the three gradients is borrowed alone: computed apart, then added.
        // Zeroed on every thread, from the pool, and given back to it after.
        let mut dq = Scratch::zeros(q_data.len());
        let mut dk = Scratch::zeros(k_data.len());
        let mut dv = Scratch::zeros(v_data.len());
        let inputs = (&q_data[..], &k_data[..], &v_data[..]);
        plan.backward(&softmax, inputs, scale, dy, &mut dq, &mut dk, &mut dv)
            .ok_or(CpuError::WrongNumElements)?;
        accumulate(grads.get_or_alloc_mut(&ghosts.0)?, &dq)?;
        accumulate(grads.get_or_alloc_mut(&ghosts.1)?, &dk)?;
        accumulate(grads.get_or_alloc_mut(&ghosts.2)?, &dv)?;
        [dq, dk, dv].into_iter().for_each(Scratch::recycle);
        Ok(())
    });
    Ok(out.put_tape(tape))
}

/// `(B, H, S1, S2)` scores (or probabilities) on a tape `T`.
pub type HeadScores<B, const H: usize, S1, S2, T> = Tensor<(B, Const<H>, S1, S2), f32, Cpu, T>;

/// Attention's scores `q·kᵀ·scale` for `H` heads: `(B, S1, K)` queries and `(B, S2, K)` keys,
/// heads side by side in the last axis (dfdx's reshape to `(.., H, K / H)`), give
/// `(B, H, S1, S2)` scores, dfdx's bits for its reshape, permute, `matmul` and `mul` by
/// `scale`. Where [`AttentionProducts`] has a plan, one op without permuted copies; elsewhere
/// dfdx's ops. For a model that puts ops of its own between the products (the quantized
/// attention); [`attention_context`] is the second product.
///
/// Errors if `H` does not divide `K` or the keys are not as many sequences as the queries.
///
/// ```
/// use dfdx::prelude::*;
/// use quant_dfdx::nn::{attention_context, attention_scores};
///
/// let dev = Cpu::default();
/// let q: Tensor<(usize, usize, Const<8>), f32, _> = dev.sample_normal_like(&(2, 5, Const));
/// let k: Tensor<(usize, usize, Const<8>), f32, _> = dev.sample_normal_like(&(2, 4, Const));
/// let v: Tensor<(usize, usize, Const<6>), f32, _> = dev.sample_normal_like(&(2, 4, Const));
/// let scores = attention_scores::<2, _, _, _, 8, _>(q, k, 0.5)?;
/// assert_eq!(scores.shape().concrete(), [2, 2, 5, 4]);
/// let context = attention_context(scores.softmax::<Axis<3>>(), v)?;
/// assert_eq!(context.shape().concrete(), [2, 5, 6]);
/// # Ok::<(), dfdx::tensor::CpuError>(())
/// ```
pub fn attention_scores<const H: usize, B, S1, S2, const K: usize, T>(
    q: Tensor<(B, S1, Const<K>), f32, Cpu, T>,
    k: Tensor<(B, S2, Const<K>), f32, Cpu, T>,
    scale: f32,
) -> Result<HeadScores<B, H, S1, S2, T>, CpuError>
where
    B: Dim,
    S1: Dim,
    S2: Dim,
    T: Tape<f32, Cpu> + Merge<T>,
{
    let (b, s1, _) = *q.shape();
    let s2 = k.shape().1;
    if H == 0 || !K.is_multiple_of(H) || k.shape().0.size() != b.size() {
        return Err(CpuError::WrongNumElements);
    }
    let Some(plan) = AttentionProducts::new(b.size(), (s1.size(), s2.size()), H, K / H) else {
        let q = q
            .try_reshape_like(&(b, s1, Const::<H>, K / H))?
            .try_permute::<_, Axes4<0, 2, 1, 3>>()?;
        let k = k
            .try_reshape_like(&(b, s2, Const::<H>, K / H))?
            .try_permute::<_, Axes4<0, 2, 3, 1>>()?;
        return q.try_matmul(k)?.try_mul(scale);
    };
    // Gradient buffers follow physical storage: work on contiguous tensors only.
    let (q, q_tape) = q.try_contiguous()?.split_tape();
    let (k, k_tape) = k.try_contiguous()?.split_tape();
    let mut tape = q_tape.merge(k_tape);
    let (q_data, k_data) = (read(&q), read(&k));
    let scores = plan
        .scores(&q_data, &k_data, scale)
        .ok_or(CpuError::WrongNumElements)?;
    let out = q
        .device()
        .try_tensor_from_vec(scores, (b, Const::<H>, s1, s2))?;
    let ghosts = (q.ghost(), k.ghost());
    record(&out, &mut tape, move |dy, grads| {
        // Added straight into each gradient, one borrowed at a time.
        plan.scores_backward_queries(&k_data, scale, dy, grads.get_or_alloc_mut(&ghosts.0)?)
            .ok_or(CpuError::WrongNumElements)?;
        plan.scores_backward_keys(&q_data, scale, dy, grads.get_or_alloc_mut(&ghosts.1)?)
            .ok_or(CpuError::WrongNumElements)
    });
    Ok(out.put_tape(tape))
}

/// Attention's context `probs·v` for `H` heads: `(B, H, S1, S2)` probabilities (as
/// [`attention_scores`] lays out scores) and `(B, S2, V)` values, heads side by side, give the
/// `(B, S1, V)` context, heads side by side, dfdx's bits for its reshape, permutes and
/// `matmul`. Where [`AttentionProducts`] has a plan, one op without permuted copies;
/// elsewhere dfdx's ops.
///
/// Errors if `H` does not divide `V` or the values are not as many sequences as the
/// probabilities, each of `S2` tokens.
pub fn attention_context<const H: usize, B, S1, S2, const V: usize, T>(
    probs: HeadScores<B, H, S1, S2, T>,
    v: Tensor<(B, S2, Const<V>), f32, Cpu, T>,
) -> Result<Tokens<B, S1, V, T>, CpuError>
where
    B: Dim,
    S1: Dim,
    S2: Dim,
    T: Tape<f32, Cpu> + Merge<T>,
{
    let (b, _, s1, s2) = *probs.shape();
    let (vb, vs, _) = *v.shape();
    if H == 0 || !V.is_multiple_of(H) || vb.size() != b.size() || vs.size() != s2.size() {
        return Err(CpuError::WrongNumElements);
    }
    let Some(plan) = AttentionProducts::new(b.size(), (s1.size(), s2.size()), H, V / H) else {
        let v = v
            .try_reshape_like(&(b, s2, Const::<H>, V / H))?
            .try_permute::<_, Axes4<0, 2, 1, 3>>()?;
        return probs
            .try_matmul(v)?
            .try_permute::<_, Axes4<0, 2, 1, 3>>()?
            .try_reshape_like(&(b, s1, Const::<V>));
    };
    let (probs, p_tape) = probs.try_contiguous()?.split_tape();
    let (v, v_tape) = v.try_contiguous()?.split_tape();
    let mut tape = p_tape.merge(v_tape);
    let (p_data, v_data) = (read(&probs), read(&v));
    let context = plan
        .context(&p_data, &v_data)
        .ok_or(CpuError::WrongNumElements)?;
    let out = v
        .device()
        .try_tensor_from_vec(context, (b, s1, Const::<V>))?;
    let ghosts = (probs.ghost(), v.ghost());
    record(&out, &mut tape, move |dy, grads| {
        plan.context_backward_probs(&v_data, dy, grads.get_or_alloc_mut(&ghosts.0)?)
            .ok_or(CpuError::WrongNumElements)?;
        plan.context_backward_values(&p_data, dy, grads.get_or_alloc_mut(&ghosts.1)?)
            .ok_or(CpuError::WrongNumElements)
    });
    Ok(out.put_tape(tape))
}

impl<const M: usize, const H: usize, const K: usize, const V: usize, S, T>
    Module<Tensor<(S, Const<M>), f32, Cpu, T>> for MultiHeadAttention<M, H, K, V, f32, Cpu>
where
    S: Dim,
    T: Tape<f32, Cpu> + Merge<T>,
{
    type Output = Tensor<(S, Const<M>), f32, Cpu, T>;
    type Error = CpuError;

    /// One sequence: a batch of one, as dfdx takes it.
    fn try_forward(
        &self,
        src: Tensor<(S, Const<M>), f32, Cpu, T>,
    ) -> Result<Self::Output, CpuError> {
        let s = src.shape().0;
        let out = self.try_forward(src.try_broadcast_like(&(Const::<1>, s, Const::<M>))?)?;
        out.try_reshape_like(&(s, Const::<M>))
    }
}
