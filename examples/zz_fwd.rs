//! Throwaway: a blocked FMA forward kernel against gemm (Affine::forward), same bits?
use quant_core::kernels::affine::Affine;
use std::arch::x86_64::*;

#[inline(always)]
unsafe fn block<const R: usize, const V: usize>(
    y: *mut f32,
    x: *const f32,
    wt: *const f32,
    r0: usize,
    c0: usize,
    inputs: usize,
    outputs: usize,
) {
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); V]; R];
        for t in 0..inputs {
            let w: [__m256; V] =
                std::array::from_fn(|v| _mm256_loadu_ps(wt.add(t * outputs + c0 + 8 * v)));
            for r in 0..R {
                let a = _mm256_set1_ps(*x.add((r0 + r) * inputs + t));
                for v in 0..V {
                    acc[r][v] = _mm256_fmadd_ps(a, w[v], acc[r][v]);
                }
            }
        }
        for r in 0..R {
            for v in 0..V {
                let d = y.add((r0 + r) * outputs + c0 + 8 * v);
                _mm256_storeu_ps(d, _mm256_add_ps(_mm256_loadu_ps(d), acc[r][v]));
            }
        }
    }
}

#[inline(always)]
unsafe fn block512<const R: usize, const V: usize>(
    y: *mut f32,
    x: *const f32,
    wt: *const f32,
    r0: usize,
    c0: usize,
    inputs: usize,
    outputs: usize,
) {
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        for t in 0..inputs {
            let w: [__m512; V] =
                std::array::from_fn(|v| _mm512_loadu_ps(wt.add(t * outputs + c0 + 16 * v)));
            for r in 0..R {
                let a = _mm512_set1_ps(*x.add((r0 + r) * inputs + t));
                for v in 0..V {
                    acc[r][v] = _mm512_fmadd_ps(a, w[v], acc[r][v]);
                }
            }
        }
        for r in 0..R {
            for v in 0..V {
                let d = y.add((r0 + r) * outputs + c0 + 16 * v);
                _mm512_storeu_ps(d, _mm512_add_ps(_mm512_loadu_ps(d), acc[r][v]));
            }
        }
    }
}
#[target_feature(enable = "avx,fma,avx512f,avx512vl")]
unsafe fn fwd_zmm(
    y: &mut [f32],
    x: &[f32],
    wt: &[f32],
    rows: usize,
    inputs: usize,
    outputs: usize,
) {
    unsafe {
        let mut r = 0;
        while r + 8 <= rows {
            let mut c = 0;
            while c + 48 <= outputs {
                block512::<8, 3>(
                    y.as_mut_ptr(),
                    x.as_ptr(),
                    wt.as_ptr(),
                    r,
                    c,
                    inputs,
                    outputs,
                );
                c += 48;
            }
            while c + 16 <= outputs {
                block512::<8, 1>(
                    y.as_mut_ptr(),
                    x.as_ptr(),
                    wt.as_ptr(),
                    r,
                    c,
                    inputs,
                    outputs,
                );
                c += 16;
            }
            r += 8;
        }
    }
}
#[inline(always)]
unsafe fn body<const R: usize>(
    y: &mut [f32],
    x: &[f32],
    wt: &[f32],
    rows: usize,
    inputs: usize,
    outputs: usize,
) {
    // assumes outputs % 24 == 0 or %16 / %8 (test shapes), rows % R == 0
    unsafe {
        let mut r = 0;
        while r + R <= rows {
            let mut c = 0;
            while c + 24 <= outputs {
                block::<R, 3>(
                    y.as_mut_ptr(),
                    x.as_ptr(),
                    wt.as_ptr(),
                    r,
                    c,
                    inputs,
                    outputs,
                );
                c += 24;
            }
            while c + 8 <= outputs {
                block::<R, 1>(
                    y.as_mut_ptr(),
                    x.as_ptr(),
                    wt.as_ptr(),
                    r,
                    c,
                    inputs,
                    outputs,
                );
                c += 8;
            }
            r += R;
        }
    }
}
#[target_feature(enable = "avx,fma")]
unsafe fn fwd_avx2(
    y: &mut [f32],
    x: &[f32],
    wt: &[f32],
    rows: usize,
    inputs: usize,
    outputs: usize,
) {
    unsafe { body::<4>(y, x, wt, rows, inputs, outputs) }
}
#[target_feature(enable = "avx,fma,avx512f,avx512vl")]
unsafe fn fwd_512(
    y: &mut [f32],
    x: &[f32],
    wt: &[f32],
    rows: usize,
    inputs: usize,
    outputs: usize,
) {
    unsafe { body::<8>(y, x, wt, rows, inputs, outputs) }
}

fn main() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    pool.install(|| {
        for &(seq, rows, inputs, outputs) in &[(64usize, 16usize, 48usize, 144usize), (64, 16, 48, 96), (64, 16, 96, 48), (64, 16, 48, 48), (64, 16, 64, 192)] {
            let a = Affine::new(seq, rows, inputs, outputs, true).unwrap();
            let n_rows = seq * rows;
            let x: Vec<f32> = (0..n_rows * inputs).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
            let w: Vec<f32> = (0..inputs * outputs).map(|i| ((i * 104729) % 997) as f32 / 997.0 - 0.5).collect();
            let b: Vec<f32> = (0..outputs).map(|i| i as f32 * 0.01).collect();
            let n = 2000;
            let mut ref_y = a.forward(&x, &w, &b).unwrap();
            let ours = |f: unsafe fn(&mut [f32], &[f32], &[f32], usize, usize, usize)| {
                let mut wt = vec![0.0f32; inputs * outputs];
                for o in 0..outputs { for i in 0..inputs { wt[i * outputs + o] = w[o * inputs + i]; } }
                let mut y = Vec::with_capacity(n_rows * outputs);
                for _ in 0..n_rows { y.extend_from_slice(&b); }
                unsafe { f(&mut y, &x, &wt, n_rows, inputs, outputs) };
                y
            };
            let same2 = ours(fwd_avx2) == ref_y;
            let same5 = ours(fwd_512) == ref_y; let samez = ours(fwd_zmm) == ref_y;
            let mut ts = [0.0f64; 4];
            for round in 0..3 {
                for k in 0..4 {
                    let t = std::time::Instant::now();
                    for _ in 0..n / 3 {
                        ref_y = match k { 0 => a.forward(&x, &w, &b).unwrap(), 1 => ours(fwd_avx2), 2 => ours(fwd_512), _ => ours(fwd_zmm) };
                    }
                    if round > 0 { ts[k] += t.elapsed().as_secs_f64(); }
                }
            }
            let per = |s: f64| s / (2 * (n / 3)) as f64 * 1e6;
            println!("{seq}x{rows} {inputs}->{outputs}: gemm {:.1} us | ours avx2 {:.1} us ({same2}) | ours 32reg {:.1} us ({same5}) | zmm {:.1} us ({samez})", per(ts[0]), per(ts[1]), per(ts[2]), per(ts[3]));
        }
    });
}
