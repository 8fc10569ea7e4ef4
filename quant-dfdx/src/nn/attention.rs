//! Multi-head self-attention whose four projections are [`Linear`]s: dfdx's
//! `MultiHeadAttention` bit for bit, with one matrix product per projection for the whole
//! batch.

use dfdx::prelude::*;
use dfdx::shapes::Dtype;
use dfdx::tensor::CpuError;
use dfdx::tensor_ops::Device;

use quant_core::kernels::attention::Attention;

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
        let mut dq = vec![0.0f32; q_data.len()];
        let mut dk = vec![0.0f32; k_data.len()];
        let mut dv = vec![0.0f32; v_data.len()];
        let inputs = (&q_data[..], &k_data[..], &v_data[..]);
        plan.backward(&softmax, inputs, scale, dy, &mut dq, &mut dk, &mut dv)
            .ok_or(CpuError::WrongNumElements)?;
        accumulate(grads.get_or_alloc_mut(&ghosts.0)?, &dq)?;
        accumulate(grads.get_or_alloc_mut(&ghosts.1)?, &dk)?;
        accumulate(grads.get_or_alloc_mut(&ghosts.2)?, &dv)
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

#[cfg(test)]
mod tests {
    use super::super::bits::all_same;
    use super::*;

    type Traced<S> = Tensor<S, f32, Cpu, OwnedTape<f32, Cpu>>;

    /// The four projections' weights and biases (`w_q`, `w_k`, `w_v`, `w_o`).
    fn parameters<const M: usize>(
        layers: [&dfdx::nn::modules::Linear<M, M, f32, Cpu>; 4],
    ) -> Vec<&(dyn HasValues + Sync)> {
        let mut all: Vec<&(dyn HasValues + Sync)> = layers.iter().map(|l| &l.weight as _).collect();
        all.extend(layers.iter().map(|l| &l.bias as &(dyn HasValues + Sync)));
        all
    }

    /// A tensor's values and its gradient, whatever its shape.
    trait HasValues {
        fn values(&self) -> Vec<f32>;
        fn gradient(&self, grads: &Gradients<f32, Cpu>) -> Vec<f32>;
    }

    impl<S: Shape> HasValues for Tensor<S, f32, Cpu> {
        fn values(&self) -> Vec<f32> {
            self.as_vec()
        }
        fn gradient(&self, grads: &Gradients<f32, Cpu>) -> Vec<f32> {
            grads.get(self).as_vec()
        }
    }

    /// Output and the gradients of the input and of every parameter, in a residual block
    /// (`attention(x) + x`) under a loss that weighs every output differently.
    fn run<S: Shape, A>(
        attention: &A,
        parameters: &[&(dyn HasValues + Sync)],
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
        all.extend(parameters.iter().map(|p| p.gradient(&grads)));
        all
    }

    /// Ours against dfdx's `MultiHeadAttention<M, H>` built from the same seed, on batches
    /// of 6 sequences of each of `lengths` tokens and on one sequence of 7, on `threads`.
    fn check<const M: usize, const H: usize>(lengths: &[usize], threads: usize)
    where
        builder::MultiHeadAttention<M, H>:
            BuildOnDevice<Cpu, f32, Built = MultiHeadAttention<M, H, M, M, f32, Cpu>>,
        dfdx::nn::builders::MultiHeadAttention<M, H>: BuildOnDevice<
            Cpu,
            f32,
            Built = dfdx::nn::modules::MultiHeadAttention<M, H, M, M, f32, Cpu>,
        >,
    {
        let ours = Cpu::seed_from_u64(3).build_module::<builder::MultiHeadAttention<M, H>, f32>();
        let theirs = Cpu::seed_from_u64(3)
            .build_module::<dfdx::nn::builders::MultiHeadAttention<M, H>, f32>();
        let as_dfdx = |l: &Linear<M, M, f32, Cpu>| dfdx::nn::modules::Linear {
            weight: l.weight.clone(),
            bias: l.bias.clone(),
        };
        let ours_as_dfdx = [&ours.w_q, &ours.w_k, &ours.w_v, &ours.w_o].map(as_dfdx);
        let p_ours = parameters([
            &ours_as_dfdx[0],
            &ours_as_dfdx[1],
            &ours_as_dfdx[2],
            &ours_as_dfdx[3],
        ]);
        let p_theirs = parameters([&theirs.w_q, &theirs.w_k, &theirs.w_v, &theirs.w_o]);
        for (a, b) in p_ours.iter().zip(&p_theirs) {
            assert!(all_same(&a.values(), &b.values()), "initial parameters");
        }
        let what = |i: usize| match i {
            0 => "outputs".to_string(),
            1 => "input gradients".to_string(),
            i => format!("parameter gradient {}", i - 2),
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let dev = Cpu::seed_from_u64(4);
            for &seq in lengths {
                let x: Tensor<(usize, usize, Const<M>), f32, Cpu> =
                    dev.sample_normal_like(&(6, seq, Const));
                let w = dev.sample_normal_like(x.shape());
                let a = run(&ours, &p_ours, &x, &w);
                let b = run(&theirs, &p_theirs, &x, &w);
                for i in 0..a.len() {
                    assert!(
                        all_same(&a[i], &b[i]),
                        "{}, {seq} tokens, M {M}, H {H}",
                        what(i)
                    );
                }
            }
            let x: Tensor<(usize, Const<M>), f32, Cpu> = dev.sample_normal_like(&(7, Const));
            let w = dev.sample_normal_like(x.shape());
            let (a, b) = (run(&ours, &p_ours, &x, &w), run(&theirs, &p_theirs, &x, &w));
            for i in 0..a.len() {
                assert!(all_same(&a[i], &b[i]), "{}, one sequence", what(i));
            }
        });
    }

    /// The fused core (3 tokens or more, heads 3 wide or more: vectors of 8 and masked
    /// remainders) and dfdx's ops (1 or 2 tokens, heads 2 wide), on one thread and on three.
    #[test]
    fn outputs_and_gradients_are_dfdx_attentions_bit_for_bit() {
        for threads in [1, 3] {
            check::<12, 3>(&[16, 5, 3, 2, 1], threads);
            check::<64, 4>(&[16], threads);
            check::<48, 4>(&[16, 9], threads);
            check::<8, 4>(&[16], threads);
        }
    }

    #[test]
    fn the_fused_core_runs_where_its_bits_are_dfdxs() {
        let fma = std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("avx");
        assert_eq!(Attention::new(64, 16, 4, 16, 16).is_some(), fma);
        assert_eq!(Attention::new(6, 3, 3, 4, 4).is_some(), fma);
        assert!(
            Attention::new(6, 2, 3, 4, 4).is_none(),
            "2 tokens: gemm's vector path"
        );
        assert!(Attention::new(6, 16, 4, 2, 2).is_none(), "heads 2 wide");
        assert!(
            Attention::new(6, 600, 4, 16, 16).is_none(),
            "600 tokens: two depth blocks"
        );
        assert!(Attention::new(0, 16, 4, 16, 16).is_none(), "no sequence");
    }
}
