//! The exported-model loader on arbitrary files, then the integer runtime on what loads.
//!
//! Input layout: a little-endian u32 `n`, then `n` bytes of `model.json`, then the rest as
//! `model.safetensors`. Seed the corpus with real exports (see README.md).
#![no_main]

use libfuzzer_sys::fuzz_target;
use quant_runtime::export;
use quant_runtime::integer::IntegerModel;

fuzz_target!(|data: &[u8]| {
    let Some((len, rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    let n = (u32::from_le_bytes(*len) as usize).min(rest.len());
    let (meta, tensors) = rest.split_at(n);
    let dir = std::env::temp_dir().join(format!("quant-fuzz-export-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch directory");
    std::fs::write(dir.join("model.json"), meta).expect("write model.json");
    std::fs::write(dir.join("model.safetensors"), tensors).expect("write model.safetensors");
    let Ok(model) = export::load(&dir) else {
        return;
    };
    let Ok(integer) = IntegerModel::new(&model) else {
        return;
    };
    // The runtime bounds a sample's cost; keep each fuzz iteration fast as well.
    if integer.macs_per_sample() > 1 << 22 {
        return;
    }
    let x: Vec<f32> = (0..2 * integer.input_features())
        .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.21)
        .collect();
    let logits = integer.forward(&x).expect("a prepared model runs");
    assert_eq!(logits.len(), 2 * integer.output_features());
    assert!(logits.iter().all(|v| v.is_finite()));
});
