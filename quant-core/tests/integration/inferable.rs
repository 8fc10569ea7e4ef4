//! `InferableQuantizer`: invariants checked on load, codes in every storage type.

use quant_core::{InferableQuantizer, IntegerGrid, QParams, QuantizationMethod, RoundingPolicy};

#[test]
fn invariants_are_checked_on_load() {
    let ok = r#"{"method":"PowerOfTwo","grid":{"bits":4,"signed":true},"qparams":{"scales":[0.25],"zero_points":[0]}}"#;
    let q: InferableQuantizer = serde_json::from_str(ok).unwrap();
    assert_eq!(q.grid().quant_min(), -8);
    let not_pow2 = ok.replace("0.25", "0.3");
    let err = serde_json::from_str::<InferableQuantizer>(&not_pow2)
        .unwrap_err()
        .to_string();
    assert!(err.contains("power of two"), "{err}");
    let zp = ok.replace("\"zero_points\":[0]", "\"zero_points\":[1]");
    assert!(serde_json::from_str::<InferableQuantizer>(&zp).is_err());
    let nan = ok.replace("0.25", "NaN");
    assert!(serde_json::from_str::<InferableQuantizer>(&nan).is_err());
    let extra = ok.replace("\"method\"", "\"oops\":1,\"method\"");
    assert!(serde_json::from_str::<InferableQuantizer>(&extra).is_err());
}

#[test]
fn per_channel_storage_types() {
    let q = InferableQuantizer::new(
        QuantizationMethod::Uniform,
        IntegerGrid::UINT8,
        RoundingPolicy::HalfEven,
        QParams::per_channel(1, vec![0.1, 0.2], vec![10, 0]).unwrap(),
    )
    .unwrap();
    let x = [0.0, 1.0, -1.0, 60.0];
    let u: Vec<u8> = q.quantize(&x, &[2, 2]).unwrap();
    assert_eq!(u, vec![10, 5, 0, 255]);
    let w: Vec<i16> = q.quantize(&x, &[2, 2]).unwrap();
    assert_eq!(w, vec![10, 5, 0, 255]);
    assert!(q.quantize::<i8>(&x, &[2, 2]).is_err());
    assert!(q.quantize::<u8>(&x, &[4, 1]).is_err());
    assert_eq!(
        q.dequantize(&u, &[2, 2]).unwrap(),
        q.fake_quantize(&x, &[2, 2]).unwrap()
    );
}
