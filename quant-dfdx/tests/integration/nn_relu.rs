//! `quant_dfdx::nn::Relu`: dfdx's `ReLU` bit for bit, on one thread and on several.

use crate::common::same;
use dfdx::nn::modules;
use dfdx::prelude::*;
use quant_core::kernels::RELU_PARALLEL;
use quant_dfdx::convert::{Convert, GraphOp};
use quant_dfdx::nn::{relu, Relu};
use quant_runtime::graph::Op;

/// Forward values and input gradients of ours and dfdx's ReLU on `xs`, with output gradients
/// `dys`.
fn both(xs: Vec<f32>, dys: Vec<f32>) -> [(Vec<f32>, Vec<f32>); 2] {
    let dev = Cpu::default();
    let n = xs.len();
    let x = dev.tensor_from_vec(xs, (n,));
    let dy = dev.tensor_from_vec(dys, (n,));
    [true, false].map(|ours| {
        let traced = x.clone().leaky_traced();
        let y = if ours {
            relu(traced).unwrap()
        } else {
            traced.relu()
        };
        let values = y.retaped::<NoneTape>().as_vec();
        let grads = (y * dy.clone()).sum().backward();
        (values, grads.get(&x).as_vec())
    })
}

#[test]
fn forward_and_backward_are_dfdx_relus_bit_for_bit() {
    // Signed zeros, infinities, NaN, subnormals and a sweep of bit patterns; output gradients
    // that include NaN, infinities and negative zero (where `x ≤ 0` dfdx's `0·dy` gives NaN
    // for those and +0 added to the zeroed gradient otherwise).
    let specials = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::MIN_POSITIVE / 2.0,
        -f32::MIN_POSITIVE / 2.0,
        f32::MAX,
        f32::MIN,
    ];
    let sweep = (0..(1u32 << 16)).map(|i| f32::from_bits(i.wrapping_mul(0x8001_7fc3)));
    // Long enough for the parallel passes, with the specials at both ends of the split.
    let mut xs: Vec<f32> = specials.iter().copied().chain(sweep).collect();
    while xs.len() < 2 * RELU_PARALLEL {
        xs.extend_from_within(..xs.len().min(2 * RELU_PARALLEL - xs.len()));
    }
    xs.extend(specials);
    let dy_values = [1.5f32, -0.0, f32::NAN, f32::INFINITY, -2.25, 0.0, 7.0];
    let dys: Vec<f32> = (0..xs.len()).map(|i| dy_values[i % 7]).collect();
    for len in [xs.len(), 1000] {
        let [ours, dfdx] = both(xs[..len].to_vec(), dys[..len].to_vec());
        for i in 0..len {
            assert!(
                same(ours.0[i], dfdx.0[i]),
                "y at {:e}: {:e} {:e}",
                xs[i],
                ours.0[i],
                dfdx.0[i]
            );
            assert!(
                same(ours.1[i], dfdx.1[i]),
                "dx at {:e}, dy {:e}",
                xs[i],
                dys[i]
            );
        }
    }
}

#[test]
fn relu_runs_and_converts_as_dfdx_relu() {
    let dev = Cpu::default();
    let ours = dev.build_module::<(Linear<4, 8>, Relu, Linear<8, 3>), f32>();
    let theirs: (
        modules::Linear<4, 8, f32, Cpu>,
        ReLU,
        modules::Linear<8, 3, f32, Cpu>,
    ) = (ours.0.clone(), ReLU, ours.2.clone());
    let x: Tensor<Rank2<5, 4>, f32, _> = dev.sample_normal();
    assert_eq!(
        ours.forward(x.clone()).as_vec(),
        theirs.forward(x.clone()).as_vec()
    );
    // Both convert to the same quantized model (the same forward pass) and lower to the
    // same graph op, ONNX's `Relu`.
    let (q_ours, q_theirs) = (ours.convert(), theirs.convert());
    assert_eq!(
        q_ours.forward(x.clone()).as_vec(),
        q_theirs.forward(x).as_vec()
    );
    assert_eq!(Relu.graph_op(), Ok(Some(Op::Relu)));
    assert_eq!(Relu.graph_op(), ReLU.graph_op());
}
