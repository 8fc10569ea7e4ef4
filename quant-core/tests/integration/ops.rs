//! The dfdx ops: forward equal to the kernels, gradients against finite differences of the
//! smooth surrogate each op's backward pass differentiates, `OwnedTape` and `NoneTape`,
//! non-contiguous inputs, and use inside larger graphs.

use dfdx::prelude::*;
use quant_core::kernels::{self, fake_quantize_per_channel_affine};
use quant_core::{dfdx_ops, IntegerGrid, QParams, RoundingPolicy};

const HALF_EVEN: RoundingPolicy = RoundingPolicy::HalfEven;

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-3)
}

/// Central finite difference of `f` at `v` (f64 throughout).
fn fd(f: impl Fn(f64) -> f64, v: f64, h: f64) -> f64 {
    (f(v + h) - f(v - h)) / (2.0 * h)
}

#[test]
fn ste_forward_matches_the_kernel_and_gradient_is_the_mask() {
    let dev = Cpu::default();
    let x = dev.tensor([[0.26f32, -1.9, 0.74], [3.0, -0.51, 0.1]]);
    let q = QParams::per_channel(1, vec![0.5, 0.25, 0.1], vec![0, 1, -2]).unwrap();
    let grid = IntegerGrid::new(4, true, false).unwrap();
    let y = dfdx_ops::fake_quantize(x.clone().leaky_trace(), &q, grid, HALF_EVEN).unwrap();
    let expected = fake_quantize_per_channel_affine(
        &x.as_vec(),
        &[2, 3],
        1,
        q.scales(),
        q.zero_points(),
        -8,
        7,
    )
    .unwrap();
    assert_eq!(y.as_vec(), expected);
    let g = y.sum().backward();
    // x * (1/s) + z per element: [0.52, -6.6, 5.4] + [0,1,-2] -> in range except -1.9/0.25+1 = -6.6 ok,
    // 3.0/0.5 = 6 ok, -0.51/0.25 + 1 = -1.04 ok, 0.74/0.1 - 2 = 5.4 ok, 0.1/0.1-2 = -1 ok.
    assert_eq!(g.get(&x).array(), [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]);
    let far = dev.tensor([100.0f32, -100.0, 0.3]);
    let y = dfdx_ops::fake_quantize(
        far.leaky_trace(),
        &QParams::per_tensor(0.5, 0).unwrap(),
        grid,
        HALF_EVEN,
    )
    .unwrap();
    let g = y.sum().backward();
    assert_eq!(g.get(&far).array(), [0.0, 0.0, 1.0]);
}

#[test]
fn ops_work_on_non_contiguous_inputs() {
    let dev = Cpu::default();
    let t = dev.tensor([[0.3f32, 1.2, -0.4], [2.2, -3.1, 0.05]]);
    let xt = t.clone().leaky_trace().permute::<Rank2<3, 2>, _>();
    let q = QParams::per_channel(0, vec![0.5, 0.25, 1.0], vec![0, 0, 0]).unwrap();
    let grid = IntegerGrid::new(3, true, false).unwrap();
    let y = dfdx_ops::fake_quantize(xt, &q, grid, HALF_EVEN).unwrap();
    // Channel c of the permuted tensor is column c of `t`.
    let tv = t.array();
    let yv = y.array();
    for r in 0..2 {
        for c in 0..3 {
            let e = kernels::fake_quantize_per_tensor_affine(&[tv[r][c]], q.scales()[c], 0, -4, 3)
                .unwrap()[0];
            assert_eq!(yv[c][r], e);
        }
    }
    // Weighted sum so every position's gradient is distinguishable.
    let w = dev.tensor([[1.0f32, 2.0], [3.0, 4.0], [5.0, 6.0]]);
    let g = (y * w).sum().backward();
    let gt = g.get(&t).array();
    // -3.1 / 0.25 = -12.4 is below -4: masked. 2.2/0.5 = 4.4 > 3: masked.
    // 1.2/0.25 = 4.8 rounds to 5 > 3: masked too.
    assert_eq!(gt, [[1.0, 0.0, 5.0], [0.0, 0.0, 6.0]]);
}

#[test]
fn lsq_gradients_match_finite_differences_of_the_surrogate() {
    let dev = Cpu::default();
    let xs = [0.37f32, -0.92, 1.61, 5.3, -6.1, 0.04, 0.77, -0.33];
    let dys = [0.5f32, -1.0, 0.25, 1.5, -0.75, 2.0, 1.0, -0.5];
    let grid = IntegerGrid::new(4, false, false).unwrap(); // [0, 15]
    let (s0, z0) = (0.3f64, 4.0f64);
    // Surrogate: rounding residuals and in/out-of-range decisions frozen at (s0, z0).
    let frozen: Vec<(bool, f64, f64)> = xs
        .iter()
        .map(|x| {
            let x = *x as f64;
            let q = (x / s0).round_ties_even() + z0;
            let inside = (0.0..=15.0).contains(&q);
            let bound = if q < 0.0 { 0.0 } else { 15.0 };
            (inside, (x / s0).round_ties_even() - x / s0, bound)
        })
        .collect();
    let surrogate = |s: f64, z: f64| -> f64 {
        xs.iter()
            .zip(&dys)
            .zip(&frozen)
            .map(|((x, dy), (inside, resid, bound))| {
                let y = if *inside {
                    *x as f64 + resid * s
                } else {
                    (bound - z) * s
                };
                *dy as f64 * y
            })
            .sum()
    };
    let scale: Tensor<Rank1<1>, f32, Cpu> = dev.tensor([s0 as f32]);
    let zero: Tensor<Rank1<1>, f32, Cpu> = dev.tensor([z0 as f32]);
    let x = dev.tensor(xs);
    let y = dfdx_ops::lsq(
        x.clone().leaky_trace(),
        &scale,
        Some(&zero),
        None,
        grid,
        HALF_EVEN,
        Some(1.0),
    )
    .unwrap();
    let g = (y * dev.tensor(dys)).sum().backward();
    let ds = g.get(&scale).array()[0] as f64;
    let dz = g.get(&zero).array()[0] as f64;
    assert!(
        close(ds, fd(|s| surrogate(s, z0), s0, 1e-5), 1e-4),
        "ds {ds}"
    );
    assert!(
        close(dz, fd(|z| surrogate(s0, z), z0, 1e-5), 1e-4),
        "dz {dz}"
    );
    let dx = g.get(&x).array();
    for (i, (inside, _, _)) in frozen.iter().enumerate() {
        assert_eq!(dx[i], if *inside { dys[i] } else { 0.0 });
    }
}

#[test]
fn lsq_per_channel_on_axis_one_and_default_grad_factor() {
    let dev = Cpu::default();
    let x = dev.tensor([[0.2f32, -0.7, 3.0], [1.1, 0.45, -2.0]]);
    let scale: Tensor<Rank1<3>, f32, Cpu> = dev.tensor([0.1, 0.2, 0.4]);
    let grid = IntegerGrid::new(3, true, false).unwrap(); // [-4, 3]
    let y = dfdx_ops::lsq(
        x.clone().leaky_trace(),
        &scale,
        None,
        Some(1),
        grid,
        HALF_EVEN,
        None,
    )
    .unwrap();
    let g = y.sum().backward();
    let ds = g.get(&scale).array();
    let gfac = 1.0 / (6.0f64 * 3.0).sqrt();
    for c in 0..3 {
        let s = [0.1f32, 0.2, 0.4][c];
        let mut expect = 0.0;
        for r in 0..2 {
            // The definition's arithmetic: x * (1/s) in f32 (-0.7 * (1/0.2) is exactly -3.5).
            let v = x.array()[r][c] * (1.0 / s);
            let q = v.round_ties_even();
            expect += if q < -4.0 {
                -4.0
            } else if q > 3.0 {
                3.0
            } else {
                (q - v) as f64
            };
        }
        assert!(
            close(ds[c] as f64, expect * gfac, 1e-4),
            "channel {c}: {} vs {}",
            ds[c],
            expect * gfac
        );
    }
}

#[test]
fn pact_gradients_match_finite_differences_of_the_clip() {
    let dev = Cpu::default();
    let xs = [-0.5f32, 0.2, 0.9, 1.7, 2.4, 3.3];
    let dys = [1.0f32, 2.0, -1.0, 0.5, 3.0, -2.0];
    let alpha0 = 2.0f64;
    let alpha: Tensor<Rank0, f32, Cpu> = dev.tensor(alpha0 as f32);
    let grid = IntegerGrid::new(8, false, false).unwrap();
    let x = dev.tensor(xs);
    let y = dfdx_ops::pact(x.clone().leaky_trace(), &alpha, grid, HALF_EVEN).unwrap();
    // Forward: clamp to [0, α], then 8-bit with scale α/255.
    let expected = kernels::fake_quantize_per_tensor_affine(&xs, 2.0 / 255.0, 0, 0, 255).unwrap();
    assert_eq!(y.as_vec(), expected);
    let g = (y * dev.tensor(dys)).sum().backward();
    let surrogate = |a: f64| -> f64 {
        xs.iter()
            .zip(&dys)
            .map(|(x, d)| (*x as f64).clamp(0.0, a) * *d as f64)
            .sum()
    };
    let da = g.get(&alpha).array() as f64;
    assert!(close(da, fd(surrogate, alpha0, 1e-4), 1e-5), "dα {da}");
    assert_eq!(g.get(&x).array(), [0.0, 2.0, -1.0, 0.5, 0.0, 0.0]);
    // A signed grid is rejected.
    assert!(dfdx_ops::pact(x, &alpha, IntegerGrid::INT8, HALF_EVEN).is_err());
}

/// DSQ's soft surrogate, independently in f64, with the zero point and cell index frozen.
#[allow(clippy::too_many_arguments)]
fn dsq_soft(x: f64, alpha: f64, l: f64, u: f64, z: f64, cell: f64, qmin: f64, n: f64) -> f64 {
    let delta = (u.max(0.0) - l.min(0.0)) / n;
    let lo = qmin - z;
    let p = x / delta - lo;
    if p < 0.0 {
        return delta * lo;
    }
    if p > n {
        return delta * (lo + n);
    }
    let r = p - cell - 0.5;
    let a = (2.0 / alpha - 1.0).ln();
    let phi = (a * r).tanh() / (1.0 - alpha);
    delta * (lo + cell + (phi + 1.0) / 2.0)
}

#[test]
fn dsq_gradients_match_finite_differences_of_the_soft_surrogate() {
    let dev = Cpu::default();
    let grid = IntegerGrid::new(3, false, false).unwrap(); // [0, 7]
    let (a0, l0, u0) = (0.2f64, -0.6f64, 1.5f64);
    // Points inside cells (away from boundaries) and two outside the range.
    let xs = [-0.41f32, 0.07, 0.38, 0.93, 1.21, -2.0, 3.0];
    let dys = [1.0f32, -0.5, 2.0, 0.75, -1.25, 1.0, 0.5];
    let (s, z) = kernels::dsq_qparams(l0 as f32, u0 as f32, grid).unwrap();
    let n = 7.0;
    let cells: Vec<f64> = xs
        .iter()
        .map(|x| {
            ((*x as f64) / s as f64 + z as f64)
                .floor()
                .clamp(0.0, n - 1.0)
        })
        .collect();
    let total = |x: &[f64], a: f64, l: f64, u: f64| -> f64 {
        x.iter()
            .zip(&dys)
            .zip(&cells)
            .map(|((x, d), c)| *d as f64 * dsq_soft(*x, a, l, u, z as f64, *c, 0.0, n))
            .sum()
    };
    let xf: Vec<f64> = xs.iter().map(|v| *v as f64).collect();
    let alpha: Tensor<Rank1<1>, f32, Cpu> = dev.tensor([a0 as f32]);
    let lower: Tensor<Rank1<1>, f32, Cpu> = dev.tensor([l0 as f32]);
    let upper: Tensor<Rank1<1>, f32, Cpu> = dev.tensor([u0 as f32]);
    let x = dev.tensor(xs);
    let y = dfdx_ops::dsq(
        x.clone().leaky_trace(),
        &alpha,
        &lower,
        &upper,
        None,
        grid,
        HALF_EVEN,
    )
    .unwrap();
    // Forward: exact affine quantization over the nudged range.
    assert_eq!(
        y.as_vec(),
        kernels::fake_quantize_per_tensor_affine(&xs, s, z, 0, 7).unwrap()
    );
    let g = (y * dev.tensor(dys)).sum().backward();
    let h = 1e-5;
    let checks = [
        (
            "alpha",
            g.get(&alpha).array()[0] as f64,
            fd(|a| total(&xf, a, l0, u0), a0, h),
        ),
        (
            "lower",
            g.get(&lower).array()[0] as f64,
            fd(|l| total(&xf, a0, l, u0), l0, h),
        ),
        (
            "upper",
            g.get(&upper).array()[0] as f64,
            fd(|u| total(&xf, a0, l0, u), u0, h),
        ),
    ];
    for (what, got, want) in checks {
        assert!(
            close(got, want, 2e-3),
            "{what}: {got} vs finite difference {want}"
        );
    }
    let dx = g.get(&x).array();
    for i in 0..xs.len() {
        let want = fd(
            |v| {
                let mut xv = xf.clone();
                xv[i] = v;
                total(&xv, a0, l0, u0)
            },
            xf[i],
            h,
        );
        assert!(
            close(dx[i] as f64, want, 2e-3),
            "dx[{i}]: {} vs {want}",
            dx[i]
        );
    }
}

#[test]
fn none_tape_matches_owned_tape_and_ops_compose_in_larger_graphs() {
    let dev = Cpu::seed_from_u64(3);
    let x: Tensor<Rank2<4, 6>, f32, Cpu> = dev.sample_normal();
    let w: Tensor<Rank2<6, 5>, f32, Cpu> = dev.sample_normal();
    let scale: Tensor<Rank1<1>, f32, Cpu> = dev.tensor([0.2]);
    let grid = IntegerGrid::new(4, true, false).unwrap();
    let eval = dfdx_ops::lsq(
        x.clone().matmul(w.clone()),
        &scale,
        None,
        None,
        grid,
        HALF_EVEN,
        None,
    )
    .unwrap();
    let train = dfdx_ops::lsq(
        x.clone().leaky_trace().matmul(w.clone()),
        &scale,
        None,
        None,
        grid,
        HALF_EVEN,
        None,
    )
    .unwrap();
    assert_eq!(eval.as_vec(), train.as_vec());
    let loss = train.relu().square().mean();
    let g = loss.backward();
    // Gradients reach the input through matmul, and the scale.
    assert!(g.get(&x).as_vec().iter().any(|v| *v != 0.0));
    assert!(g.get(&scale).array()[0].is_finite() && g.get(&scale).array()[0] != 0.0);
    // Shapes that do not match the parameters are typed errors.
    let bad: Tensor<Rank1<3>, f32, Cpu> = dev.tensor([0.1, 0.1, 0.1]);
    assert!(dfdx_ops::lsq(x.clone(), &bad, None, Some(1), grid, HALF_EVEN, None).is_err());
    assert!(dfdx_ops::lsq(x.clone(), &bad, None, Some(2), grid, HALF_EVEN, None).is_err());
}

/// Two fake-quantizations in a row (the first's output an intermediate tensor): the input's
/// gradient and the step size's, with the used gradients released or kept.
fn chain_gradients(release: bool) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let dev = Cpu::default();
    let scale: Tensor<Rank1<1>, f32, Cpu> = dev.tensor([0.3]);
    let x = dev.tensor([[0.26f32, -1.9, 0.74], [3.0, -0.51, 0.1]]);
    let grid = IntegerGrid::new(4, true, false).unwrap();
    let lsq = |t| dfdx_ops::lsq(t, &scale, None, None, grid, HALF_EVEN, None).unwrap();
    let middle = lsq(x.clone().leaky_trace());
    let middle_id = middle.with_empty_tape();
    let y = lsq(middle * 1.5);
    let w = dev.tensor([[1.0f32, -2.0, 0.5], [0.25, 3.0, -1.0]]);
    let mut grads = {
        let _released = release.then(dfdx_ops::release_used_gradients);
        (y * w).sum().backward()
    };
    // Not `get`: a released (empty) gradient does not make a tensor.
    let middle_grad = grads.get_or_alloc_mut(&middle_id).unwrap().to_vec();
    (
        grads.get(&x).as_vec(),
        grads.get(&scale).as_vec(),
        middle_grad,
    )
}

#[test]
fn released_gradients_leave_the_leaves_gradients_unchanged() {
    let kept = chain_gradients(false);
    assert!(dfdx_ops::keep_used_gradients(), "kept by default");
    let released = chain_gradients(true);
    assert!(
        dfdx_ops::keep_used_gradients(),
        "the guard's drop restores keeping"
    );
    assert_eq!(kept.0, released.0, "the input's gradient");
    assert_eq!(kept.1, released.1, "the step size's gradient");
    assert_eq!(kept.2.len(), 6, "kept: the intermediate gradient stays");
    assert!(
        released.2.is_empty(),
        "released: the intermediate gradient was freed"
    );
    // Guards nest: the inner one's drop restores the outer one's release.
    let outer = dfdx_ops::release_used_gradients();
    drop(dfdx_ops::release_used_gradients());
    assert!(!dfdx_ops::keep_used_gradients());
    drop(outer);
    assert!(dfdx_ops::keep_used_gradients());
}

/// Output and the gradients of `x` and `w` of `(add(x, x·w) · v).sum()`, a residual add whose
/// first input also reaches the loss through the other branch, with `add` as given.
fn residual_gradients(
    add: impl Fn(
        Tensor<(usize, Const<5>), f32, Cpu, OwnedTape<f32, Cpu>>,
        Tensor<(usize, Const<5>), f32, Cpu, OwnedTape<f32, Cpu>>,
    ) -> Tensor<(usize, Const<5>), f32, Cpu, OwnedTape<f32, Cpu>>,
    x: &Tensor<(usize, Const<5>), f32, Cpu>,
    w: &Tensor<(usize, Const<5>), f32, Cpu>,
    v: &Tensor<(usize, Const<5>), f32, Cpu>,
) -> [Vec<f32>; 3] {
    // As dfdx's `Residual` does: the input's tape goes through the branch, then to the add.
    let (input, tape) = x.clone().leaky_traced().split_tape();
    let (branch, tape) = (input.clone().put_tape(tape) * w.clone().leaky_traced()).split_tape();
    let out = add(input.put_tape(tape), branch.retaped());
    let y = out.as_vec();
    let grads = (out * v.clone()).sum().backward();
    [y, grads.get(x).as_vec(), grads.get(w).as_vec()]
}

#[test]
fn add_is_dfdx_add_bit_for_bit_and_refuses_other_sizes() {
    let dev = Cpu::seed_from_u64(7);
    let x: Tensor<(usize, Const<5>), f32, Cpu> = dev.sample_normal_like(&(9, Const)) * 30.0;
    // Signed zeros, a NaN, an infinity, values that cancel, and tiny ones beside large ones.
    let special = [-0.0f32, 0.0, f32::NAN, f32::INFINITY, -1e-30];
    let mut x_values = x.as_vec();
    x_values[..5].copy_from_slice(&special);
    let x = dev.tensor_from_vec(x_values, (9, Const::<5>));
    let w: Tensor<(usize, Const<5>), f32, Cpu> = dev.sample_normal_like(&(9, Const));
    let mut v_values = dev
        .sample_normal_like::<(usize, Const<5>)>(&(9, Const))
        .as_vec();
    v_values[5..10].copy_from_slice(&[-0.0, 0.0, 1e30, -1e-30, -0.0]);
    let v = dev.tensor_from_vec(v_values, (9, Const::<5>));
    let ours = residual_gradients(|a, b| dfdx_ops::add(a, b).unwrap(), &x, &w, &v);
    let theirs = residual_gradients(|a, b| a + b, &x, &w, &v);
    for (what, (ours, theirs)) in ["output", "x's gradient", "w's gradient"]
        .iter()
        .zip(ours.iter().zip(&theirs))
    {
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(ours), bits(theirs), "{what}");
    }
    // With the used gradients released, the leaves' gradients are the same.
    let released = {
        let _released = dfdx_ops::release_used_gradients();
        residual_gradients(|a, b| dfdx_ops::add(a, b).unwrap(), &x, &w, &v)
    };
    assert_eq!(format!("{:?}", released), format!("{:?}", ours));
    // Without a tape, the same sum.
    let untraced = dfdx_ops::add(x.clone(), x.clone() * w.clone()).unwrap();
    assert_eq!(format!("{:?}", untraced.as_vec()), format!("{:?}", ours[0]));
    // Shapes of one type but other sizes: an error naming both shapes.
    let shorter: Tensor<(usize, Const<5>), f32, Cpu> = dev.zeros_like(&(8, Const));
    let err = dfdx_ops::add(x.clone(), shorter).unwrap_err().to_string();
    assert!(err.contains("[8, 5]") && err.contains("[9, 5]"), "{err}");
}
