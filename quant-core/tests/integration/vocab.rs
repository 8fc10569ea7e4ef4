//! The vocabulary enums: their spelling in files, unknown names listing the known ones, the rounding policies on ties.

use quant_core::{QuantizationMethod, QuantizationTarget, RoundingPolicy, TrainingMethod};

#[test]
fn enums_serialise_with_their_code_spelling() {
    let spellings = [
        (
            serde_json::to_string(&QuantizationTarget::Weights),
            "Weights",
        ),
        (
            serde_json::to_string(&QuantizationMethod::PowerOfTwo),
            "PowerOfTwo",
        ),
        (
            serde_json::to_string(&RoundingPolicy::HalfAwayFromZero),
            "HalfAwayFromZero",
        ),
        (serde_json::to_string(&TrainingMethod::Lsq), "Lsq"),
    ];
    for (json, name) in spellings {
        assert_eq!(json.unwrap(), format!("\"{name}\""));
    }
    let m: QuantizationMethod = serde_json::from_str("\"Uniform\"").unwrap();
    assert_eq!(m, QuantizationMethod::Uniform);
    assert!(serde_json::from_str::<QuantizationMethod>("\"uniform\"").is_err());
}

#[test]
fn unknown_training_method_lists_known_ones() {
    let err = serde_json::from_str::<TrainingMethod>("\"Lqs\"")
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown training method `Lqs`"), "{err}");
    assert!(
        err.contains("Lsq") && err.contains("Ste") && err.contains("Pact"),
        "{err}"
    );
}

#[test]
fn rounding_policies_on_ties() {
    use RoundingPolicy::*;
    let cases: [(RoundingPolicy, [f32; 6]); 7] = [
        (HalfEven, [2.0, 4.0, -2.0, -4.0, 0.0, -0.0]),
        (HalfAwayFromZero, [3.0, 4.0, -3.0, -4.0, 1.0, -1.0]),
        (HalfUp, [3.0, 4.0, -2.0, -3.0, 1.0, 0.0]),
        (HalfDown, [2.0, 3.0, -3.0, -4.0, 0.0, -1.0]),
        (HalfTowardZero, [2.0, 3.0, -2.0, -3.0, 0.0, 0.0]),
        (Floor, [2.0, 3.0, -3.0, -4.0, 0.0, -1.0]),
        (Ceil, [3.0, 4.0, -2.0, -3.0, 1.0, 0.0]),
    ];
    let inputs = [2.5f32, 3.5, -2.5, -3.5, 0.5, -0.5];
    for (policy, expected) in cases {
        for (x, e) in inputs.iter().zip(expected) {
            assert_eq!(policy.round(*x), e, "{policy:?} of {x}");
        }
    }
    // Off ties every nearest policy agrees.
    for policy in [HalfEven, HalfAwayFromZero, HalfUp, HalfDown, HalfTowardZero] {
        assert_eq!(policy.round(2.4999998), 2.0);
        assert_eq!(policy.round(-2.5000002), -3.0);
    }
}
