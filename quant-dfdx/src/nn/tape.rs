//! Recording a hand-written backward pass for an op whose output shape differs from its
//! input's.
//!
//! `quant_core::dfdx_ops::custom_op` covers elementwise ops (output shaped like the input, plus
//! parameter gradients); convolution, pooling and flattening change the shape, so they use
//! this helper, which follows the same protocol: the output gradient is taken out of its slot
//! (so input gradients can be borrowed mutably at the same time), the op adds (never writes)
//! into its inputs' gradients, and the output gradient is put back (or freed, under
//! `quant_core::dfdx_ops::release_used_gradients`).

use dfdx::prelude::*;
use dfdx::tensor::{CpuError, Gradients};
use quant_core::dfdx_ops::TensorValues;

/// Adds `dx` into a gradient buffer (`grads.get_or_alloc_mut(&ghost)?`; dfdx keeps the
/// ghost-tensor type private, so the caller looks the slot up).
pub(crate) fn accumulate(slot: &mut [f32], dx: &[f32]) -> Result<(), CpuError> {
    if slot.len() != dx.len() {
        return Err(CpuError::WrongNumElements);
    }
    quant_core::kernels::passes::add_into(slot, dx);
    Ok(())
}

/// Records `backward` on `tape` when it is an `OwnedTape` (a `NoneTape` drops it unrun).
/// `backward` receives the output gradient (laid out like `out`, which is contiguous) and the
/// gradients, into which it adds its inputs' gradients.
pub(crate) fn record<S: Shape, T: Tape<f32, Cpu>, F>(
    out: &Tensor<S, f32, Cpu>,
    tape: &mut T,
    backward: F,
) where
    F: 'static + FnOnce(&[f32], &mut Gradients<f32, Cpu>) -> Result<(), CpuError>,
{
    if !T::OWNS_TAPE {
        return;
    }
    let out_ghost = out.ghost();
    tape.add_backward_op(move |grads| {
        let dy: Vec<f32> = std::mem::take(&mut **grads.get_or_alloc_mut(&out_ghost)?);
        let result = backward(&dy, grads);
        if quant_core::dfdx_ops::keep_used_gradients() {
            **grads.get_or_alloc_mut(&out_ghost)? = dy;
        }
        result
    });
}

/// The values of a contiguous tensor, in order, read in place ([`TensorValues`]: no copy; a
/// backward pass that keeps them keeps the tensor's storage, as dfdx's own ops do).
///
/// dfdx's `as_vec` walks a strided index per element (slow) and panics on an empty tensor, so
/// the ops read their (contiguous, by `try_contiguous`) inputs with this instead.
pub(crate) fn read<S: Shape, T>(t: &Tensor<S, f32, Cpu, T>) -> TensorValues<S> {
    TensorValues::of(t)
}
