use quant_core::dfdx_ops::Scratch;

/// A pooled buffer serves a shorter value and then a longer one again: each use sees
/// exactly the length it asked for, and the storage is the same one (the reason for the
/// pool: no fresh allocation, so no fresh pages, from step to step).
#[test]
fn scratch_buffers_are_reused_at_the_length_asked_for() {
    let first = {
        let mut a = Scratch::with_len(1000);
        a.fill(1.5);
        a.as_ptr()
    };
    for len in [10, 1000, 0, 999, 1000] {
        let mut b = Scratch::with_len(len);
        assert_eq!(b.len(), len);
        if len > 0 {
            assert_eq!(b.as_ptr(), first, "length {len}: not the pooled buffer");
        }
        b.fill(len as f32);
        assert!(b.iter().all(|v| *v == len as f32));
    }
}

/// A row-major tensor's values are read where they lie (the first value's own address, no
/// copy), and equal dfdx's copy of them: after `try_contiguous`, after a reshape, with axes of
/// length one, and empty.
#[test]
fn row_major_tensors_are_read_in_place() {
    use dfdx::prelude::*;
    use quant_core::dfdx_ops::{in_place, TensorValues};
    let dev = Cpu::default();
    let values: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
    let t: Tensor<Rank3<2, 3, 4>, f32, Cpu> = dev.tensor(values.clone());
    let seen = in_place(&t).expect("a fresh tensor is row-major");
    assert_eq!(seen, values.as_slice());
    assert_eq!(
        seen.as_ptr(),
        &t[[0, 0, 0]] as *const f32,
        "copied, not read in place"
    );
    assert_eq!(&*TensorValues::of(&t), values.as_slice());

    let reshaped: Tensor<Rank2<6, 4>, f32, Cpu> = t.clone().reshape();
    assert_eq!(in_place(&reshaped), Some(values.as_slice()));
    // An axis of length one may have any stride: the values still lie in a row.
    let row: Tensor<Rank2<1, 4>, f32, Cpu> = dev.tensor([1.0, 2.0, 3.0, 4.0]).broadcast();
    assert_eq!(in_place(&row), Some([1.0, 2.0, 3.0, 4.0].as_slice()));
    let traced = Trace::<f32, Cpu>::leaky_traced(t.clone());
    assert_eq!(in_place(&traced), Some(values.as_slice()));
    let empty: Tensor<Rank2<0, 3>, f32, Cpu> = dev.zeros();
    assert_eq!(in_place(&empty), Some([].as_slice()));
    assert!(TensorValues::of(&empty).is_empty());
}

/// Broadcast and permuted views are not row-major: `in_place` refuses them (the permuted one
/// spans exactly its number of values, so only the per-axis check catches it), and
/// `TensorValues` gives their values in row-major order all the same.
#[test]
fn views_that_are_not_row_major_are_copied_in_order() {
    use dfdx::prelude::*;
    use quant_core::dfdx_ops::{in_place, TensorValues};
    let dev = Cpu::default();
    let t: Tensor<Rank2<2, 3>, f32, Cpu> = dev.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]);
    let permuted: Tensor<Rank2<3, 2>, f32, Cpu> = t.clone().permute();
    assert_eq!(in_place(&permuted), None);
    assert_eq!(
        &*TensorValues::of(&permuted),
        [1.0, 4.0, 2.0, 5.0, 3.0, 6.0].as_slice()
    );
    let broadcast: Tensor<Rank2<2, 3>, f32, Cpu> = dev.tensor([7.0, 8.0, 9.0]).broadcast();
    assert_eq!(in_place(&broadcast), None);
    assert_eq!(
        &*TensorValues::of(&broadcast),
        [7.0, 8.0, 9.0, 7.0, 8.0, 9.0].as_slice()
    );
    let permuted_traced = Trace::<f32, Cpu>::leaky_traced(permuted);
    assert_eq!(in_place(&permuted_traced), None);
}

/// Values held for a backward pass share the tensor's storage; a write through another
/// tensor of that storage (dfdx's `IndexMut`, as an optimizer's update writes parameters)
/// copies it first, so what was held does not change.
#[test]
fn held_values_do_not_change_when_the_tensor_is_written_after() {
    use dfdx::prelude::*;
    use quant_core::dfdx_ops::TensorValues;
    let dev = Cpu::default();
    let mut weights: Tensor<Rank2<2, 2>, f32, Cpu> = dev.tensor([[1.0, 2.0], [3.0, 4.0]]);
    let held = TensorValues::of(&weights);
    weights[[0, 1]] = 20.0;
    assert_eq!(&*held, [1.0, 2.0, 3.0, 4.0].as_slice());
    assert_eq!(weights.array(), [[1.0, 20.0], [3.0, 4.0]]);
}
