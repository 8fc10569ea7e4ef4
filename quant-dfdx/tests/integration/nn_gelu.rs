//! `quant_dfdx::nn::Gelu`: dfdx's `AccurateGeLU` bit for bit.

use crate::common::same;
use dfdx::prelude::*;
use quant_dfdx::nn::gelu;

#[test]
fn forward_and_backward_are_dfdx_accurate_gelus_bit_for_bit() {
    let dev = Cpu::default();
    // Every range of erf (boundaries at |x|/√2 = 0.84375, 1.25, 2.857, 6), tiny values,
    // zeros, large values: a sweep of bit patterns.
    let mut xs: Vec<f32> = (0..(1u32 << 17))
        .map(|i| f32::from_bits(i.wrapping_mul(0x8001_7fc3) >> 1 | (i & 1) << 31))
        .filter(|x| x.is_finite() && x.abs() < 1e4)
        .collect();
    xs.extend([
        0.0, -0.0, 1.19, -1.19, 1.77, -1.77, 4.04, -4.04, 8.49, -8.49,
    ]);
    let n = xs.len();
    let x = dev.tensor_from_vec(xs, (n,));
    let w = dev.tensor_from_vec(
        (0..n).map(|i| ((i % 17) as f32 - 8.0) * 0.37).collect(),
        (n,),
    );
    let run = |ours: bool| {
        let traced = x.clone().leaky_traced();
        let y = if ours {
            gelu(traced).unwrap()
        } else {
            traced.accurate_gelu()
        };
        let values = y.retaped::<NoneTape>().as_vec();
        let grads = (y * w.clone()).sum().backward();
        (values, grads.get(&x).as_vec())
    };
    let (ours, dfdx) = (run(true), run(false));
    for i in 0..n {
        assert!(same(ours.0[i], dfdx.0[i]), "y at {:e}", x.as_vec()[i]);
        assert!(same(ours.1[i], dfdx.1[i]), "dx at {:e}", x.as_vec()[i]);
    }
}
