//! Quantized layers take every input rank their float layer takes: `QLinear` on `[features]`,
//! `[batch, features]` and `[batch, seq, features]` like dfdx's `Linear`, activation quantizers
//! on any rank, weights per output channel whatever the input's rank. A rank-3 input gives what
//! the rank-2 layer gives at each sequence position, forward and backward.

use dfdx::nn::builders::Linear;
use dfdx::prelude::*;
use quant_dfdx::convert::convert_model;
use quant_dfdx::layers::{QuantizedModuleExt, QuantizerControl, QuantizerMode, TensorQuantizer};
use quant_dfdx::policy::Policy;

fn policy(bits: u32) -> Policy {
    Policy::from_toml_str(
        &format!(
            "[weights]\ntraining_method = \"Lsq\"\nmethod = \"Symmetric\"\nbits = {bits}\n\
             [input]\ntraining_method = \"Lsq\"\nmethod = \"Uniform\"\nbits = {bits}\nobserver = \"MinMax\"\n"
        ),
        "ranks.toml",
    )
    .unwrap()
}

type Net = (Linear<8, 16>, ReLU, Linear<16, 5>);

/// `a` and `b` agree to float rounding (the matrix products of different ranks may add in a
/// different order), relative to the largest value.
fn assert_close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    let range = a.iter().chain(b).fold(1e-30f32, |m, v| m.max(v.abs()));
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-6 * range, "{what}[{i}]: {x} vs {y}");
    }
}

#[test]
fn a_rank_3_input_gives_the_rank_2_output_at_every_sequence_position() {
    let dev = Cpu::seed_from_u64(0);
    let float = dev.build_module::<Net, f32>();
    let mut q = convert_model(&float, &policy(4)).unwrap();
    // Calibrated on sequences: [batch, seq, features].
    let calib: Tensor<Rank3<6, 5, 8>, f32, _> = dev.sample_normal();
    let y = q.try_forward_mut(calib.clone()).unwrap();
    assert_eq!(
        y.array(),
        float.forward(calib).array(),
        "calibrating passes through"
    );
    assert_eq!(q.finish_calibration().unwrap(), 4);
    // Weights per output channel, whatever the rank of the input they were calibrated on.
    let scales = q.0.weights_quantizer.qparams().unwrap().unwrap();
    assert_eq!((scales.channels(), scales.axis()), (16, Some(0)));
    assert_eq!(
        q.2.weights_quantizer.qparams().unwrap().unwrap().channels(),
        5
    );

    let x: Tensor<Rank3<2, 3, 8>, f32, _> = dev.sample_normal();
    let y3 = q.try_forward(x.clone()).unwrap().array();
    let xs = x.array();
    for (b, y3b) in y3.iter().enumerate() {
        let x2: Tensor<Rank2<3, 8>, f32, _> = dev.tensor(xs[b]);
        let y2 = q.try_forward(x2).unwrap().array();
        assert_close(&y3b.concat(), &y2.concat(), &format!("batch {b}, rank 2"));
        for (s, y3bs) in y3b.iter().enumerate() {
            let x1: Tensor<Rank1<8>, f32, _> = dev.tensor(xs[b][s]);
            let y1 = q.try_forward(x1).unwrap().array();
            assert_close(y3bs, &y1, &format!("batch {b}, position {s}, rank 1"));
        }
    }
    // The model really quantizes: the 4-bit output differs from the float one.
    let yf = float.forward(x.clone()).array();
    assert!(yf.concat().concat() != y3.concat().concat());
}

#[test]
fn gradients_flow_through_rank_3_inputs_as_through_each_position() {
    let dev = Cpu::seed_from_u64(1);
    let float = dev.build_module::<Net, f32>();
    let mut q = convert_model(&float, &policy(8)).unwrap();
    let x: Tensor<Rank3<2, 4, 8>, f32, _> = dev.sample_normal();
    q.try_forward_mut(x.clone()).unwrap();
    q.finish_calibration().unwrap();
    q.set_mode("*", QuantizerMode::Training).unwrap();
    let w3: Tensor<Rank3<2, 4, 5>, f32, _> = dev.sample_normal();

    let y = q.try_forward(x.leaky_trace()).unwrap();
    let grads3 = (y * w3.clone()).sum().backward();
    // Every parameter and both kinds of quantizer parameter get a gradient.
    let dx3 = grads3.get(&x).array();
    assert!(dx3.concat().concat().iter().any(|g| *g != 0.0));
    for (name, g) in [
        ("0.weight", grads3.get(&q.0.weight).as_vec()),
        ("2.weight", grads3.get(&q.2.weight).as_vec()),
        (
            "0.weights scale",
            grads3.get(&q.0.weights_quantizer.learned).as_vec(),
        ),
        (
            "2.input scale",
            grads3.get(&q.2.input_quantizer.learned).as_vec(),
        ),
    ] {
        assert!(
            g.iter().all(|v| v.is_finite()) && g.iter().any(|v| *v != 0.0),
            "{name}: {g:?}"
        );
    }

    // The input gradient at each batch element is the rank-2 layer's, and the weight gradient
    // is the sum of the rank-2 gradients (the quantizers' parameters are fixed by the
    // calibration; LSQ's step-size gradient scale depends on the tensor size, so it is left
    // out of the comparison).
    let (xs, ws) = (x.array(), w3.array());
    let mut weight_sum = vec![0f32; 16 * 8];
    for b in 0..2 {
        let x2: Tensor<Rank2<4, 8>, f32, _> = dev.tensor(xs[b]);
        let w2: Tensor<Rank2<4, 5>, f32, _> = dev.tensor(ws[b]);
        let y = q.try_forward(x2.leaky_trace()).unwrap();
        let grads2 = (y * w2).sum().backward();
        assert_close(
            &grads2.get(&x2).as_vec(),
            &dx3[b].concat(),
            &format!("dx of batch {b}"),
        );
        for (s, g) in weight_sum.iter_mut().zip(grads2.get(&q.0.weight).as_vec()) {
            *s += g;
        }
    }
    assert_close(&grads3.get(&q.0.weight).as_vec(), &weight_sum, "d 0.weight");
}

#[test]
fn activation_quantizers_take_any_rank() {
    let dev = Cpu::seed_from_u64(2);
    let spec = policy(4);
    let mut quantizer: TensorQuantizer<1> = TensorQuantizer::new(&dev);
    // Configure it as the policy configures a Linear's input.
    let mut model = convert_model(&dev.build_module::<Linear<6, 2>, f32>(), &spec).unwrap();
    let input_spec = model.input_quantizer.spec().unwrap().clone();
    quantizer.configure("act", input_spec).unwrap();
    let calib: Tensor<Rank4<2, 3, 4, 6>, f32, _> = dev.sample_normal();
    quantizer.try_forward_mut(calib.clone()).unwrap();
    quantizer.finish_calibration().unwrap();
    // Per tensor: every rank gives the rank-1 result on the same values.
    let flat: Tensor<Rank1<144>, f32, _> = dev.tensor(calib.as_vec());
    let expected = quantizer.try_forward(flat).unwrap().as_vec();
    assert_eq!(
        quantizer.try_forward(calib.clone()).unwrap().as_vec(),
        expected
    );
    let rank3: Tensor<Rank3<6, 4, 6>, f32, _> = dev.tensor(calib.as_vec());
    assert_eq!(quantizer.try_forward(rank3).unwrap().as_vec(), expected);
    let scalar: Tensor<Rank0, f32, _> = dev.tensor(calib.as_vec()[0]);
    assert_eq!(quantizer.try_forward(scalar).unwrap().array(), expected[0]);
    // 4 bits: at most 16 distinct values.
    let mut distinct = expected.clone();
    distinct.sort_by(f32::total_cmp);
    distinct.dedup();
    assert!(distinct.len() <= 16, "{distinct:?}");
    // And the same layer, on rank-1 input, quantizes its input with it.
    model
        .try_forward_mut(dev.sample_normal::<Rank3<4, 5, 6>>())
        .unwrap();
    model.finish_calibration().unwrap();
    let y: Tensor<Rank1<2>, f32, _> = model.try_forward(dev.sample_normal::<Rank1<6>>()).unwrap();
    assert!(y.array().iter().all(|v| v.is_finite()));
}
