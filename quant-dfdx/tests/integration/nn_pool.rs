//! `max_pool2d`, `avg_pool2d` and their modules: hand-computed cases (ties, padding), a naive
//! reference on random batches, finite differences, errors.

use dfdx::prelude::*;
use dfdx::tensor::{CpuError, Gradients};
use quant_core::QuantError;
use quant_dfdx::nn::{avg_pool2d, max_pool2d, AvgPool2d, FeatureMaps, MaxPool2d};

type Traced<S> = Tensor<S, f32, Cpu, OwnedTape<f32, Cpu>>;
type PoolFn<const H: usize, const W: usize> =
    fn(
        Traced<Rank4<1, 1, H, W>>,
        usize,
        usize,
        usize,
    ) -> quant_core::Result<FeatureMaps<Const<1>, 1, OwnedTape<f32, Cpu>>>;

/// `(output, input gradient)` of `op` on a `(1, 1, h, w)` image for output gradient `dy`.
fn run<const H: usize, const W: usize>(
    op: PoolFn<H, W>,
    x: [[f32; W]; H],
    (k, s, p): (usize, usize, usize),
    dy: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let dev = Cpu::default();
    let x = dev.tensor([[x]]);
    let y = op(x.trace(Gradients::leaky()), k, s, p).unwrap();
    let y_vec = y.as_vec();
    let dy = dev.tensor_from_vec(dy.to_vec(), *y.shape());
    let grads = (y * dy).sum().backward();
    (y_vec, grads.get(&x).as_vec())
}

#[test]
fn max_pool_hand_computed_with_a_tie() {
    let x = [
        [1.0, 2.0, 5.0, 3.0],
        [4.0, 0.0, 1.0, 2.0],
        [7.0, 8.0, 2.0, 2.0],
        [6.0, 9.0, 2.0, 1.0],
    ];
    let (y, dx) = run(max_pool2d, x, (2, 2, 0), &[1.0, 2.0, 3.0, 4.0]);
    assert_eq!(y, [4.0, 5.0, 9.0, 2.0]);
    // The bottom-right window holds three 2s: the first in row-major order gets the gradient.
    #[rustfmt::skip]
    assert_eq!(dx, [
        0.0, 0.0, 2.0, 0.0,
        1.0, 0.0, 0.0, 0.0,
        0.0, 0.0, 4.0, 0.0,
        0.0, 3.0, 0.0, 0.0,
    ]);
}

#[test]
fn max_pool_all_equal_sends_the_gradient_to_the_first() {
    let (y, dx) = run(max_pool2d, [[1.5; 3]; 2], (2, 1, 0), &[1.0, 10.0]);
    assert_eq!(y, [1.5, 1.5]);
    assert_eq!(dx, [1.0, 10.0, 0.0, 0.0, 0.0, 0.0]);
}

#[test]
fn max_pool_never_selects_padding() {
    // All inputs negative: a zero from the padding would win if padding took part.
    let x = [[-1.0, -2.0], [-3.0, -4.0]];
    let (y, dx) = run(max_pool2d, x, (3, 1, 1), &[1.0, 2.0, 3.0, 4.0]);
    assert_eq!(y, [-1.0; 4]);
    assert_eq!(dx, [10.0, 0.0, 0.0, 0.0]);

    // Windows at the border see part of the input.
    let x = [[-5.0, -1.0, -7.0], [-2.0, -8.0, -3.0]];
    let (y, dx) = run(max_pool2d, x, (2, 2, 1), &[1.0, 2.0, 3.0, 4.0]);
    // Windows: {-5}, {-1, -7}, {-2}, {-8, -3}.
    assert_eq!(y, [-5.0, -1.0, -2.0, -3.0]);
    assert_eq!(dx, [1.0, 2.0, 0.0, 3.0, 0.0, 4.0]);
}

#[test]
fn max_pool_overlapping_windows_accumulate() {
    let x = [
        [0.0, 1.0, 0.0, 0.0],
        [0.0, 9.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 8.0],
    ];
    let (y, dx) = run(max_pool2d, x, (2, 1, 0), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(y, [9.0, 9.0, 0.0, 9.0, 9.0, 8.0]);
    // The 9 wins four windows; the all-zero window picks its first zero.
    #[rustfmt::skip]
    assert_eq!(dx, [
        0.0, 0.0, 3.0, 0.0,
        0.0, 1.0 + 2.0 + 4.0 + 5.0, 0.0, 0.0,
        0.0, 0.0, 0.0, 6.0,
    ]);
}

#[test]
fn max_pool_propagates_nan() {
    let (y, _) = run(max_pool2d, [[1.0, f32::NAN], [3.0, 2.0]], (2, 2, 0), &[1.0]);
    assert!(y[0].is_nan());
}

#[test]
fn avg_pool_counts_padding_in_the_divisor() {
    let x = [[1.0, 2.0], [3.0, 4.0]];
    let dy: Vec<f32> = (1..=9).map(|v| v as f32).collect();
    let (y, dx) = run(avg_pool2d, x, (2, 1, 1), &dy);
    #[rustfmt::skip]
    let expected = [
        1.0 / 4.0, 3.0 / 4.0, 2.0 / 4.0,
        4.0 / 4.0, 10.0 / 4.0, 6.0 / 4.0,
        3.0 / 4.0, 7.0 / 4.0, 4.0 / 4.0,
    ];
    assert_eq!(y, expected);
    // Each input lies in four windows; each window passes dy / 4.
    assert_eq!(
        dx,
        [
            (1.0 + 2.0 + 4.0 + 5.0) / 4.0,
            (2.0 + 3.0 + 5.0 + 6.0) / 4.0,
            (4.0 + 5.0 + 7.0 + 8.0) / 4.0,
            (5.0 + 6.0 + 8.0 + 9.0) / 4.0
        ]
    );
}

#[test]
fn avg_pool_without_padding() {
    let x = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]];
    let (y, dx) = run(avg_pool2d, x, (2, 2, 0), &[4.0, 8.0]);
    assert_eq!(y, [3.5, 5.5]);
    assert_eq!(dx, [1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0]);
}

/// Naive pooling of a contiguous `(n, c, h, w)` buffer, in f64.
fn naive_pool(
    x: &[f32],
    [n, c, h, w]: [usize; 4],
    (k, s, p): (usize, usize, usize),
    max: bool,
) -> Vec<f64> {
    let (oh, ow) = ((h + 2 * p - k) / s + 1, (w + 2 * p - k) / s + 1);
    let mut y = Vec::new();
    for plane in 0..n * c {
        for oy in 0..oh {
            for ox in 0..ow {
                let mut acc = if max { f64::NEG_INFINITY } else { 0.0 };
                for kh in 0..k {
                    for kw in 0..k {
                        let (iy, ix) = (
                            (oy * s + kh) as isize - p as isize,
                            (ox * s + kw) as isize - p as isize,
                        );
                        if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                            continue;
                        }
                        let v = x[plane * h * w + iy as usize * w + ix as usize] as f64;
                        acc = if max { acc.max(v) } else { acc + v };
                    }
                }
                y.push(if max { acc } else { acc / (k * k) as f64 });
            }
        }
    }
    y
}

#[test]
fn random_batches_match_naive_pooling_and_finite_differences() {
    let dev = Cpu::seed_from_u64(11);
    let dims = [2, 3, 5, 6];
    // Distinct values 0.1 apart, so that finite differences never cross a tie.
    let mut values: Vec<f32> = (0..dims.iter().product::<usize>())
        .map(|i| i as f32 * 0.1 - 9.0)
        .collect();
    let order: Tensor<(usize,), f32, _> = dev.sample_uniform_like(&(values.len(),));
    let mut keyed: Vec<(f32, f32)> = order
        .as_vec()
        .into_iter()
        .zip(values.iter().copied())
        .collect();
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0));
    values = keyed.into_iter().map(|(_, v)| v).collect();

    for max in [true, false] {
        for geometry in [(3, 2, 1), (2, 2, 0), (3, 1, 0), (2, 1, 1), (4, 3, 2)] {
            let (k, s, p) = geometry;
            let op = |x: Traced<(usize, Const<3>, usize, usize)>| {
                if max {
                    max_pool2d(x, k, s, p)
                } else {
                    avg_pool2d(x, k, s, p)
                }
            };
            let x = dev.tensor_from_vec(values.clone(), (2usize, Const::<3>, 5usize, 6usize));
            let y = op(x.trace(Gradients::leaky())).unwrap();
            let y_vec = y.as_vec();
            let expected = naive_pool(&values, dims, geometry, max);
            assert_eq!(y_vec.len(), expected.len());
            for (a, e) in y_vec.iter().zip(&expected) {
                assert!(
                    (*a as f64 - e).abs() <= 1e-5,
                    "max={max} {geometry:?}: {a} vs {e}"
                );
            }
            let r = dev.sample_normal_like(y.shape());
            let r_vec = r.as_vec();
            let dx = (y * r).sum().backward().get(&x).as_vec();
            let eps = 0.01f32;
            for (i, g) in dx.iter().enumerate() {
                let loss = |delta: f32| -> f64 {
                    let mut v = values.clone();
                    v[i] += delta;
                    naive_pool(&v, dims, geometry, max)
                        .iter()
                        .zip(&r_vec)
                        .map(|(y, r)| y * *r as f64)
                        .sum()
                };
                let fd = (loss(eps) - loss(-eps)) / (2.0 * eps as f64);
                assert!(
                    (*g as f64 - fd).abs() <= 1e-3 * fd.abs().max(1.0),
                    "max={max} {geometry:?} dx[{i}]: {g} vs {fd}"
                );
            }
        }
    }
}

#[test]
fn non_contiguous_input_matches_contiguous_copy() {
    let dev = Cpu::seed_from_u64(12);
    // Stored as (batch, height, channels, width); viewed as NCHW without copying.
    let base: Tensor<Rank4<2, 4, 3, 5>, f32, _> = dev.sample_normal();
    let view = || {
        base.clone()
            .permute::<Rank4<2, 3, 4, 5>, Axes4<0, 2, 1, 3>>()
    };
    let contiguous = view().contiguous();
    for (a, b) in [
        (
            max_pool2d(view(), 2, 2, 1).unwrap(),
            max_pool2d(contiguous.clone(), 2, 2, 1).unwrap(),
        ),
        (
            avg_pool2d(view(), 3, 1, 1).unwrap(),
            avg_pool2d(contiguous.clone(), 3, 1, 1).unwrap(),
        ),
    ] {
        assert_eq!(a.shape(), b.shape());
        assert_eq!(a.as_vec(), b.as_vec());
    }
    // The gradient lands on the stored tensor, in its own layout.
    let y = max_pool2d(
        base.trace(Gradients::leaky())
            .permute::<Rank4<2, 3, 4, 5>, Axes4<0, 2, 1, 3>>(),
        4,
        4,
        0,
    )
    .unwrap();
    let grads = y.sum().backward();
    assert_eq!(
        grads
            .get(&base)
            .as_vec()
            .iter()
            .filter(|g| **g == 1.0)
            .count(),
        2 * 3
    );
}

#[test]
fn invalid_geometry_is_a_typed_error() {
    let dev = Cpu::default();
    let x = dev.zeros_like(&(1usize, Const::<2>, 4usize, 4usize));

    let err = max_pool2d(x.clone(), 3, 1, 2).unwrap_err();
    assert!(matches!(err, QuantError::InvalidValue { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("max_pool2d: padding = 2") && msg.contains("at most half the kernel size"),
        "{msg}"
    );

    let msg = avg_pool2d(x.clone(), 2, 0, 0).unwrap_err().to_string();
    assert!(msg.contains("avg_pool2d: stride = 0"), "{msg}");

    let msg = avg_pool2d(x.clone(), 0, 1, 0).unwrap_err().to_string();
    assert!(msg.contains("kernel size = 0"), "{msg}");

    let msg = max_pool2d(x.clone(), 5, 1, 0).unwrap_err().to_string();
    assert!(
        msg.contains("input height = 4") && msg.contains("smaller than the kernel"),
        "{msg}"
    );

    let empty = dev.zeros_like(&(1usize, Const::<2>, 0usize, 3usize));
    let msg = max_pool2d(empty, 2, 1, 1).unwrap_err().to_string();
    assert!(msg.contains("input height = 0"), "{msg}");

    // 4 + 2 * 1 >= 5: padding makes room for the window.
    assert_eq!(
        max_pool2d(x, 5, 1, 1).unwrap().shape(),
        &(1, Const::<2>, 2, 2)
    );
}

#[test]
fn modules_use_const_geometry_and_cpu_errors() {
    let dev = Cpu::default();
    let x = dev.sample_normal_like(&(2usize, Const::<3>, 4usize, 6usize));
    // The stride defaults to the kernel size, as in PyTorch.
    let y = MaxPool2d::<2>.forward(x.clone());
    assert_eq!(*y.shape(), (2, Const::<3>, 2, 3));
    assert_eq!(y.as_vec(), max_pool2d(x.clone(), 2, 2, 0).unwrap().as_vec());
    let y = AvgPool2d::<3, 1, 1>.forward(x.clone());
    assert_eq!(*y.shape(), (2, Const::<3>, 4, 6));
    assert_eq!(y.as_vec(), avg_pool2d(x.clone(), 3, 1, 1).unwrap().as_vec());

    // Zero-sized modules build like any dfdx module and have no parameters.
    let built: MaxPool2d<2> = dev.build_module::<MaxPool2d<2>, f32>();
    assert_eq!(NumParams::<f32, Cpu>::num_trainable_params(&built), 0);

    // With a tape, through `forward_mut` as a training loop calls it.
    let mut pool = AvgPool2d::<2>;
    let y = pool.forward_mut(x.trace(Gradients::leaky()));
    assert_eq!(*y.shape(), (2, Const::<3>, 2, 3));

    assert!(matches!(
        MaxPool2d::<3, 1, 2>.try_forward(x.clone()),
        Err(CpuError::WrongNumElements)
    ));
    assert!(matches!(
        AvgPool2d::<5>.try_forward(x),
        Err(CpuError::WrongNumElements)
    ));
}
