use quant_core::__internals::ScratchPool;
use quant_core::scratch::Scratch;

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

/// An op's output takes a used gradient given back to the pool (the same storage: no fresh
/// zeroed allocation), but never a buffer more than twice its length (a small tensor must
/// not keep a large buffer alive).
#[test]
fn outputs_take_recycled_buffers_of_up_to_twice_their_length() {
    let gradient = vec![0.5f32; 1000];
    let storage = gradient.as_ptr();
    Scratch::recycle(gradient);
    let output = Scratch::output(1000);
    assert_eq!(output.len(), 1000);
    assert_eq!(output.as_ptr(), storage, "not the recycled buffer");

    let large = vec![0.5f32; 5000];
    let storage = large.as_ptr();
    Scratch::recycle(large);
    let small = Scratch::output(1000);
    assert_eq!(small.len(), 1000);
    assert_ne!(
        small.as_ptr(),
        storage,
        "a buffer five times the length taken"
    );
    let half = Scratch::output(2500);
    assert_eq!(half.len(), 2500);
    assert_eq!(half.as_ptr(), storage, "a buffer twice the length refused");
}

/// Under debug assertions (the tests' build) a pooled buffer comes filled with NaN, so that
/// an op that reads its output before writing it fails its tests instead of reading zeros.
#[test]
fn pooled_buffers_are_nan_under_debug_assertions() {
    Scratch::recycle(vec![0.0f32; 64]);
    let output = Scratch::output(64);
    let scratch = Scratch::with_len(64);
    if cfg!(debug_assertions) {
        assert!(output.iter().chain(scratch.iter()).all(|v| v.is_nan()));
    }
}

/// Training steps whose ops' outputs live in the buffers of earlier steps' gradients (under
/// `release_used_gradients`) give the bits of steps that allocate afresh: outputs and
/// gradients, over steps with different inputs.
#[test]
fn recycled_buffers_change_no_bits_over_steps() {
    use dfdx::prelude::*;
    use quant_core::{dfdx_ops, IntegerGrid, RoundingPolicy};
    let dev = Cpu::default();
    let scale: Tensor<Rank1<1>, f32, Cpu> = dev.tensor([0.25]);
    let grid = IntegerGrid::new(4, true, false).unwrap();
    let step = |offset: f32| {
        let values: Vec<f32> = (0..4096)
            .map(|i| (i as f32 * 0.37 + offset).sin() * 3.0)
            .collect();
        let x: Tensor<Rank1<4096>, f32, Cpu> = dev.tensor(values);
        let x = x.trace(scale.alloc_grads());
        let y = dfdx_ops::lsq(x, &scale, None, None, grid, RoundingPolicy::HalfEven, None).unwrap();
        let z = dfdx_ops::lsq(
            y * 1.5,
            &scale,
            None,
            None,
            grid,
            RoundingPolicy::HalfEven,
            None,
        )
        .unwrap();
        let out = z.retaped::<NoneTape>().as_vec();
        let grads = (z * 2.0).sum().backward();
        (out, grads.get(&scale).array())
    };
    let kept: Vec<_> = (0..3).map(|k| step(k as f32)).collect();
    let _released = dfdx_ops::release_used_gradients();
    for (k, want) in kept.iter().enumerate() {
        let got = step(k as f32);
        assert_eq!(got.0, want.0, "step {k}: outputs");
        assert_eq!(
            got.1[0].to_bits(),
            want.1[0].to_bits(),
            "step {k}: scale gradient"
        );
    }
}

/// The scratch pool hands out the smallest capacity within the bounds asked for, of those the
/// buffer given back last (the likeliest still in cache), and keeps its count and bytes as
/// buffers come and go.
#[test]
fn the_pool_gives_the_smallest_fitting_buffer_the_last_one_back_first() {
    let mut pool = ScratchPool::new(16, 1 << 20);
    let (a, b, c) = (vec![0f32; 100], vec![1f32; 100], vec![2f32; 300]);
    let second = b.as_ptr();
    for buf in [c, a, b] {
        pool.give(buf);
    }
    assert_eq!((pool.buffers(), pool.bytes()), (3, 2000));
    assert_eq!(pool.take(150, 200), None, "nothing in 150..=200");
    assert_eq!(pool.take(200, 150), None, "an empty range");
    let got = pool.take(50, 1000).unwrap();
    assert_eq!(got.as_ptr(), second, "not the 100 given back last");
    assert_eq!(pool.take(101, usize::MAX).unwrap().capacity(), 300);
    assert_eq!((pool.buffers(), pool.bytes()), (1, 400));
    assert_eq!(pool.capacities(), [100]);
}

/// Over either limit the smallest buffers go first, the count and bytes stay within the
/// limits, and the entries of sizes that came and went do not pile up.
#[test]
fn the_pool_lets_the_smallest_buffers_go_over_its_limits() {
    let mut pool = ScratchPool::new(8, 4000);
    for len in 1..=12 {
        pool.give(Vec::with_capacity(len));
    }
    assert_eq!(pool.buffers(), 8);
    assert_eq!(
        pool.capacities(),
        (5..=12).collect::<Vec<_>>(),
        "not the smallest four gone"
    );
    pool.give(Vec::with_capacity(600));
    pool.give(Vec::with_capacity(601));
    assert!(pool.bytes() <= 4000);
    assert_eq!(pool.bytes(), pool.capacities().iter().sum::<usize>() * 4);
    assert_eq!(pool.capacities(), [601], "the larger one kept");
    assert!(pool.entries() <= 9, "{} entries", pool.entries());
}
