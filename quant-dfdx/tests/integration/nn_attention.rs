//! `quant_dfdx::nn::MultiHeadAttention`: dfdx's self-attention bit for bit, through the fused core and through dfdx's ops.

use crate::common::{all_same, every_fma_path};
use dfdx::prelude::*;
use quant_core::kernels::attention::{Attention, AttentionProducts};
use quant_dfdx::nn::builders as builder;
use quant_dfdx::nn::{attention_context, attention_scores, Linear, MultiHeadAttention};

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
fn check<const M: usize, const H: usize>(lengths: &[usize], threads: usize, path: &str)
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
    let theirs =
        Cpu::seed_from_u64(3).build_module::<dfdx::nn::builders::MultiHeadAttention<M, H>, f32>();
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
                    "{}, {seq} tokens, M {M}, H {H}, {path}",
                    what(i)
                );
            }
        }
        let x: Tensor<(usize, Const<M>), f32, Cpu> = dev.sample_normal_like(&(7, Const));
        let w = dev.sample_normal_like(x.shape());
        let (a, b) = (run(&ours, &p_ours, &x, &w), run(&theirs, &p_theirs, &x, &w));
        for i in 0..a.len() {
            assert!(all_same(&a[i], &b[i]), "{}, one sequence, {path}", what(i));
        }
    });
}

/// The fused core (3 tokens or more, heads 3 wide or more: vectors of 8 and masked
/// remainders) and dfdx's ops (1 or 2 tokens, heads 2 wide), on one thread and on three.
#[test]
fn outputs_and_gradients_are_dfdx_attentions_bit_for_bit() {
    every_fma_path(|path| {
        for threads in [1, 3] {
            check::<12, 3>(&[16, 5, 3, 2, 1], threads, path);
            check::<64, 4>(&[16], threads, path);
            check::<48, 4>(&[16, 9], threads, path);
            check::<8, 4>(&[16], threads, path);
        }
    });
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

type Tokens<const W: usize> = Tensor<(usize, usize, Const<W>), f32, Cpu>;

/// `attention_scores` → softmax → a product with `r` (standing in for a quantizer) →
/// `attention_context`, or the same through dfdx's reshapes, permutes and products
/// (`dfdx_ops`): the output and the gradients of `q`, `k`, `v` under a loss weighing every
/// output by `w`.
fn products<const H: usize, const K: usize, const V: usize>(
    (q, k, v): (&Tokens<K>, &Tokens<K>, &Tokens<V>),
    r: &Tensor<(usize, Const<H>, usize, usize), f32, Cpu>,
    w: &Tokens<V>,
    dfdx_ops: bool,
) -> [Vec<f32>; 4] {
    let scale = 0.37f32;
    let grads = Gradients::leaky();
    let (qt, kt, vt) = (
        q.clone().trace(grads),
        k.clone().retaped::<OwnedTape<f32, Cpu>>(),
        v.clone().retaped::<OwnedTape<f32, Cpu>>(),
    );
    let (b, s1, s2) = (q.shape().0, q.shape().1, k.shape().1);
    let out = if dfdx_ops {
        let qt = qt
            .reshape_like(&(b, s1, Const::<H>, K / H))
            .permute::<_, Axes4<0, 2, 1, 3>>();
        let kt = kt
            .reshape_like(&(b, s2, Const::<H>, K / H))
            .permute::<_, Axes4<0, 2, 3, 1>>();
        let vt = vt
            .reshape_like(&(b, s2, Const::<H>, V / H))
            .permute::<_, Axes4<0, 2, 1, 3>>();
        let probs = (qt.matmul(kt) * scale).softmax::<Axis<3>>() * r.clone();
        probs
            .matmul(vt)
            .permute::<_, Axes4<0, 2, 1, 3>>()
            .reshape_like(&(b, s1, Const::<V>))
    } else {
        let scores = attention_scores::<H, _, _, _, K, _>(qt, kt, scale).unwrap();
        let probs = scores.softmax::<Axis<3>>() * r.clone();
        attention_context(probs, vt).unwrap()
    };
    let y = out.as_vec();
    let grads = (out * w.clone()).sum().backward();
    [
        y,
        grads.get(q).as_vec(),
        grads.get(k).as_vec(),
        grads.get(v).as_vec(),
    ]
}

/// The two products on batches of 4 sequences of `queries` and `keys` tokens, against dfdx's
/// ops, bit for bit.
fn check_products<const H: usize, const K: usize, const V: usize>(
    (queries, keys): (usize, usize),
    path: &str,
) {
    let dev = Cpu::seed_from_u64(queries as u64 * 31 + keys as u64);
    let q: Tokens<K> = dev.sample_normal_like(&(4, queries, Const));
    let k: Tokens<K> = dev.sample_normal_like(&(4, keys, Const));
    let v: Tokens<V> = dev.sample_normal_like(&(4, keys, Const));
    let r = dev.sample_uniform_like(&(4, Const::<H>, queries, keys));
    let w: Tokens<V> = dev.sample_normal_like(&(4, queries, Const));
    let ours = products::<H, K, V>((&q, &k, &v), &r, &w, false);
    let theirs = products::<H, K, V>((&q, &k, &v), &r, &w, true);
    for (i, what) in [
        "outputs",
        "queries' gradient",
        "keys' gradient",
        "values' gradient",
    ]
    .iter()
    .enumerate()
    {
        assert!(
            all_same(&ours[i], &theirs[i]),
            "{what}: {queries} queries, {keys} keys, K {K}, V {V}, {H} heads, {path}"
        );
    }
}

/// `attention_scores` and `attention_context` with ops between them (the quantized
/// attention's form): dfdx's bits where the plan runs (queries and keys of different counts,
/// head widths of a vector, a masked remainder and several vectors) and where dfdx's ops do
/// (2 tokens, heads 2 wide), on one thread and on three.
#[test]
fn the_separate_products_are_dfdxs_bit_for_bit() {
    every_fma_path(|path| {
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                check_products::<2, 16, 24>((5, 7), path);
                check_products::<3, 36, 12>((17, 3), path);
                check_products::<1, 40, 8>((9, 9), path);
                check_products::<2, 16, 16>((2, 5), path);
                check_products::<4, 8, 8>((6, 6), path);
            });
        }
    });
    let fma = std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("avx");
    assert_eq!(AttentionProducts::new(4, (5, 7), 2, 8).is_some(), fma);
    assert!(
        AttentionProducts::new(4, (2, 5), 2, 8).is_none(),
        "2 queries"
    );
    assert!(
        AttentionProducts::new(4, (6, 6), 4, 2).is_none(),
        "heads 2 wide"
    );
    assert!(
        AttentionProducts::new(4, (6, 600), 4, 8).is_none(),
        "600 keys"
    );
}

/// Operands that do not fit each other are refused with an error, on the fused path and on
/// dfdx's, not a panic.
#[test]
fn the_separate_products_refuse_operands_that_do_not_fit() {
    let dev = Cpu::default();
    for tokens in [5, 2] {
        let q: Tokens<8> = dev.sample_normal_like(&(4, tokens, Const));
        let k: Tokens<8> = dev.sample_normal_like(&(3, tokens, Const));
        assert!(
            attention_scores::<2, _, _, _, 8, _>(q.clone(), k, 1.0).is_err(),
            "keys of 3 sequences, queries of 4 ({tokens} tokens)"
        );
        let k: Tokens<8> = dev.sample_normal_like(&(4, tokens, Const));
        assert!(
            attention_scores::<3, _, _, _, 8, _>(q.clone(), k.clone(), 1.0).is_err(),
            "3 heads of 8"
        );
        let probs = attention_scores::<2, _, _, _, 8, _>(q, k, 1.0).unwrap();
        let v: Tokens<8> = dev.sample_normal_like(&(3, tokens, Const));
        assert!(
            attention_context(probs.clone(), v).is_err(),
            "values of 3 sequences"
        );
        let v: Tokens<8> = dev.sample_normal_like(&(4, tokens + 1, Const));
        assert!(
            attention_context(probs.clone(), v).is_err(),
            "values of one token more"
        );
        let v: Tokens<6> = dev.sample_normal_like(&(4, tokens, Const));
        assert!(
            attention_context::<2, _, _, _, 6, _>(probs, v).is_ok(),
            "fits"
        );
    }
}
