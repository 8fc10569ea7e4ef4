//! Checks shared by the integration tests.

use quant_runtime::integer::LOGIT_TOLERANCE;

/// Integer outputs match the fake-quantized model's within the integer runtime's documented
/// tolerance, relative to the largest |output| (`what` names the model in the message).
pub fn assert_integer_matches(int: &[f32], fq: &[f32], what: &str) {
    assert_eq!(int.len(), fq.len(), "{what}: output lengths");
    let range = fq.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = int
        .iter()
        .zip(fq)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        worst <= LOGIT_TOLERANCE * range,
        "{what}: integer vs fake-quantized outputs differ by {worst} (range {range})"
    );
}

/// The same bits, or both NaN: what "bit for bit" means in the tests of the layers that
/// reproduce dfdx's numbers.
pub fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// [`same`] element by element, and the same length.
pub fn all_same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same(*a, *b))
}

/// Runs `f` with quant-core's AVX-512 paths of the Linear layers' products and of the
/// attention's passes (taken where the CPU has AVX-512 F and VL), then with their AVX2 paths,
/// naming the path. One caller at a time: the limit is the process's.
pub fn every_fma_path(mut f: impl FnMut(&str)) {
    use quant_core::__internals::{limit_kernel_paths, VectorPath};
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for (path, label) in [
        (VectorPath::Avx512, "avx512 path"),
        (VectorPath::Avx2, "avx2 path"),
    ] {
        limit_kernel_paths(path);
        f(label);
    }
    limit_kernel_paths(VectorPath::Avx512);
}
