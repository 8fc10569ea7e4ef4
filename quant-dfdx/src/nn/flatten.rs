//! Flattening image batches into feature vectors: the [`flatten`] op and the zero-sized
//! [`Flatten`] module.

use dfdx::nn::ZeroSizedModule;
use dfdx::prelude::*;
use dfdx::tensor::CpuError;
use quant_core::{QuantError, Result};

use super::Features;

/// A batch of images `(batch, channels, height, width)` of `f32` on the CPU, with any
/// dimension types and any tape: what [`flatten`] accepts. Sealed; implemented for 4-D
/// tensors only.
pub trait ImageBatch: sealed::Sealed + Sized {
    /// The batch dimension, kept by [`flatten`].
    type Batch: Dim;
    /// The tape, kept by [`flatten`].
    type Tape: Tape<f32, Cpu>;

    /// [`flatten`] itself; call that instead.
    #[doc(hidden)]
    fn flatten_to<const N: usize>(self) -> Result<Features<Self::Batch, N, Self::Tape>>;
}

mod sealed {
    pub trait Sealed {}
    impl<S: dfdx::shapes::Shape, T> Sealed for dfdx::tensor::Tensor<S, f32, dfdx::tensor::Cpu, T> {}
}

impl<B: Dim, C: Dim, H: Dim, W: Dim, T: Tape<f32, Cpu>> ImageBatch
    for Tensor<(B, C, H, W), f32, Cpu, T>
{
    type Batch = B;
    type Tape = T;

    fn flatten_to<const N: usize>(self) -> Result<Features<B, N, T>> {
        let (batch, c, h, w) = *self.shape();
        let features = c
            .size()
            .checked_mul(h.size())
            .and_then(|v| v.checked_mul(w.size()));
        if features != Some(N) {
            return Err(QuantError::LengthMismatch {
                what: format!(
                    "flatten: features per image (channels {} * height {} * width {}) against the output width N",
                    c.size(),
                    h.size(),
                    w.size()
                ),
                expected: N,
                actual: features.unwrap_or(usize::MAX),
            });
        }
        Ok(self.try_reshape_like(&(batch, Const::<N>))?)
    }
}

/// Flattens `(batch, C, h, w)` into `(batch, N)`, row-major (channel, then row, then column),
/// as PyTorch's `x.flatten(1)`. `N` is a type-level constant so the next layer (a
/// `Linear<N, _>`) type-checks; whether it matches the run-time image size is checked here.
/// Call it as `flatten::<N, _>(x)`, or let `N` be inferred from the result's type.
///
/// A contiguous input is reshaped without copying; a non-contiguous one is copied (dfdx's
/// reshape, differentiable either way).
///
/// # Errors
///
/// [`QuantError::LengthMismatch`] when `C * h * w != N`.
///
/// ```
/// use dfdx::prelude::*;
/// use quant_dfdx::nn::flatten;
///
/// let dev = Cpu::default();
/// let x: Tensor<Rank4<2, 8, 4, 4>, f32, _> = dev.zeros();
/// let y = flatten::<128, _>(x.clone())?;
/// assert_eq!(*y.shape(), (Const::<2>, Const::<128>));
/// let err = flatten::<100, _>(x).unwrap_err();
/// assert!(err.to_string().contains("expected 100, got 128"));
/// # Ok::<(), quant_core::QuantError>(())
/// ```
pub fn flatten<const N: usize, X: ImageBatch>(x: X) -> Result<Features<X::Batch, N, X::Tape>> {
    x.flatten_to::<N>()
}

/// Flattens `(batch, C, h, w)` into `(batch, N)`: the layer form of [`flatten`], for the
/// place between convolutions and `Linear<N, _>`.
///
/// Its `Error` is [`CpuError`], like dfdx's layers, so it composes in tuples with them; when
/// `C * h * w != N` it is `CpuError::WrongNumElements` (call [`flatten`] for a message that
/// gives both sizes).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Flatten<const N: usize>;

impl<const N: usize> ZeroSizedModule for Flatten<N> {}
impl<const N: usize> NonMutableModule for Flatten<N> {}

impl<const N: usize, B: Dim, C: Dim, H: Dim, W: Dim, T: Tape<f32, Cpu>>
    Module<Tensor<(B, C, H, W), f32, Cpu, T>> for Flatten<N>
{
    type Output = Features<B, N, T>;
    type Error = CpuError;

    fn try_forward(
        &self,
        x: Tensor<(B, C, H, W), f32, Cpu, T>,
    ) -> std::result::Result<Self::Output, CpuError> {
        x.flatten_to::<N>().map_err(super::to_cpu_error)
    }
}
