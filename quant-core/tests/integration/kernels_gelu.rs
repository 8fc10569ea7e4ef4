use quant_core::__internals::*;
use quant_core::kernels::{gelu_backward_into, gelu_forward_into};
use quant_core::QuantError;
use std::f32::consts::FRAC_2_SQRT_PI;

/// `erf` of every element of `x`, `libm::erff` bit for bit, on `path` (compiled as the
/// forward's paths are).
fn erf_on(path: VectorPath, x: &[f32], out: &mut [f32]) {
    #[inline(always)]
    fn lanes(x: &[f32], out: &mut [f32]) {
        for (o, x) in out.iter_mut().zip(x) {
            *o = erf_branchless(*x);
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn avx2_loop(x: &[f32], out: &mut [f32]) {
        lanes(x, out);
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512_loop(x: &[f32], out: &mut [f32]) {
        lanes(x, out);
    }
    #[cfg(target_arch = "x86_64")]
    match path {
        VectorPath::Avx512 if std::arch::is_x86_feature_detected!("avx512f") => {
            // SAFETY: the CPU has AVX-512 F, checked in the guard.
            return unsafe { avx512_loop(x, out) };
        }
        VectorPath::Avx2 if std::arch::is_x86_feature_detected!("avx2") => {
            // SAFETY: the CPU has AVX2, checked in the guard.
            return unsafe { avx2_loop(x, out) };
        }
        _ => {}
    }
    let _ = path;
    lanes(x, out);
}

const PATHS: [VectorPath; 3] = [VectorPath::Baseline, VectorPath::Avx2, VectorPath::Avx512];

/// Inputs that reach every range of `erff` and its `expf`, the boundaries between them
/// (a few ulps either side), and a sweep of every 2^12th bit pattern.
fn inputs() -> Vec<f32> {
    let mut xs = Vec::new();
    let bounds: [u32; 9] = [
        0x3180_0000,
        0x3f58_0000,
        0x3fa0_0000,
        0x4036_db6d,
        0x40c0_0000,
        0x7f80_0000,
        0x3eb1_7218,
        0x3f85_1592,
        0x3900_0000,
    ];
    for b in bounds {
        for d in 0..16u32 {
            for bits in [b.wrapping_add(d), b.wrapping_sub(d)] {
                xs.push(f32::from_bits(bits));
                xs.push(-f32::from_bits(bits));
            }
        }
    }
    xs.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
    ]);
    xs.extend((0..(1u64 << 20)).map(|i| f32::from_bits((i << 12) as u32 | (i as u32 & 0xfff))));
    xs
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn erf_is_libms_bit_for_bit_on_every_path() {
    let xs = inputs();
    for path in PATHS {
        let mut out = vec![0.0; xs.len()];
        erf_on(path, &xs, &mut out);
        for (x, e) in xs.iter().zip(&out) {
            let want = libm::erff(*x);
            assert!(
                same(*e, want),
                "{path:?}: erf({x:e}) = {e:e}, libm {want:e}"
            );
        }
    }
}

#[test]
fn the_reduced_expf_is_libms_on_the_arguments_erff_passes() {
    // -z² - 0.5625 for |z| < 6 and the small second argument: [-36.6, 1], densely.
    let negative = (0x8000_0000u32..=(-36.6f32).to_bits()).step_by(97);
    let positive = (0u32..=1.0f32.to_bits()).step_by(97);
    for x in negative.chain(positive).map(f32::from_bits) {
        assert!(same(expf_reduced(x), libm::expf(x)), "expf({x:e})");
    }
}

#[test]
fn buffers_of_another_length_are_an_error_naming_the_buffer() {
    let x = [0.5f32; 3];
    let err = gelu_forward_into(&x, &mut [0.0; 2], &mut [0.0; 3]).unwrap_err();
    assert!(
        matches!(&err, QuantError::LengthMismatch { what, expected: 3, actual: 2 } if what == "GELU output"),
        "{err}"
    );
    let err = gelu_backward_into(&x, &[0.0; 3], &[0.0; 3], &mut [0.0; 4]).unwrap_err();
    assert!(
        matches!(&err, QuantError::LengthMismatch { what, expected: 3, actual: 4 } if what == "GELU input gradient"),
        "{err}"
    );
}

/// Long enough to run in parallel: the public passes give the one-piece baseline's bits
/// on one thread and on three (a piece handed to the wrong values would show).
#[test]
fn the_parallel_passes_give_the_same_bits_on_any_number_of_threads() {
    let base = inputs();
    let x: Vec<f32> = (0..GELU_PARALLEL + 1234)
        .map(|i| base[i % base.len()] * (1.0 + (i / base.len()) as f32 * 1e-3))
        .collect();
    let dy: Vec<f32> = (0..x.len()).map(|i| (i % 97) as f32 * 0.01 - 0.3).collect();
    let (mut y0, mut e0, mut dx0) = (vec![0.0; x.len()], vec![0.0; x.len()], vec![0.5; x.len()]);
    gelu_forward_on(VectorPath::Baseline, &x, &mut y0, &mut e0);
    for (((x, e), dy), dx) in x.iter().zip(&e0).zip(&dy).zip(dx0.iter_mut()) {
        let normal_dist = FRAC_2_SQRT_PI * (0.5 * -(*x * *x)).exp();
        *dx += (0.5 * (1.0 + *e) + 0.5 * *x * normal_dist) * *dy;
    }
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let (mut y, mut e, mut dx) = (vec![0.0; x.len()], vec![0.0; x.len()], vec![0.5; x.len()]);
        pool.install(|| {
            gelu_forward_into(&x, &mut y, &mut e).unwrap();
            gelu_backward_into(&x, &e, &dy, &mut dx).unwrap();
        });
        for i in 0..x.len() {
            let ok = same(y[i], y0[i]) && same(e[i], e0[i]) && same(dx[i], dx0[i]);
            assert!(ok, "{threads} threads, value {i} ({:e})", x[i]);
        }
    }
}

/// The forward pass, which gathers `erf`'s far range apart from the other ranges, gives
/// `libm::erff(x/√2)` and dfdx's `0.5·x·(1 + erf)` on every path: on the sweep (pieces with
/// no far lane and with nothing else), on the sweep shuffled so that far lanes fall anywhere
/// in a piece, and on the shuffle shifted by 17 values (pieces starting elsewhere, a shorter
/// last one).
#[test]
fn every_path_gives_libms_erf_and_dfdxs_gelu() {
    let sweep = inputs();
    let mut mixed = sweep.clone();
    let mut next = crate::test_rng::xorshift(0x9e37_79b9_7f4a_7c15u64);
    for i in (1..mixed.len()).rev() {
        mixed.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    for x in [&sweep[..], &mixed[..], &mixed[17..]] {
        for path in PATHS {
            let (mut y, mut e) = (vec![0.0; x.len()], vec![0.0; x.len()]);
            gelu_forward_on(path, x, &mut y, &mut e);
            for (i, x) in x.iter().enumerate() {
                let want_e = libm::erff(*x * std::f32::consts::FRAC_1_SQRT_2);
                let want_y = 0.5 * *x * (1.0 + want_e);
                let ok = same(e[i], want_e) && same(y[i], want_y);
                assert!(
                    ok,
                    "{path:?} at {x:e}: {:e} {:e}, want {want_e:e} {want_y:e}",
                    e[i], y[i]
                );
            }
        }
    }
}
