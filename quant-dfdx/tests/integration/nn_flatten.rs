//! `flatten` and `Flatten`: order, gradient, non-contiguous input, size mismatch.

use dfdx::prelude::*;
use dfdx::tensor::{CpuError, Gradients};
use quant_core::QuantError;
use quant_dfdx::nn::{flatten, Flatten};

#[test]
fn flattens_row_major_and_passes_the_gradient_through() {
    let dev = Cpu::seed_from_u64(21);
    let x = dev.sample_normal_like(&(3usize, Const::<2>, 3usize, 4usize));
    let y = flatten::<24, _>(x.trace(Gradients::leaky())).unwrap();
    assert_eq!(*y.shape(), (3, Const::<24>));
    assert_eq!(y.as_vec(), x.as_vec());
    let r = dev.sample_normal_like(y.shape());
    let grads = (y * r.clone()).sum().backward();
    assert_eq!(grads.get(&x).as_vec(), r.as_vec());
}

#[test]
fn non_contiguous_input_is_flattened_in_logical_order() {
    let dev = Cpu::seed_from_u64(22);
    let base: Tensor<Rank4<2, 3, 2, 4>, f32, _> = dev.sample_normal();
    // (batch, height, channels, width) viewed as (batch, channels, height, width).
    let view = base
        .trace(Gradients::leaky())
        .permute::<Rank4<2, 2, 3, 4>, Axes4<0, 2, 1, 3>>();
    let y: Tensor<(Const<2>, Const<24>), f32, Cpu, _> = flatten(view).unwrap();
    let expected = base
        .clone()
        .permute::<Rank4<2, 2, 3, 4>, Axes4<0, 2, 1, 3>>()
        .contiguous();
    assert_eq!(y.as_vec(), expected.as_vec());
    let grads = y.sum().backward();
    assert_eq!(grads.get(&base).as_vec(), vec![1.0; 48]);
}

#[test]
fn size_mismatch_is_a_typed_error() {
    let dev = Cpu::default();
    let x = dev.zeros_like(&(2usize, Const::<8>, 4usize, 4usize));
    let err = flatten::<100, _>(x.clone()).unwrap_err();
    assert!(
        matches!(
            err,
            QuantError::LengthMismatch {
                expected: 100,
                actual: 128,
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("channels 8 * height 4 * width 4") && msg.contains("expected 100, got 128"),
        "{msg}"
    );

    assert!(matches!(
        Flatten::<100>.try_forward(x.clone()),
        Err(CpuError::WrongNumElements)
    ));
    let y = Flatten::<128>.forward(x);
    assert_eq!(*y.shape(), (2, Const::<128>));
}
