//! `conv2d` and `Conv2d` against a naive direct convolution (forward and analytic backward, in
//! f64) and against finite differences.

use dfdx::prelude::*;
use dfdx::tensor::{CpuError, Gradients};
use quant_core::dfdx_ops::fake_quantize;
use quant_core::{IntegerGrid, QParams, QuantError, RoundingPolicy};
use quant_dfdx::nn::{builders, conv2d, Conv2d};

/// Geometry of one test case: batch, height, width, stride, padding.
#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    h: usize,
    w: usize,
    stride: usize,
    pad: usize,
}

fn out_len(len: usize, k: usize, s: usize, p: usize) -> usize {
    (len + 2 * p - k) / s + 1
}

/// Direct convolution, accumulated in f64. `x` is (n, c, h, w), `wt` (o, c, k, k).
fn naive_forward(
    x: &[f32],
    wt: &[f32],
    b: &[f32],
    c: usize,
    o: usize,
    k: usize,
    case: Case,
) -> Vec<f64> {
    let Case {
        batch,
        h,
        w,
        stride,
        pad,
    } = case;
    let (oh, ow) = (out_len(h, k, stride, pad), out_len(w, k, stride, pad));
    let mut y = vec![0.0f64; batch * o * oh * ow];
    for n in 0..batch {
        for oc in 0..o {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = b[oc] as f64;
                    for ic in 0..c {
                        for kh in 0..k {
                            for kw in 0..k {
                                let iy = (oy * stride + kh) as isize - pad as isize;
                                let ix = (ox * stride + kw) as isize - pad as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                    continue;
                                }
                                let xv =
                                    x[((n * c + ic) * h + iy as usize) * w + ix as usize] as f64;
                                acc += xv * wt[((oc * c + ic) * k + kh) * k + kw] as f64;
                            }
                        }
                    }
                    y[((n * o + oc) * oh + oy) * ow + ox] = acc;
                }
            }
        }
    }
    y
}

/// The analytic gradients `(dx, dw, db)` of the direct convolution for output gradient `dy`.
#[allow(clippy::too_many_arguments)]
fn naive_backward(
    x: &[f32],
    wt: &[f32],
    dy: &[f32],
    c: usize,
    o: usize,
    k: usize,
    case: Case,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let Case {
        batch,
        h,
        w,
        stride,
        pad,
    } = case;
    let (oh, ow) = (out_len(h, k, stride, pad), out_len(w, k, stride, pad));
    let mut dx = vec![0.0f64; x.len()];
    let mut dw = vec![0.0f64; wt.len()];
    let mut db = vec![0.0f64; o];
    for n in 0..batch {
        for oc in 0..o {
            for oy in 0..oh {
                for ox in 0..ow {
                    let g = dy[((n * o + oc) * oh + oy) * ow + ox] as f64;
                    db[oc] += g;
                    for ic in 0..c {
                        for kh in 0..k {
                            for kw in 0..k {
                                let iy = (oy * stride + kh) as isize - pad as isize;
                                let ix = (ox * stride + kw) as isize - pad as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                    continue;
                                }
                                let xi = ((n * c + ic) * h + iy as usize) * w + ix as usize;
                                let wi = ((oc * c + ic) * k + kh) * k + kw;
                                dx[xi] += wt[wi] as f64 * g;
                                dw[wi] += x[xi] as f64 * g;
                            }
                        }
                    }
                }
            }
        }
    }
    (dx, dw, db)
}

fn assert_close(what: &str, actual: &[f32], expected: &[f64], tol: f64) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        let err = (*a as f64 - e).abs();
        assert!(
            err <= tol * e.abs().max(1.0),
            "{what}[{i}]: got {a}, expected {e} (|err| = {err:e})"
        );
    }
}

/// Runs forward and backward of `conv2d` on random data and compares both with the naive
/// convolution.
fn check_against_naive<const C: usize, const O: usize, const K: usize>(dev: &Cpu, case: Case) {
    let x = dev.sample_normal_like(&(case.batch, Const::<C>, case.h, case.w));
    let wt: Tensor<Rank4<O, C, K, K>, f32, _> = dev.sample_normal();
    let b: Tensor<Rank1<O>, f32, _> = dev.sample_normal();
    let (xv, wv, bv) = (x.as_vec(), wt.as_vec(), b.as_vec());

    let y = conv2d(
        x.trace(Gradients::leaky()),
        wt.retaped(),
        b.retaped(),
        case.stride,
        case.pad,
    )
    .unwrap();
    let (oh, ow) = (
        out_len(case.h, K, case.stride, case.pad),
        out_len(case.w, K, case.stride, case.pad),
    );
    assert_eq!(*y.shape(), (case.batch, Const::<O>, oh, ow), "{case:?}");
    let label = format!("C={C} O={O} K={K} {case:?}");
    assert_close(
        &format!("forward {label}"),
        &y.as_vec(),
        &naive_forward(&xv, &wv, &bv, C, O, K, case),
        1e-5,
    );

    // loss = sum(y * r): the output gradient is r.
    let r = dev.sample_normal_like(y.shape());
    let grads = (y * r.clone()).sum().backward();
    let (dx, dw, db) = naive_backward(&xv, &wv, &r.as_vec(), C, O, K, case);
    assert_close(&format!("dx {label}"), &grads.get(&x).as_vec(), &dx, 1e-5);
    assert_close(&format!("dw {label}"), &grads.get(&wt).as_vec(), &dw, 1e-4);
    assert_close(&format!("db {label}"), &grads.get(&b).as_vec(), &db, 1e-4);
}

fn case(batch: usize, h: usize, w: usize, stride: usize, pad: usize) -> Case {
    Case {
        batch,
        h,
        w,
        stride,
        pad,
    }
}

#[test]
fn forward_and_backward_match_naive_convolution() {
    let dev = Cpu::seed_from_u64(1);
    check_against_naive::<3, 4, 1>(&dev, case(2, 5, 4, 1, 0));
    check_against_naive::<3, 4, 1>(&dev, case(2, 5, 4, 2, 1));
    check_against_naive::<2, 3, 2>(&dev, case(2, 6, 5, 2, 0));
    check_against_naive::<2, 3, 2>(&dev, case(1, 4, 4, 1, 1));
    check_against_naive::<3, 4, 3>(&dev, case(2, 7, 6, 1, 0));
    check_against_naive::<3, 4, 3>(&dev, case(2, 7, 6, 1, 1));
    check_against_naive::<3, 4, 3>(&dev, case(2, 7, 6, 2, 1));
    check_against_naive::<3, 4, 3>(&dev, case(2, 8, 5, 3, 2));
    check_against_naive::<1, 8, 3>(&dev, case(3, 8, 8, 1, 1));
    check_against_naive::<2, 2, 5>(&dev, case(2, 6, 7, 1, 2));
    check_against_naive::<2, 2, 5>(&dev, case(1, 9, 9, 2, 0));
    // Padding wider than the input: some windows see only padding.
    check_against_naive::<1, 2, 3>(&dev, case(1, 2, 3, 1, 2));
    check_against_naive::<2, 3, 4>(&dev, case(2, 3, 3, 2, 3));
    // Batches large enough to be split into several chunks (of 3, 3 and 1 images; of 4, 4 and
    // 3), which run in parallel and add up their weight gradients.
    check_against_naive::<8, 4, 3>(&dev, case(7, 12, 12, 1, 1));
    check_against_naive::<16, 2, 3>(&dev, case(11, 13, 11, 2, 1));
    // A larger batch: 32 images, an output of 65,536 values.
    check_against_naive::<2, 8, 3>(&dev, case(32, 16, 16, 1, 1));
}

/// The outputs and all three gradients are the same bits on one thread and on three (the
/// images split into chunks across the threads).
#[test]
fn outputs_and_gradients_do_not_depend_on_the_thread_count() {
    let dev = Cpu::seed_from_u64(5);
    let x = dev.sample_normal_like(&(32, Const::<2>, 16, 16));
    let wt: Tensor<Rank4<8, 2, 3, 3>, f32, _> = dev.sample_normal();
    let b: Tensor<Rank1<8>, f32, _> = dev.sample_normal();
    let r = dev.sample_normal_like(&(32, Const::<8>, 16, 16));
    let run = || {
        let y = conv2d(x.trace(Gradients::leaky()), wt.retaped(), b.retaped(), 1, 1).unwrap();
        let out = y.as_vec();
        let grads = (y * r.clone()).sum().backward();
        [
            out,
            grads.get(&x).as_vec(),
            grads.get(&wt).as_vec(),
            grads.get(&b).as_vec(),
        ]
    };
    let on = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(run)
    };
    let (one, three) = (on(1), on(3));
    for (what, (a, b)) in ["outputs", "dx", "dw", "db"]
        .iter()
        .zip(one.iter().zip(&three))
    {
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(a), bits(b), "{what}: 1 vs 3 threads");
    }
}

/// Central differences of `loss = sum(r * conv2d(..))`, accumulated in f64, for one element
/// of `target` (0: x, 1: weight, 2: bias).
fn finite_difference(
    x: &[f32],
    wt: &[f32],
    b: &[f32],
    r: &[f32],
    target: usize,
    i: usize,
    eps: f32,
) -> f64 {
    let dev = Cpu::default();
    let loss = |x: &[f32], wt: &[f32], b: &[f32]| -> f64 {
        let xt = dev.tensor_from_vec(x.to_vec(), (1usize, Const::<2>, 5usize, 4usize));
        let wt: Tensor<Rank4<3, 2, 3, 3>, f32, _> =
            dev.tensor_from_vec(wt.to_vec(), Default::default());
        let bt: Tensor<Rank1<3>, f32, _> = dev.tensor_from_vec(b.to_vec(), Default::default());
        let y = conv2d(xt, wt, bt, 2, 1).unwrap().as_vec();
        y.iter().zip(r).map(|(y, r)| *y as f64 * *r as f64).sum()
    };
    let mut bufs = [x.to_vec(), wt.to_vec(), b.to_vec()];
    bufs[target][i] += eps;
    let plus = loss(&bufs[0], &bufs[1], &bufs[2]);
    bufs[target][i] -= 2.0 * eps;
    let minus = loss(&bufs[0], &bufs[1], &bufs[2]);
    (plus - minus) / (2.0 * eps as f64)
}

#[test]
fn backward_matches_finite_differences() {
    let dev = Cpu::seed_from_u64(2);
    let x = dev.sample_normal_like(&(1usize, Const::<2>, 5usize, 4usize));
    let wt: Tensor<Rank4<3, 2, 3, 3>, f32, _> = dev.sample_normal();
    let b: Tensor<Rank1<3>, f32, _> = dev.sample_normal();
    let y = conv2d(x.trace(Gradients::leaky()), wt.retaped(), b.retaped(), 2, 1).unwrap();
    let r = dev.sample_normal_like(y.shape());
    let grads = (y * r.clone()).sum().backward();
    let (xv, wv, bv, rv) = (x.as_vec(), wt.as_vec(), b.as_vec(), r.as_vec());
    let analytic = [
        grads.get(&x).as_vec(),
        grads.get(&wt).as_vec(),
        grads.get(&b).as_vec(),
    ];
    for (target, name) in ["x", "weight", "bias"].iter().enumerate() {
        for (i, g) in analytic[target].iter().enumerate() {
            let fd = finite_difference(&xv, &wv, &bv, &rv, target, i, 1e-2);
            assert!(
                (*g as f64 - fd).abs() <= 2e-3 * fd.abs().max(1.0),
                "d{name}[{i}]: autodiff {g}, finite difference {fd}"
            );
        }
    }
}

#[test]
fn gradients_accumulate_over_two_uses() {
    let dev = Cpu::seed_from_u64(3);
    let x: Tensor<Rank4<2, 2, 4, 4>, f32, _> = dev.sample_normal();
    let wt: Tensor<Rank4<3, 2, 3, 3>, f32, _> = dev.sample_normal();
    let b: Tensor<Rank1<3>, f32, _> = dev.sample_normal();

    let once = conv2d(x.trace(Gradients::leaky()), wt.retaped(), b.retaped(), 1, 1).unwrap();
    let g1 = once.sum().backward();

    let xt = x.trace(Gradients::leaky());
    let y1 = conv2d(xt.retaped(), wt.retaped(), b.retaped(), 1, 1).unwrap();
    let y2 = conv2d(xt, wt.retaped(), b.retaped(), 1, 1).unwrap();
    let g2 = (y1.sum() + y2.sum()).backward();
    let pairs = [
        (g1.get(&x).as_vec(), g2.get(&x).as_vec()),
        (g1.get(&wt).as_vec(), g2.get(&wt).as_vec()),
        (g1.get(&b).as_vec(), g2.get(&b).as_vec()),
    ];
    for (once, twice) in pairs {
        for (one, two) in once.iter().zip(&twice) {
            assert!(
                (2.0 * one - two).abs() <= 1e-4 * two.abs().max(1.0),
                "{one} * 2 != {two}"
            );
        }
    }
}

#[test]
fn weight_gradient_flows_through_the_weights_own_tape() {
    let dev = Cpu::seed_from_u64(4);
    let x: Tensor<Rank4<2, 2, 5, 5>, f32, _> = dev.sample_normal();
    let wt: Tensor<Rank4<3, 2, 3, 3>, f32, _> = dev.sample_normal();
    let b: Tensor<Rank1<3>, f32, _> = dev.sample_normal();

    // A dfdx op on the weight's tape: the chain rule must run through it (d(2w) = 2 dw).
    let doubled = wt.retaped::<OwnedTape<f32, Cpu>>() * 2.0;
    let y = conv2d(x.trace(Gradients::leaky()), doubled, b.retaped(), 1, 1).unwrap();
    let r = dev.sample_normal_like(y.shape());
    let grads = (y * r.clone()).sum().backward();
    let (_, dw, _) = naive_backward(
        &x.as_vec(),
        &(wt.clone() * 2.0).as_vec(),
        &r.as_vec(),
        2,
        3,
        3,
        case(2, 5, 5, 1, 1),
    );
    let expected: Vec<f64> = dw.iter().map(|g| 2.0 * g).collect();
    assert_close("dw through 2w", &grads.get(&wt).as_vec(), &expected, 1e-4);

    // A per-output-channel fake quantizer on the weight, as the quantized convolution uses it:
    // straight-through inside the grid, zero gradient for weights clipped by it.
    let scales = vec![0.05f32, 0.1, 0.2];
    let qparams = QParams::per_channel(0, scales.clone(), vec![0; 3]).unwrap();
    let grid = IntegerGrid::new(4, true, false).unwrap();
    let wq = fake_quantize(
        wt.retaped::<OwnedTape<f32, Cpu>>(),
        &qparams,
        grid,
        RoundingPolicy::HalfEven,
    )
    .unwrap();
    let wq_values = wq.as_vec();
    let y = conv2d(x.trace(Gradients::leaky()), wq, b.retaped(), 1, 1).unwrap();
    let r = dev.sample_normal_like(y.shape());
    let grads = (y * r.clone()).sum().backward();
    let (_, dw, _) = naive_backward(
        &x.as_vec(),
        &wq_values,
        &r.as_vec(),
        2,
        3,
        3,
        case(2, 5, 5, 1, 1),
    );
    let per_channel = 2 * 3 * 3;
    let mut clipped = 0;
    let expected: Vec<f64> = wt
        .as_vec()
        .iter()
        .zip(&dw)
        .enumerate()
        .map(|(i, (w, g))| {
            // As the fake quantizer: multiply by the reciprocal, round half to even.
            let q = (w * (1.0 / scales[i / per_channel])).round_ties_even();
            if (-8.0..=7.0).contains(&q) {
                *g
            } else {
                clipped += 1;
                0.0
            }
        })
        .collect();
    assert!(
        clipped > 0 && clipped < wt.as_vec().len(),
        "the case should clip some weights, not all"
    );
    assert_close(
        "dw through fake_quantize",
        &grads.get(&wt).as_vec(),
        &expected,
        1e-4,
    );
}

#[test]
fn non_contiguous_input_matches_contiguous_copy() {
    let dev = Cpu::seed_from_u64(5);
    // Stored as (batch, height, channels, width); permuted to NCHW without copying.
    let base: Tensor<Rank4<2, 5, 3, 4>, f32, _> = dev.sample_normal();
    let wt: Tensor<Rank4<2, 3, 3, 3>, f32, _> = dev.sample_normal();
    let b: Tensor<Rank1<2>, f32, _> = dev.sample_normal();

    let permuted = base
        .trace(Gradients::leaky())
        .permute::<Rank4<2, 3, 5, 4>, Axes4<0, 2, 1, 3>>();
    let y = conv2d(permuted, wt.retaped(), b.retaped(), 2, 1).unwrap();
    let y_vec = y.as_vec();
    let r = dev.sample_normal_like(y.shape());
    let grads = (y * r.clone()).sum().backward();

    let contiguous = base
        .clone()
        .permute::<Rank4<2, 3, 5, 4>, Axes4<0, 2, 1, 3>>()
        .contiguous();
    let xv = contiguous.as_vec();
    let c = case(2, 5, 4, 2, 1);
    assert_close(
        "forward",
        &y_vec,
        &naive_forward(&xv, &wt.as_vec(), &b.as_vec(), 3, 2, 3, c),
        1e-5,
    );
    // The gradient lands on the stored (batch, height, channels, width) tensor.
    let (dx, _, _) = naive_backward(&xv, &wt.as_vec(), &r.as_vec(), 3, 2, 3, c);
    let dx_t = dev.tensor_from_vec(
        dx.iter().map(|v| *v as f32).collect(),
        (Const::<2>, Const::<3>, Const::<5>, Const::<4>),
    );
    let expected: Vec<f64> = dx_t
        .permute::<Rank4<2, 5, 3, 4>, Axes4<0, 2, 1, 3>>()
        .contiguous()
        .as_vec()
        .iter()
        .map(|v| *v as f64)
        .collect();
    assert_close(
        "dx of the stored tensor",
        &grads.get(&base).as_vec(),
        &expected,
        1e-5,
    );
}

#[test]
fn no_tape_and_const_shapes_work() {
    let dev = Cpu::seed_from_u64(6);
    let x: Tensor<Rank4<2, 1, 6, 6>, f32, _> = dev.sample_normal();
    let wt: Tensor<Rank4<4, 1, 3, 3>, f32, _> = dev.sample_normal();
    let b: Tensor<Rank1<4>, f32, _> = dev.sample_normal();
    let y = conv2d(x.clone(), wt.clone(), b.clone(), 1, 0).unwrap();
    assert_eq!(*y.shape(), (Const::<2>, Const::<4>, 4, 4));
    let expected = naive_forward(
        &x.as_vec(),
        &wt.as_vec(),
        &b.as_vec(),
        1,
        4,
        3,
        case(2, 6, 6, 1, 0),
    );
    assert_close("forward", &y.as_vec(), &expected, 1e-5);
}

#[test]
fn empty_batch_gives_empty_output() {
    let dev = Cpu::default();
    let x = dev.zeros_like(&(0usize, Const::<2>, 4usize, 4usize));
    let wt: Tensor<Rank4<3, 2, 3, 3>, f32, _> = dev.ones();
    let b: Tensor<Rank1<3>, f32, _> = dev.ones();
    let y = conv2d(x.trace(Gradients::leaky()), wt.retaped(), b.retaped(), 1, 1).unwrap();
    assert_eq!(*y.shape(), (0, Const::<3>, 4, 4));
    // (No backward here: dfdx's own `sum` panics on an empty tensor, before reaching ours.)
}

#[test]
fn invalid_geometry_is_a_typed_error() {
    let dev = Cpu::default();
    let x = dev.zeros_like(&(1usize, Const::<1>, 2usize, 5usize));
    let wt: Tensor<Rank4<1, 1, 3, 3>, f32, _> = dev.zeros();
    let b: Tensor<Rank1<1>, f32, _> = dev.zeros();

    let err = conv2d(x.clone(), wt.clone(), b.clone(), 1, 0).unwrap_err();
    assert!(matches!(err, QuantError::InvalidValue { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("conv2d: input height = 2") && msg.contains("smaller than the kernel"),
        "{msg}"
    );
    assert!(msg.contains("at least the kernel size 3"), "{msg}");

    let msg = conv2d(x.clone(), wt.clone(), b.clone(), 0, 1)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("conv2d: stride = 0") && msg.contains("at least 1"),
        "{msg}"
    );

    let msg = conv2d(x.clone(), wt.clone(), b.clone(), 1, usize::MAX)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("padding"), "{msg}");

    // Padding makes the same input big enough.
    let y = conv2d(x, wt, b, 1, 1).unwrap();
    assert_eq!(*y.shape(), (1, Const::<1>, 2, 5));

    let x = dev.zeros_like(&(1usize, Const::<1>, 4usize, 4usize));
    let wt: Tensor<Rank4<1, 1, 0, 0>, f32, _> = dev.zeros();
    let msg = conv2d(x, wt, dev.zeros(), 1, 0).unwrap_err().to_string();
    assert!(msg.contains("kernel size = 0"), "{msg}");
}

#[test]
fn module_builds_with_pytorch_init_and_matches_the_op() {
    let dev = Cpu::seed_from_u64(7);
    let conv: Conv2d<2, 4, 3, 2, 1> = dev.build_module::<builders::Conv2d<2, 4, 3, 2, 1>, f32>();
    let bound = 1.0 / ((2 * 3 * 3) as f32).sqrt();
    for v in conv.weight.as_vec().iter().chain(&conv.bias.as_vec()) {
        assert!(v.abs() <= bound, "{v} outside ±{bound}");
    }
    assert!(
        conv.weight.as_vec().iter().any(|v| v.abs() > bound / 2.0),
        "weights should spread over the range"
    );
    assert_eq!(conv.num_trainable_params(), 4 * 2 * 9 + 4);

    let x = dev.sample_normal_like(&(3usize, Const::<2>, 7usize, 6usize));
    let y = conv.forward(x.clone());
    assert_eq!(*y.shape(), (3, Const::<4>, 4, 3));
    let direct = conv2d(x.clone(), conv.weight.clone(), conv.bias.clone(), 2, 1).unwrap();
    assert_eq!(y.as_vec(), direct.as_vec());

    // The module trains: its parameters get gradients through the tape.
    let mut conv = conv;
    let grads = conv.alloc_grads();
    let y = conv.forward_mut(x.trace(grads));
    let grads = y.square().mean().backward();
    assert!(grads.get(&conv.weight).as_vec().iter().any(|g| *g != 0.0));

    // Too small an input: dfdx's error type, as every layer in a tuple must share it.
    let tiny = dev.zeros_like(&(1usize, Const::<2>, 0usize, 0usize));
    assert!(matches!(
        conv.try_forward(tiny),
        Err(CpuError::WrongNumElements)
    ));
}

/// A grouped convolution is the dense convolution whose weight is zero outside each output
/// channel's group of input channels: `conv2d_grouped` against the naive dense convolution of
/// that block-diagonal weight, forward and backward (the weight gradient restricted to the
/// blocks).
fn check_grouped_against_naive<const C: usize, const O: usize, const CG: usize, const K: usize>(
    dev: &Cpu,
    groups: usize,
    case: Case,
) {
    let x = dev.sample_normal_like(&(case.batch, Const::<C>, case.h, case.w));
    let wt: Tensor<Rank4<O, CG, K, K>, f32, _> = dev.sample_normal();
    let b: Tensor<Rank1<O>, f32, _> = dev.sample_normal();
    let (xv, wv, bv) = (x.as_vec(), wt.as_vec(), b.as_vec());
    let og = O / groups;
    let mut dense = vec![0.0f32; O * C * K * K];
    for o in 0..O {
        let g = o / og;
        for ci in 0..CG {
            for t in 0..K * K {
                dense[(o * C + g * CG + ci) * K * K + t] = wv[(o * CG + ci) * K * K + t];
            }
        }
    }
    let y = quant_dfdx::nn::conv2d_grouped(
        x.trace(Gradients::leaky()),
        wt.retaped(),
        b.retaped(),
        case.stride,
        case.pad,
        groups,
    )
    .unwrap();
    let label = format!("C={C} O={O} groups={groups} K={K} {case:?}");
    assert_close(
        &format!("grouped forward {label}"),
        &y.as_vec(),
        &naive_forward(&xv, &dense, &bv, C, O, K, case),
        1e-5,
    );
    let r = dev.sample_normal_like(y.shape());
    let grads = (y * r.clone()).sum().backward();
    let (dx, dw_dense, db) = naive_backward(&xv, &dense, &r.as_vec(), C, O, K, case);
    let mut dw = vec![0.0f64; O * CG * K * K];
    for o in 0..O {
        let g = o / og;
        for ci in 0..CG {
            for t in 0..K * K {
                dw[(o * CG + ci) * K * K + t] = dw_dense[(o * C + g * CG + ci) * K * K + t];
            }
        }
    }
    assert_close(
        &format!("grouped dx {label}"),
        &grads.get(&x).as_vec(),
        &dx,
        1e-5,
    );
    assert_close(
        &format!("grouped dw {label}"),
        &grads.get(&wt).as_vec(),
        &dw,
        1e-4,
    );
    assert_close(
        &format!("grouped db {label}"),
        &grads.get(&b).as_vec(),
        &db,
        1e-4,
    );
}

#[test]
fn grouped_and_depthwise_convolutions_match_the_block_diagonal_dense_one() {
    let dev = Cpu::seed_from_u64(11);
    // Depthwise (one input channel per group), with stride and padding.
    check_grouped_against_naive::<4, 4, 1, 3>(&dev, 4, case(3, 7, 6, 1, 1));
    check_grouped_against_naive::<4, 4, 1, 3>(&dev, 4, case(2, 8, 8, 2, 1));
    // Depthwise with a channel multiplier of 2.
    check_grouped_against_naive::<3, 6, 1, 2>(&dev, 3, case(2, 5, 5, 1, 0));
    // Two groups of two channels, four outputs per group.
    check_grouped_against_naive::<4, 8, 2, 3>(&dev, 2, case(2, 6, 5, 2, 1));
    // One group is the dense convolution.
    check_grouped_against_naive::<3, 5, 3, 3>(&dev, 1, case(2, 6, 6, 1, 1));
    // Many images: several parallel chunks.
    check_grouped_against_naive::<8, 8, 1, 3>(&dev, 8, case(40, 8, 8, 1, 1));
}

#[test]
fn groups_that_do_not_divide_the_channels_are_a_typed_error() {
    let dev = Cpu::default();
    let x: Tensor<Rank4<1, 4, 5, 5>, f32, _> = dev.zeros();
    let w: Tensor<Rank4<4, 2, 3, 3>, f32, _> = dev.zeros();
    let b: Tensor<Rank1<4>, f32, _> = dev.zeros();
    for groups in [0, 3, 4] {
        let e = quant_dfdx::nn::conv2d_grouped(x.clone(), w.clone(), b.clone(), 1, 1, groups)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("groups") && e.contains("4 input channels"),
            "{e}"
        );
    }
}

#[test]
fn depthwise_module_builds_with_its_fan_in_and_matches_the_op() {
    let dev = Cpu::seed_from_u64(2);
    let m = dev.build_module::<builders::DepthwiseConv2d<6, 3, 1, 1>, f32>();
    let bound = 1.0 / 9f32.sqrt();
    assert!(m.weight.as_vec().iter().all(|w| w.abs() <= bound));
    let x: Tensor<Rank4<2, 6, 5, 5>, f32, _> = dev.sample_normal();
    let y = m.forward(x.clone());
    let direct =
        quant_dfdx::nn::conv2d_grouped(x, m.weight.clone(), m.bias.clone(), 1, 1, 6).unwrap();
    assert_eq!(y.as_vec(), direct.as_vec());
}
