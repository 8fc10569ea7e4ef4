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
