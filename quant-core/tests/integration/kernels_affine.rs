use quant_core::__internals::*;
use quant_core::kernels::affine::*;

fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) * 2.0 - 1.0
        })
        .collect()
}

#[test]
fn plans_only_where_one_chain_per_output_holds() {
    let fma = fma_available();
    assert_eq!(Affine::new(64, 16, 64, 128, true).is_some(), fma);
    assert!(Affine::new(1, 64, 784, 128, false).is_none(), "depth 784");
    assert!(
        Affine::new(64, 16, 64, 2, true).is_none(),
        "depth 2 backward"
    );
    assert!(
        Affine::new(64, 1, 64, 64, false).is_none(),
        "one row a sequence"
    );
    assert!(Affine::new(0, 16, 64, 64, false).is_none(), "no sequence");
    assert!(
        Affine::new(1, 600, 64, 64, true).is_none(),
        "600 rows, backward"
    );
    assert_eq!(Affine::new(1, 600, 64, 64, false).is_some(), fma);
}

/// The products' two paths: the 16-lane loop where the CPU has AVX-512 F and VL, and the
/// AVX2 path (`gemm`, and the 8-lane loop of the weights' gradient).
const PRODUCT_PATHS: [(VectorPath, &str); 2] = [
    (VectorPath::Avx512, "avx512 path"),
    (VectorPath::Avx2, "avx2 path"),
];

/// The weights' gradient against one chain per output written out plainly, at widths that
/// take every block of the 8-lane loop (three, two and one vectors of eight columns, single
/// columns) and of the 16-lane one (masked last vectors), and output counts with rows left
/// over after the groups of four and of eight; on both paths.
#[test]
fn weight_gradient_is_one_chain_per_sequence() {
    crate::kernels::with_paths(&PRODUCT_PATHS, weight_gradient_cases);
}

fn weight_gradient_cases(path: &str) {
    for (sequences, rows, inputs, outputs) in [
        (3, 5, 45, 7),
        (2, 4, 59, 10),
        (2, 3, 8, 4),
        (1, 6, 3, 5),
        (2, 16, 48, 96),
    ] {
        let Some(plan) = Affine::new(sequences, rows, inputs, outputs, true) else {
            assert!(
                !fma_available(),
                "{inputs} inputs, {outputs} outputs: no plan"
            );
            continue; // No FMA: the path is never taken.
        };
        let x = values(sequences * rows * inputs, 1);
        let dy = values(sequences * rows * outputs, 2);
        let start = values(outputs * inputs, 3);
        let mut dw = start.clone();
        plan.weight_gradient(&mut dw, &x, &dy).unwrap();
        let mut expected = start;
        for s in 0..sequences {
            for o in 0..outputs {
                for i in 0..inputs {
                    let mut acc = 0.0f32;
                    for r in 0..rows {
                        let t = s * rows + r;
                        acc = dy[t * outputs + o].mul_add(x[t * inputs + i], acc);
                    }
                    expected[o * inputs + i] += acc;
                }
            }
        }
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&dw),
            bits(&expected),
            "{inputs} inputs, {outputs} outputs, {path}"
        );
        assert!(plan.weight_gradient(&mut dw, &x, &dy[1..]).is_none());
    }
}

/// The forward pass and the input's gradient against one chain per output written out
/// plainly (the bias, or the gradient already there, plus the chain, rounded once), at
/// widths with a masked last vector, depths below and above a vector, and row counts with
/// rows left over after the blocks of eight: on both paths, on one thread and on three.
#[test]
fn forward_and_input_gradient_are_one_chain_per_output() {
    crate::kernels::with_paths(&PRODUCT_PATHS, |path| {
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                forward_and_input_gradient_cases(&format!("{path}, {threads} threads"))
            });
        }
    });
}

fn forward_and_input_gradient_cases(label: &str) {
    for (sequences, rows, inputs, outputs) in [
        (3, 5, 45, 7),
        (2, 13, 59, 50),
        (1, 9, 16, 48),
        (2, 16, 48, 96),
        (1, 3, 100, 33),
        (4, 17, 5, 144),
    ] {
        let Some(plan) = Affine::new(sequences, rows, inputs, outputs, false) else {
            assert!(
                !fma_available(),
                "{inputs} inputs, {outputs} outputs: no plan"
            );
            continue;
        };
        let total = sequences * rows;
        let x = values(total * inputs, 4);
        let w = values(outputs * inputs, 5);
        let bias = values(outputs, 6);
        let y = plan.forward(&x, &w, &bias).unwrap();
        let mut expected_y = Vec::with_capacity(total * outputs);
        for r in 0..total {
            for o in 0..outputs {
                let mut acc = 0.0f32;
                for i in 0..inputs {
                    acc = x[r * inputs + i].mul_add(w[o * inputs + i], acc);
                }
                expected_y.push(bias[o] + acc);
            }
        }
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let case = format!("{total} rows, {inputs} inputs, {outputs} outputs, {label}");
        assert_eq!(bits(&y), bits(&expected_y), "forward, {case}");

        let dy = values(total * outputs, 7);
        let start = values(total * inputs, 8);
        let mut dx = start.clone();
        plan.input_gradient(&mut dx, &dy, &w).unwrap();
        let mut expected_dx = start;
        for r in 0..total {
            for i in 0..inputs {
                let mut acc = 0.0f32;
                for o in 0..outputs {
                    acc = dy[r * outputs + o].mul_add(w[o * inputs + i], acc);
                }
                expected_dx[r * inputs + i] += acc;
            }
        }
        assert_eq!(bits(&dx), bits(&expected_dx), "input gradient, {case}");
        assert!(plan.forward(&x[1..], &w, &bias).is_none());
        assert!(plan.input_gradient(&mut dx, &dy[1..], &w).is_none());
    }
}
