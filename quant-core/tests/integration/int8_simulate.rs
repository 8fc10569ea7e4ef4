//! The simulations of the integer softmax, GELU and layer normalisation that quantization-aware
//! training uses: `simulate` on fake-quantized values gives exactly the kernels' outputs
//! (`code · output_scale`), the dfdx ops give exactly `simulate`, and their gradients are those
//! of the exact float functions (checked against central differences in f64).

use dfdx::prelude::*;
use proptest::prelude::*;
use quant_core::dfdx_ops::{int_gelu, int_layer_norm, int_softmax, CodeGrid};
use quant_core::int8::nonlinear::{Approximation, IntGelu, IntLayerNorm, IntSoftmax};
use quant_core::QuantError;

fn approximation() -> impl Strategy<Value = Approximation> {
    prop_oneof![Just(Approximation::IBert), Just(Approximation::FixedPoint)]
}

/// The values a fake-quantized model holds for `codes`: `(q - z) · s`, computed in f32.
fn values(codes: &[i32], scale: f32, zero: i32) -> Vec<f32> {
    codes.iter().map(|q| (*q - zero) as f32 * scale).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn simulated_softmax_is_the_kernel_on_the_codes(
        approximation in approximation(),
        scale_exp in -14.0f64..-4.0,
        codes in proptest::collection::vec(-(1i32 << 20)..(1 << 20), 12),
        bits in 2u32..=16,
    ) {
        let scale = 2f64.powf(scale_exp) as f32;
        let k = IntSoftmax::new(scale, 4, bits, approximation).unwrap();
        let mut from_codes = vec![0i32; 12];
        k.run(&codes, &mut from_codes).unwrap();
        let mut simulated = vec![0f32; 12];
        k.simulate(&values(&codes, scale, 0), &mut simulated).unwrap();
        for (c, v) in from_codes.iter().zip(&simulated) {
            prop_assert_eq!((*c as f32 * k.output_scale()).to_bits(), v.to_bits());
        }
    }

    #[test]
    fn simulated_gelu_is_the_kernel_on_the_codes(
        approximation in approximation(),
        scale_exp in -12.0f64..-4.0,
        zero in -128i32..=127,
        codes in proptest::collection::vec(-128i32..=127, 1..40),
    ) {
        let scale = 2f64.powf(scale_exp) as f32;
        let k = IntGelu::new(scale, zero, -128..=127, approximation).unwrap();
        let mut from_codes = vec![0i32; codes.len()];
        k.run(&codes, &mut from_codes).unwrap();
        let mut simulated = vec![0f32; codes.len()];
        k.simulate(&values(&codes, scale, zero), &mut simulated).unwrap();
        for (c, v) in from_codes.iter().zip(&simulated) {
            prop_assert_eq!((*c as f32 * k.output_scale()).to_bits(), v.to_bits());
        }
    }

    #[test]
    fn simulated_layer_norm_is_the_kernel_on_the_codes(
        scale_exp in -12.0f64..2.0,
        zero in 0i32..=255,
        codes in proptest::collection::vec(0i32..=255, 16),
        gamma in proptest::collection::vec(-2.0f32..2.0, 8),
        beta in proptest::collection::vec(-2.0f32..2.0, 8),
    ) {
        let scale = 2f64.powf(scale_exp) as f32;
        let k = IntLayerNorm::new(scale, 0..=255, &gamma, &beta, 1e-5).unwrap();
        let mut from_codes = vec![0i32; 16];
        k.run(&codes, &mut from_codes).unwrap();
        let mut simulated = vec![0f32; 16];
        k.simulate(zero, &values(&codes, scale, zero), &mut simulated).unwrap();
        for (c, v) in from_codes.iter().zip(&simulated) {
            prop_assert_eq!((*c as f32 * k.output_scale()).to_bits(), v.to_bits());
        }
    }
}

#[test]
fn simulate_refuses_what_run_refuses_and_non_finite_values() {
    let k = IntSoftmax::new(0.01, 4, 8, Approximation::FixedPoint).unwrap();
    let mut out = [7f32; 4];
    match k.simulate(&[0.0, f32::NAN, 0.0, 0.0], &mut out) {
        Err(QuantError::NonFinite { what, .. }) => assert_eq!(what, "softmax input[1]"),
        other => panic!("{other:?}"),
    }
    assert_eq!(out, [7.0; 4], "nothing written");
    assert!(matches!(
        k.simulate(&[0.0; 3], &mut [0.0; 3]),
        Err(QuantError::LengthMismatch { .. })
    ));
    let g = IntGelu::new(0.01, 0, -128..=127, Approximation::FixedPoint).unwrap();
    assert!(matches!(
        g.simulate(&[f32::INFINITY], &mut [0.0]),
        Err(QuantError::NonFinite { .. })
    ));
    assert!(matches!(
        g.simulate(&[0.0, 1.0], &mut [0.0]),
        Err(QuantError::LengthMismatch { .. })
    ));
    let l = IntLayerNorm::new(0.01, 0..=255, &[1.0; 4], &[0.0; 4], 1e-5).unwrap();
    assert!(matches!(
        l.simulate(0, &[0.0; 5], &mut [0.0; 5]),
        Err(QuantError::LengthMismatch { .. })
    ));
}

/// A kernel of [`simulate_split_into_jobs_is_the_kernel_on_the_codes`]: its input codes on
/// their grid (scale, zero point), and its `simulate` and `run`.
struct SplitCase<'a> {
    what: &'static str,
    codes: Vec<i32>,
    grid: (f32, i32),
    output_scale: f32,
    simulate: Box<Simulate<'a>>,
    run: Box<Run<'a>>,
}

/// A kernel's `simulate`: real values in, real values out.
type Simulate<'a> = dyn Fn(&[f32], &mut [f32]) -> Result<(), QuantError> + Send + Sync + 'a;
/// A kernel's `run`: codes in, codes out.
type Run<'a> = dyn Fn(&[i32], &mut [i32]) -> Result<(), QuantError> + 'a;

/// Inputs large enough to be split into parallel jobs of rows: `simulate` is still the kernel
/// on the codes, on any number of threads; a value that is not finite in a later job is named
/// by its index (the first of two), and nothing is written.
#[test]
fn simulate_split_into_jobs_is_the_kernel_on_the_codes() {
    let mut next = crate::test_rng::xorshift(0x6a09_e667_f3bc_c909);
    let mut codes = |len: usize, lo: i32, span: u64| -> Vec<i32> {
        (0..len).map(|_| lo + (next() % span) as i32).collect()
    };
    let softmax = IntSoftmax::new(1.0 / 16.0, 16, 8, Approximation::FixedPoint).unwrap();
    let gelu = IntGelu::new(1.0 / 16.0, 128, 0..=255, Approximation::FixedPoint).unwrap();
    let (gamma, beta): (Vec<f32>, Vec<f32>) = (0..64)
        .map(|i| (0.5 + (i % 9) as f32 * 0.25, (i % 5) as f32 * 0.1 - 0.2))
        .unzip();
    let norm = IntLayerNorm::new(0.05, 0..=255, &gamma, &beta, 1e-5).unwrap();
    let cases = [
        SplitCase {
            what: "softmax input",
            codes: codes(16 * 4103, -200, 400),
            grid: (1.0 / 16.0, 0),
            output_scale: softmax.output_scale(),
            simulate: Box::new(|x, out| softmax.simulate(x, out)),
            run: Box::new(|q, out| softmax.run(q, out)),
        },
        SplitCase {
            what: "gelu input",
            codes: codes(70_001, -20, 300),
            grid: (1.0 / 16.0, 128),
            output_scale: gelu.output_scale(),
            simulate: Box::new(|x, out| gelu.simulate(x, out)),
            run: Box::new(|q, out| gelu.run(q, out)),
        },
        SplitCase {
            what: "layer norm input",
            codes: codes(64 * 1101, 0, 256),
            grid: (0.05, 128),
            output_scale: norm.output_scale(),
            simulate: Box::new(|x, out| norm.simulate(128, x, out)),
            run: Box::new(|q, out| norm.run(q, out)),
        },
    ];
    for case in &cases {
        let (what, simulate) = (case.what, &case.simulate);
        let x = values(&case.codes, case.grid.0, case.grid.1);
        let mut out_codes = vec![0i32; x.len()];
        (case.run)(&case.codes, &mut out_codes).unwrap();
        let want: Vec<u32> = out_codes
            .iter()
            .map(|c| (*c as f32 * case.output_scale).to_bits())
            .collect();
        let results = crate::threads::on_one_and_three_threads(|| {
            let mut out = vec![0f32; x.len()];
            simulate(&x, &mut out).unwrap();
            out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        });
        for (threads, got) in [1, 3].iter().zip(results) {
            assert!(got == want, "{what}, {threads} threads");
        }
        let mut bad = x.clone();
        let (first, second) = (x.len() - 3 * 16 * 64, x.len() - 16);
        (bad[first], bad[second]) = (f32::NAN, f32::INFINITY);
        let errors = crate::threads::on_one_and_three_threads(|| {
            let mut out = vec![7f32; x.len()];
            let error = simulate(&bad, &mut out).unwrap_err();
            (error, out.iter().all(|v| *v == 7.0))
        });
        for (error, untouched) in errors {
            match error {
                QuantError::NonFinite { what: named, .. } => {
                    assert_eq!(named, format!("{what}[{first}]"))
                }
                other => panic!("{what}: {other:?}"),
            }
            assert!(untouched, "{what}: nothing written");
        }
    }
}

/// The GELU's gradient of a tensor split into parallel jobs is that of the same values in
/// pieces below the split, bit for bit, on any number of threads.
#[test]
fn int_gelu_gradient_split_into_jobs_is_that_of_its_pieces() {
    let dev = Cpu::default();
    let mut next = crate::test_rng::xorshift(0xbb67_ae85_84ca_a73b);
    let scale = 1.0 / 16.0;
    // Codes beyond both ends of the range the kernel declares: no gradient there.
    let codes: Vec<i32> = (0..70_001).map(|_| -20 + (next() % 300) as i32).collect();
    let x_values = values(&codes, scale, 128);
    let w_values: Vec<f32> = (0..codes.len())
        .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let k = IntGelu::new(scale, 128, 0..=255, Approximation::FixedPoint).unwrap();
    let gradient = |x: &[f32], w: &[f32]| -> Vec<u32> {
        let x = dev.tensor_from_vec(x.to_vec(), (x.len(),));
        let w = dev.tensor_from_vec(w.to_vec(), (w.len(),));
        let y = int_gelu(x.leaky_trace(), &k).unwrap();
        let grads = (y * w).sum().backward();
        grads.get(&x).as_vec().iter().map(|v| v.to_bits()).collect()
    };
    let pieces: Vec<u32> = x_values
        .chunks(5000)
        .zip(w_values.chunks(5000))
        .flat_map(|(x, w)| gradient(x, w))
        .collect();
    let results = crate::threads::on_one_and_three_threads(|| gradient(&x_values, &w_values));
    for (threads, whole) in [1, 3].iter().zip(results) {
        assert!(whole == pieces, "{threads} threads");
    }
}

// ---------------------------------------------------------------------------------------
// The dfdx ops
// ---------------------------------------------------------------------------------------

/// `∂ Σ wᵢ fᵢ(x) / ∂xⱼ` by central differences in f64, for a function of one row.
fn numeric_gradient(f: impl Fn(&[f64]) -> Vec<f64>, x: &[f64], w: &[f64]) -> Vec<f64> {
    let h = 1e-6;
    (0..x.len())
        .map(|j| {
            let (mut up, mut down) = (x.to_vec(), x.to_vec());
            up[j] += h;
            down[j] -= h;
            let (fu, fd) = (f(&up), f(&down));
            fu.iter()
                .zip(&fd)
                .zip(w)
                .map(|((a, b), w)| w * (a - b))
                .sum::<f64>()
                / (2.0 * h)
        })
        .collect()
}

fn exact_softmax(x: &[f64]) -> Vec<f64> {
    let max = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x.iter().map(|v| (v - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|v| v / sum).collect()
}

fn exact_gelu(x: &[f64]) -> Vec<f64> {
    // Φ by Simpson's rule on [0, |x|] (a different route from the crate's series).
    x.iter()
        .map(|x| {
            let n = 2000;
            let h = x.abs() / n as f64;
            let pdf = |t: f64| (-0.5 * t * t).exp() / (2.0 * std::f64::consts::PI).sqrt();
            let mut s = pdf(0.0) + pdf(x.abs());
            for i in 1..n {
                s += pdf(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
            }
            let half = s * h / 3.0;
            x * (0.5 + half.copysign(*x))
        })
        .collect()
}

fn exact_layer_norm(x: &[f64], gamma: &[f64], beta: &[f64], eps: f64) -> Vec<f64> {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    x.iter()
        .zip(gamma.iter().zip(beta))
        .map(|(v, (g, b))| g * (v - mean) / (var + eps).sqrt() + b)
        .collect()
}

/// The weights of the loss `Σ wᵢ yᵢ` the gradient tests differentiate.
const W: [f32; 8] = [0.3, -1.2, 0.7, 2.0, -0.4, 1.1, -0.9, 0.5];

fn close(got: &[f32], expected: &[f64], tolerance: f64, what: &str) {
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!(
            (*g as f64 - e).abs() <= tolerance * (1.0 + e.abs()),
            "{what}[{i}]: {g} vs finite difference {e} ({got:?} vs {expected:?})"
        );
    }
}

#[test]
fn int_softmax_forward_is_simulate_and_its_gradient_is_softmax_s() {
    let dev = Cpu::default();
    let scale = 1.0 / 64.0;
    let codes = [64, 0, -32, 10, 5, 5, -100, 80];
    let x_values = values(&codes, scale, 0);
    for approximation in Approximation::ALL {
        let k = IntSoftmax::new(scale, 4, 8, approximation).unwrap();
        let x: Tensor<Rank2<2, 4>, f32, Cpu> = dev.tensor(x_values.clone());
        let y = int_softmax(x.leaky_trace(), &k).unwrap();
        let mut expected = vec![0f32; 8];
        k.simulate(&x_values, &mut expected).unwrap();
        assert_eq!(y.as_vec(), expected, "{approximation}");
        let w: Tensor<Rank2<2, 4>, f32, Cpu> = dev.tensor(W.to_vec());
        let grads = (y * w).sum().backward();
        let got = grads.get(&x).as_vec();
        for row in 0..2 {
            let xr: Vec<f64> = x_values[row * 4..row * 4 + 4]
                .iter()
                .map(|v| *v as f64)
                .collect();
            let wr: Vec<f64> = W[row * 4..row * 4 + 4].iter().map(|v| *v as f64).collect();
            let numeric = numeric_gradient(exact_softmax, &xr, &wr);
            close(
                &got[row * 4..row * 4 + 4],
                &numeric,
                1e-5,
                "softmax gradient",
            );
        }
    }
    // The rows must be the last axis.
    let k = IntSoftmax::new(scale, 3, 8, Approximation::FixedPoint).unwrap();
    let x: Tensor<Rank2<2, 4>, f32, Cpu> = dev.zeros();
    assert!(matches!(
        int_softmax(x, &k),
        Err(QuantError::LengthMismatch {
            expected: 3,
            actual: 4,
            ..
        })
    ));
}

#[test]
fn int_gelu_forward_is_simulate_and_its_gradient_is_gelu_s() {
    let dev = Cpu::default();
    let scale = 1.0 / 16.0;
    // Codes 0..=255 with zero point 128; two codes outside the range the kernel declares.
    let codes = [128, 100, 150, 60, 250, 0, 300, -20];
    let x_values = values(&codes, scale, 128);
    for approximation in Approximation::ALL {
        let k = IntGelu::new(scale, 128, 0..=255, approximation).unwrap();
        let x: Tensor<Rank1<8>, f32, Cpu> = dev.tensor(x_values.clone());
        let y = int_gelu(x.leaky_trace(), &k).unwrap();
        let mut expected = vec![0f32; 8];
        k.simulate(&x_values, &mut expected).unwrap();
        assert_eq!(y.as_vec(), expected, "{approximation}");
        let w: Tensor<Rank1<8>, f32, Cpu> = dev.tensor(W);
        let grads = (y * w).sum().backward();
        let got = grads.get(&x).as_vec();
        let xs: Vec<f64> = x_values.iter().map(|v| *v as f64).collect();
        let ws: Vec<f64> = W.iter().map(|v| *v as f64).collect();
        let mut numeric = numeric_gradient(exact_gelu, &xs, &ws);
        // The kernel clamps codes outside its range: no gradient there.
        numeric[6] = 0.0;
        numeric[7] = 0.0;
        close(&got, &numeric, 1e-5, "gelu gradient");
    }
}

#[test]
fn int_layer_norm_forward_is_simulate_and_its_gradients_are_layer_norm_s() {
    let dev = Cpu::default();
    let scale = 0.05;
    let codes = [10, 200, 37, 90, 128, 128, 129, 250];
    let x_values = values(&codes, scale, 128);
    let (gamma_values, beta_values) = ([1.5f32, -0.5, 0.8, 2.0], [0.1f32, 0.0, -0.3, 1.0]);
    let (gamma, beta): (Tensor<Rank1<4>, f32, Cpu>, Tensor<Rank1<4>, f32, Cpu>) =
        (dev.tensor(gamma_values), dev.tensor(beta_values));
    let input = CodeGrid {
        scale,
        zero_point: 128,
        codes: 0..=255,
    };
    let eps = 1e-5;
    let x: Tensor<Rank2<2, 4>, f32, Cpu> = dev.tensor(x_values.clone());
    let y = int_layer_norm(x.leaky_trace(), &gamma, &beta, eps, &input, true).unwrap();
    let k = IntLayerNorm::new(scale, 0..=255, &gamma_values, &beta_values, eps).unwrap();
    let mut expected = vec![0f32; 8];
    k.simulate(128, &x_values, &mut expected).unwrap();
    assert_eq!(y.as_vec(), expected);
    let w: Tensor<Rank2<2, 4>, f32, Cpu> = dev.tensor(W.to_vec());
    let grads = (y * w).sum().backward();
    let (g64, b64) = (
        gamma_values.map(|v| v as f64),
        beta_values.map(|v| v as f64),
    );
    let mut numeric_gamma = vec![0f64; 4];
    let mut numeric_beta = vec![0f64; 4];
    for row in 0..2 {
        let xr: Vec<f64> = x_values[row * 4..row * 4 + 4]
            .iter()
            .map(|v| *v as f64)
            .collect();
        let wr: Vec<f64> = W[row * 4..row * 4 + 4].iter().map(|v| *v as f64).collect();
        let numeric = numeric_gradient(|x| exact_layer_norm(x, &g64, &b64, eps as f64), &xr, &wr);
        close(
            &grads.get(&x).as_vec()[row * 4..row * 4 + 4],
            &numeric,
            1e-4,
            "layer norm dx",
        );
        let dg = numeric_gradient(|g| exact_layer_norm(&xr, g, &b64, eps as f64), &g64, &wr);
        let db = numeric_gradient(|b| exact_layer_norm(&xr, &g64, b, eps as f64), &b64, &wr);
        for j in 0..4 {
            numeric_gamma[j] += dg[j];
            numeric_beta[j] += db[j];
        }
    }
    close(
        &grads.get(&gamma).as_vec(),
        &numeric_gamma,
        1e-4,
        "layer norm dgamma",
    );
    close(
        &grads.get(&beta).as_vec(),
        &numeric_beta,
        1e-4,
        "layer norm dbeta",
    );
    // Frozen affine: no gradient reaches γ, β.
    let mut grads = dfdx::tensor::Gradients::leaky();
    grads.try_alloc_for(&gamma).unwrap();
    grads.try_alloc_for(&beta).unwrap();
    let y = int_layer_norm(x.trace(grads), &gamma, &beta, eps, &input, false).unwrap();
    let grads = y.sum().backward();
    assert!(grads
        .get(&gamma)
        .as_vec()
        .iter()
        .chain(&grads.get(&beta).as_vec())
        .all(|g| *g == 0.0));
    assert!(grads.get(&x).as_vec().iter().all(|g| g.is_finite()));
    // A γ the kernel refuses is a typed error naming it.
    let bad: Tensor<Rank1<4>, f32, Cpu> = dev.tensor([1.0, f32::NAN, 1.0, 1.0]);
    match int_layer_norm(x.clone(), &bad, &beta, eps, &input, false) {
        Err(QuantError::NonFinite { what, .. }) => assert_eq!(what, "layer norm gamma[1]"),
        other => panic!("{other:?}"),
    }
    let wide: Tensor<Rank2<1, 8>, f32, Cpu> = dev.zeros();
    assert!(matches!(
        int_layer_norm(wide, &gamma, &beta, eps, &input, false),
        Err(QuantError::LengthMismatch {
            expected: 4,
            actual: 8,
            ..
        })
    ));
}
