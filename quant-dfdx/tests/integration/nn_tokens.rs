//! `ImageTokens` and `MeanTokens`: each position's channels plus its embedding, gradients to the input and the positions, the mean over the sequence.

use dfdx::prelude::*;
use dfdx::tensor::{CpuError, Gradients};
use quant_dfdx::nn::builders as builder;
use quant_dfdx::nn::MeanTokens;

#[test]
fn tokens_hold_each_position_s_channels_plus_its_embedding() {
    let dev = Cpu::seed_from_u64(1);
    let layer = dev.build_module::<builder::ImageTokens<3, 4>, f32>();
    let x: Tensor<Rank4<2, 3, 2, 2>, f32, Cpu> = dev.sample_normal();
    let y = layer
        .try_forward(
            x.clone()
                .reshape_like(&(2usize, Const::<3>, 2usize, 2usize)),
        )
        .unwrap();
    let (xs, ys, pos) = (x.as_vec(), y.as_vec(), layer.position.as_vec());
    assert!(pos.iter().all(|p| p.abs() <= 0.02) && pos.iter().any(|p| *p != 0.0));
    for b in 0..2 {
        for n in 0..4 {
            for c in 0..3 {
                let expected = xs[(b * 3 + c) * 4 + n] + pos[n * 3 + c];
                assert_eq!(ys[(b * 4 + n) * 3 + c], expected, "b{b} n{n} c{c}");
            }
        }
    }
}

#[test]
fn a_map_of_another_size_is_a_shape_error() {
    let dev = Cpu::default();
    let layer = dev.build_module::<builder::ImageTokens<3, 4>, f32>();
    let x = dev.zeros_like(&(1usize, Const::<3>, 3usize, 2usize));
    assert!(matches!(
        layer.try_forward(x),
        Err(CpuError::WrongNumElements)
    ));
}

#[test]
fn gradients_reach_the_input_and_the_positions() {
    let dev = Cpu::seed_from_u64(2);
    let layer = dev.build_module::<builder::ImageTokens<2, 4>, f32>();
    let x: Tensor<Rank4<3, 2, 2, 2>, f32, Cpu> = dev.sample_normal();
    let x = x.reshape_like(&(3usize, Const::<2>, 2usize, 2usize));
    // Loss: sum of token (n, c) times weight n·2 + c + 1, so each gradient is known.
    let weights: Vec<f32> = (0..8).map(|i| i as f32 + 1.0).collect();
    let w = dev
        .tensor_from_vec(weights.clone(), (Const::<4>, Const::<2>))
        .broadcast_like(&(3usize, Const::<4>, Const::<2>));
    // Leaky: keep the input's gradient too, not only the parameters'.
    let y = layer.try_forward(x.trace(Gradients::leaky())).unwrap();
    let grads = (y * w).sum().backward();
    let dpos = grads.get(&layer.position).as_vec();
    let dx = grads.get(&x).as_vec();
    for n in 0..4 {
        for c in 0..2 {
            assert_eq!(dpos[n * 2 + c], 3.0 * weights[n * 2 + c]);
            for b in 0..3 {
                assert_eq!(dx[(b * 2 + c) * 4 + n], weights[n * 2 + c]);
            }
        }
    }
}

#[test]
fn mean_tokens_averages_over_the_sequence() {
    let dev = Cpu::default();
    let x = dev.tensor_from_vec(
        (0..12).map(|i| i as f32).collect(),
        (2usize, Const::<3>, Const::<2>),
    );
    let y = MeanTokens.try_forward(x).unwrap().as_vec();
    assert_eq!(y, [2.0, 3.0, 8.0, 9.0]);
}
