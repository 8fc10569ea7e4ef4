//! PPQ's "customize your quantization platform" story, in a downstream crate: define a backend
//! preset without editing quant, register it, name it in a policy, and calibrate the digits
//! MLP for it (PTQ), comparing with a built-in platform.
//!
//! Run: `cargo run --release --example custom_platform`

use dfdx::prelude::*;
use quant::calibration::calibrate;
use quant::convert::convert_model;
use quant::digits;
use quant::export::onnx::OnnxConvention;
use quant::observers::ObserverConfig;
use quant::pipeline::nets::{Mlp, MlpBuilder};
use quant::pipeline::train::{accuracy, calibration_inputs, logits, predictions};
use quant::platform::{find_platform, platform_names, Platform};
use quant::policy::{Policy, QuantizerSettings};
use quant::report::{layer_report, layer_table};
use quant::{QuantizationMethod, RoundingPolicy, TrainingMethod};

/// A DSP that multiplies int8 by int8 with symmetric, per-tensor scales everywhere and rounds
/// ties away from zero (like NCNN), and whose activations are unsigned after ReLU.
fn my_dsp_int8() -> Platform {
    let settings = |per_channel: bool, observer: ObserverConfig| QuantizerSettings {
        training_method: Some(TrainingMethod::Ste),
        method: Some(QuantizationMethod::Symmetric),
        bits: Some(8),
        per_channel: Some(per_channel),
        narrow_range: Some(false),
        signed: None,
        rounding: Some(RoundingPolicy::HalfAwayFromZero),
        observer: Some(observer),
        // No learned rounding, bias correction, smoothing or method options.
        ..QuantizerSettings::default()
    };
    Platform {
        name: "MyDspInt8".into(),
        description: "a DSP: symmetric per-tensor int8 everywhere, ties away from zero".into(),
        weights: settings(false, ObserverConfig::MinMax),
        input: settings(
            false,
            ObserverConfig::from_kind("Percentile").unwrap_or_default(),
        ),
        // The DSP has no integer LayerNorm: those inputs stay float unless a policy says.
        float_kinds: vec![quant::convert::LayerKind::LayerNorm],
        attention: "matmul inputs quantized; softmax and LayerNorm in float".into(),
        // Its ONNX files in TensorRT's layout (int8, zero point 0, float biases).
        onnx: OnnxConvention::TensorRt,
    }
}

// The registration: from now on a policy file can say `platform = "MyDspInt8"`.
quant::register_platform!(MY_DSP_INT8 = "MyDspInt8", my_dsp_int8);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("Registered platforms: {}", platform_names().join(", "));
    println!("{}\n", find_platform("MyDspInt8")?);

    let data = digits::load(&digits::bundled_path())?;
    let dev = Cpu::seed_from_u64(0);
    let mut float: Mlp = dev.build_module::<MlpBuilder, f32>();
    let phase = quant::pipeline::train::Phase {
        epochs: 30,
        batch_size: 64,
        lr: 1e-3,
        schedule: quant::pipeline::config::Schedule::Cosine,
        warmup_epochs: 0,
        shift: 0,
        optimizer: quant::pipeline::config::Optimizer::Adam,
        weight_decay: 0.0,
        label_smoothing: 0.0,
    };
    quant::pipeline::train::train::<Mlp, (usize, Const<64>), 10>(
        &dev,
        &mut float,
        &data.train,
        &phase,
        0,
        None,
        None,
    )?;
    let fp32 = accuracy(
        &predictions(
            &logits::<Mlp, (usize, Const<64>), 10>(&dev, &float, &data.test, 256)?,
            10,
        ),
        data.test.labels(),
    );
    println!("float MLP: {:.2}% on the test split\n", 100.0 * fp32);

    for platform in ["MyDspInt8", "TensorRtInt8"] {
        let policy = Policy::from_toml_str(&format!("platform = \"{platform}\""), "inline policy")?;
        let mut q = convert_model(&float, &policy)?;
        let batches = calibration_inputs::<(usize, Const<64>)>(&dev, &data.train, 8, 64, 0)?;
        calibrate(&mut q, batches)?;
        let acc = accuracy(
            &predictions(
                &logits::<_, (usize, Const<64>), 10>(&dev, &q, &data.test, 256)?,
                10,
            ),
            data.test.labels(),
        );
        println!("PTQ for {platform}: {:.2}%", 100.0 * acc);
        let (pixels, _) = data.train.gather(&(0..128).collect::<Vec<_>>());
        println!("{}", layer_table(&layer_report(&q, &[64], &pixels)?));
    }
    Ok(())
}
