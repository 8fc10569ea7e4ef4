//! Multi-head self-attention whose four projections are [`Linear`]s: dfdx's
//! `MultiHeadAttention` bit for bit, with one matrix product per projection for the whole
//! batch.

use dfdx::prelude::*;
use dfdx::shapes::Dtype;
use dfdx::tensor::CpuError;
use dfdx::tensor_ops::Device;

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
        let v = v.try_reshape_like(&(b, s, H, V / H))?;
        let v = v.try_permute::<_, Axes4<0, 2, 1, 3>>()?;

        let k = self.w_k.try_forward(src.clone().retaped::<T>())?;
        let k = k.try_reshape_like(&(b, s, H, K / H))?;
        let k = k.try_permute::<_, Axes4<0, 2, 3, 1>>()?;

        let q = self.w_q.try_forward(src.put_tape(tape))?;
        let q = q.try_reshape_like(&(b, s, H, K / H))?;
        let q = q.try_permute::<_, Axes4<0, 2, 1, 3>>()?;

        let scalar = (1.0 / ((K / H) as f64).sqrt()) as f32;
        let weights = q.try_matmul(k)?.try_mul(scalar)?;
        let weights = weights.try_softmax::<Axis<3>>()?;

        let tokens = weights.try_matmul(v)?;
        let tokens = tokens.try_permute::<_, Axes4<0, 2, 1, 3>>()?;
        let tokens = tokens.try_reshape_like(&(b, s, Const::<V>))?;

        self.w_o.try_forward(tokens)
    }
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

#[cfg(test)]
mod tests {
    use super::super::bits::all_same;
    use super::*;

    type Traced<S> = Tensor<S, f32, Cpu, OwnedTape<f32, Cpu>>;
    type Weights<'a> = [&'a Tensor<Rank2<12, 12>, f32, Cpu>; 4];
    type Biases<'a> = [&'a Tensor<Rank1<12>, f32, Cpu>; 4];

    /// Output and the gradients of the input and of every parameter (`w_q`, `w_k`, `w_v`,
    /// `w_o`: weights, then biases), in a residual block (`attention(x) + x`) under a loss
    /// that weighs every output differently.
    fn run<S: Shape, A>(
        attention: &A,
        (weights, biases): (Weights, Biases),
        x: &Tensor<S, f32, Cpu>,
        w: &Tensor<S, f32, Cpu>,
    ) -> Vec<Vec<f32>>
    where
        A: Module<Traced<S>, Output = Traced<S>>,
    {
        let t = x.clone().leaky_traced();
        let out = attention.forward(t.retaped::<OwnedTape<f32, Cpu>>()) + t;
        let mut all = vec![out.as_vec()];
        let grads = (out * w.clone()).sum().backward();
        all.push(grads.get(x).as_vec());
        all.extend(weights.iter().map(|p| grads.get(*p).as_vec()));
        all.extend(biases.iter().map(|p| grads.get(*p).as_vec()));
        all
    }

    #[test]
    fn outputs_and_gradients_are_dfdx_attentions_bit_for_bit() {
        let ours = Cpu::seed_from_u64(3).build_module::<builder::MultiHeadAttention<12, 3>, f32>();
        let theirs = Cpu::seed_from_u64(3)
            .build_module::<dfdx::nn::builders::MultiHeadAttention<12, 3>, f32>();
        let p_ours = (
            [
                &ours.w_q.weight,
                &ours.w_k.weight,
                &ours.w_v.weight,
                &ours.w_o.weight,
            ],
            [
                &ours.w_q.bias,
                &ours.w_k.bias,
                &ours.w_v.bias,
                &ours.w_o.bias,
            ],
        );
        let p_theirs = (
            [
                &theirs.w_q.weight,
                &theirs.w_k.weight,
                &theirs.w_v.weight,
                &theirs.w_o.weight,
            ],
            [
                &theirs.w_q.bias,
                &theirs.w_k.bias,
                &theirs.w_v.bias,
                &theirs.w_o.bias,
            ],
        );
        for (a, b) in p_ours.0.iter().zip(p_theirs.0) {
            assert!(all_same(&a.as_vec(), &b.as_vec()), "initial weights");
        }
        let what = |i: usize| match i {
            0 => "outputs".to_string(),
            1 => "input gradients".to_string(),
            i => format!("parameter gradient {}", i - 2),
        };
        let dev = Cpu::seed_from_u64(4);
        for seq in [16, 5, 1] {
            let x: Tensor<(usize, usize, Const<12>), f32, Cpu> =
                dev.sample_normal_like(&(6, seq, Const));
            let w = dev.sample_normal_like(x.shape());
            let a = run(&ours, p_ours, &x, &w);
            let b = run(&theirs, p_theirs, &x, &w);
            for i in 0..a.len() {
                assert!(all_same(&a[i], &b[i]), "{}, {seq} tokens", what(i));
            }
        }
        let x: Tensor<(usize, Const<12>), f32, Cpu> = dev.sample_normal_like(&(7, Const));
        let w = dev.sample_normal_like(x.shape());
        let (a, b) = (run(&ours, p_ours, &x, &w), run(&theirs, p_theirs, &x, &w));
        for i in 0..a.len() {
            assert!(all_same(&a[i], &b[i]), "{}, one sequence", what(i));
        }
    }
}
