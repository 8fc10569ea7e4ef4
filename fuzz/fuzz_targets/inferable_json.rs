//! The inferable-quantizer JSON loader on arbitrary bytes; whatever loads must quantize,
//! dequantize and round-trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quant_core::InferableQuantizer;

fuzz_target!(|data: &[u8]| {
    let Ok(q) = serde_json::from_slice::<InferableQuantizer>(data) else {
        return;
    };
    let channels = q.qparams().channels();
    let shape = match q.qparams().axis() {
        None => vec![7],
        Some(axis) if axis < 4 && channels <= 4096 => {
            let mut s = vec![2; axis + 1];
            s[axis] = channels;
            s
        }
        Some(_) => return,
    };
    let n: usize = shape.iter().product();
    let x: Vec<f32> = (0..n).map(|i| (i as f32 - 3.0) * 0.37).collect();
    let codes: Vec<i32> = q.quantize(&x, &shape).expect("quantize a matching tensor");
    let g = q.grid();
    assert!(codes.iter().all(|c| *c >= g.quant_min() && *c <= g.quant_max()));
    let y = q.dequantize(&codes, &shape).expect("dequantize");
    assert_eq!(y, q.fake_quantize(&x, &shape).expect("fake-quantize"));
    let json = serde_json::to_string(&q).expect("serialize");
    assert_eq!(serde_json::from_str::<InferableQuantizer>(&json).expect("reload"), q);
});
