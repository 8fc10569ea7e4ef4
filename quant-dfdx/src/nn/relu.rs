//! ReLU with the numbers of dfdx's `ReLU`, on every thread: the layer and its op. The kernels
//! are `quant_core::kernels::relu_forward_into` and `relu_backward_into`.

use dfdx::prelude::*;
use quant_core::dfdx_ops::elementwise_op;
use quant_core::kernels::{relu_backward_into, relu_forward_into};

/// ReLU, `max(x, 0)`: dfdx's `ReLU` bit for bit, forward and backward, with both passes split
/// across rayon's threads for large tensors (dfdx's run on one). A drop-in for it: zero-sized,
/// no parameters, its own builder; it converts, quantizes and exports as the same layer (it
/// stays float, and exports as ONNX `Relu`).
///
/// ```
/// use dfdx::prelude::*;
/// use quant_dfdx::nn::Relu;
///
/// let dev = Cpu::default();
/// let x = dev.tensor([-3.0f32, -0.5, 0.0, 0.5, 3.0]);
/// let ours = Relu.forward(x.clone());
/// let dfdx = ReLU.forward(x);
/// assert_eq!(ours.as_vec(), dfdx.as_vec());
/// ```
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Relu;

elementwise_layer!(Relu, relu);

/// The [`Relu`] layer's op, on any shape: records its backward pass on an `OwnedTape`.
///
/// # Errors
/// Only the device's (allocation).
pub fn relu<S: Shape, T: Tape<f32, Cpu>>(
    x: Tensor<S, f32, Cpu, T>,
) -> quant_core::Result<Tensor<S, f32, Cpu, T>> {
    elementwise_op(
        x,
        relu_forward_into,
        |(), x, dy, dx| relu_backward_into(x, dy, dx),
        // The slices are the op's own, of one length: the checks cannot fail here.
        |checked, _| checked.map_err(super::to_cpu_error),
    )
}
