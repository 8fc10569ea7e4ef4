// A user's crate, outside quant's workspace (trybuild builds it as its own project): it builds
// dfdx's `TransformerEncoder`, converts it with a policy file, calibrates it, trains it with
// quantization, lists its quantizers by dotted name, and runs the trained model on integers.

use quant::dfdx::optim::{Adam, AdamConfig};
use quant::dfdx::prelude::*;
use quant::calibration::calibrate;
use quant::convert::convert_model;
use quant::lower::export_model;
use quant::integer::IntegerModel;
use quant::layers::{QuantizedModuleExt, QuantizerMode};
use quant::policy::Policy;

type Encoder = TransformerEncoder<16, 2, 32, 2>;

fn main() {
    let dev = Cpu::seed_from_u64(0);
    let float = dev.build_module::<Encoder, f32>();
    let policy = Policy::from_toml_str(
        include_str!("../support/transformer_policy.toml"),
        "transformer_policy.toml",
    )
    .unwrap();
    let mut q = convert_model(&float, &policy).unwrap();
    policy.check_unmatched().unwrap();

    let quantizers = q.quantizers().unwrap();
    let bits = |name: &str| {
        quantizers
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("{name} in {quantizers:?}"))
            .1
            .bits
    };
    assert_eq!(bits("0.self_attn.w_q.weights"), 4);
    assert_eq!(bits("0.self_attn.scores.query"), 8);
    assert_eq!(bits("1.self_attn.context.probs"), 8);
    assert_eq!(bits("1.norm2.input"), 8);
    assert_eq!(bits("1.ff.0.2.input"), 6);

    let x: Tensor<Rank3<8, 6, 16>, f32, _> = dev.sample_normal();
    calibrate(&mut q, vec![x.clone()]).unwrap();
    q.set_mode("*", QuantizerMode::Training).unwrap();
    let target: Tensor<Rank3<8, 6, 16>, f32, _> = dev.sample_normal();
    let mut opt = Adam::new(&q, AdamConfig { lr: 1e-3, ..Default::default() });
    let mut losses = Vec::new();
    for _ in 0..20 {
        let grads = q.alloc_grads();
        let loss = mse_loss(q.try_forward_mut(x.clone().traced(grads)).unwrap(), target.clone());
        losses.push(loss.array());
        opt.update(&mut q, &loss.backward()).unwrap();
    }
    assert!(losses[19] < losses[0], "{losses:?}");

    q.set_mode("*", QuantizerMode::Frozen).unwrap();
    let fq = q.try_forward(x.clone()).unwrap().as_vec();
    let graph = export_model(&q, &[6, 16], Default::default()).unwrap();
    let int = IntegerModel::new(&graph).unwrap().forward(&x.as_vec()).unwrap();
    let range = fq.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = int.iter().zip(&fq).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst <= 1e-5 * range, "integer vs fake-quantized: {worst} of {range}");
}
