//! Quantizing the weights of a user's own layer inside its forward pass.
//!
//! A user's layer reads its weight fields in its own dfdx `Module` impl (`self.w.retaped::<T>()`),
//! so the quantized wrapper cannot hand it a quantized weight as an argument. Instead it
//! quantizes each weight *before* the forward pass, records the quantizer's backward on the
//! input's tape, and lends the layer a copy of itself whose weight fields hold the tape-less
//! quantized tensors. When the layer's ops use such a tensor, their backward writes its gradient
//! under the quantized tensor's id; the quantizer's op, recorded earlier and therefore run later
//! by dfdx's reverse-time backward, turns that gradient into the original weight's gradient
//! (straight-through or LSQ) and the quantizer's own parameter gradients.
//!
//! [`fake_quantize_param`] is the building block; `#[derive(QuantizedLayer)]` calls it for every
//! `#[quantized(weights)]` field. [`LayerInput`] says which inputs such a layer accepts.

use dfdx::prelude::*;

use quant_core::Result;

use super::{FakeQuantizer, QuantizerMode};

/// The fake-quantized `param`, without a tape, with the quantizer's backward merged into
/// `*tape` (the tape of the input the forward pass runs on).
///
/// Use the returned tensor in place of `param` in the forward pass (`w.retaped::<T>()`): the
/// gradient reaching it flows on to `param` (straight-through, per the quantizer) and to the
/// quantizer's trainable parameters. A disabled (or unconfigured) quantizer returns `param`
/// itself, so the layer computes exactly the float result.
///
/// ```
/// use dfdx::prelude::*;
/// use quant_dfdx::layers::{fake_quantize_param, TensorQuantizer};
///
/// let dev = Cpu::default();
/// let w: Tensor<Rank1<3>, f32, _> = dev.tensor([0.5, -1.0, 2.0]);
/// let x: Tensor<Rank1<3>, f32, _> = dev.tensor([1.0, 1.0, 1.0]);
/// let quantizer = TensorQuantizer::<1>::new(&dev); // unconfigured: pass-through
///
/// let (x, mut tape) = x.trace(w.alloc_grads()).split_tape();
/// let wq = fake_quantize_param(&mut tape, &w, &quantizer)?;
/// // In a forward pass generic over the tape `T`: `wq.retaped::<T>()`.
/// let y = (x.put_tape(tape) * wq.retaped::<OwnedTape<f32, Cpu>>()).sum();
/// let grads = y.backward();
/// assert_eq!(grads.get(&w).array(), [1.0, 1.0, 1.0]);
/// # Ok::<(), quant_core::QuantError>(())
/// ```
///
/// # Errors
/// The quantizer's errors: Calibrating mode (observing needs [`fake_quantize_param_mut`]),
/// uninitialised parameters, a channel count along axis 0 other than the quantizer's.
pub fn fake_quantize_param<S: Shape, T: Tape<f32, Cpu>>(
    tape: &mut T,
    param: &Tensor<S, f32, Cpu>,
    quantizer: &impl FakeQuantizer,
) -> Result<Tensor<S, f32, Cpu>> {
    if quantizer.mode() == QuantizerMode::Disabled {
        return Ok(param.clone());
    }
    let quantized = quantizer.fake_quantize(param.retaped::<T>())?;
    Ok(merge_into(tape, quantized))
}

/// Like [`fake_quantize_param`], for `forward_mut`: a Calibrating quantizer observes `param` (weights
/// calibrate from themselves) and passes it through.
///
/// # Errors
/// See [`fake_quantize_param`]; Calibrating mode is not an error here.
pub fn fake_quantize_param_mut<S: Shape, T: Tape<f32, Cpu>>(
    tape: &mut T,
    param: &Tensor<S, f32, Cpu>,
    quantizer: &mut impl FakeQuantizer,
) -> Result<Tensor<S, f32, Cpu>> {
    if quantizer.mode() == QuantizerMode::Disabled {
        return Ok(param.clone());
    }
    let quantized = quantizer.fake_quantize_mut(param.retaped::<T>())?;
    Ok(merge_into(tape, quantized))
}

/// Moves `t`'s tape into `*tape` and returns `t` without one.
fn merge_into<S: Shape, T: Tape<f32, Cpu>>(
    tape: &mut T,
    t: Tensor<S, f32, Cpu, T>,
) -> Tensor<S, f32, Cpu> {
    let (t, recorded) = t.split_tape();
    *tape = std::mem::take(tape).merge(recorded);
    t
}

/// An input a quantized user layer (`#[derive(QuantizedLayer)]`) accepts: an `f32` CPU tensor
/// with any shape and tape, or a tuple of such inputs (`(x, mask)`).
///
/// The layer records its weight quantizers' backward on the input's tape (a tuple's first
/// element's), and its input quantizer, when it has one, quantizes every tensor of the input
/// with one set of parameters.
pub trait LayerInput: Sized {
    /// The tape the layer's weight quantizers record on.
    type Tape: Tape<f32, Cpu>;

    /// Runs `f` on the input's tape and returns the input with the tape back in place, and `f`'s
    /// result.
    ///
    /// # Errors
    /// `f`'s error.
    fn try_with_tape<R>(self, f: impl FnOnce(&mut Self::Tape) -> Result<R>) -> Result<(Self, R)>;

    /// Fake-quantizes every tensor of the input with `q`.
    ///
    /// # Errors
    /// The quantizer's errors.
    fn fake_quantize_input(self, q: &impl FakeQuantizer) -> Result<Self>;

    /// Like [`fake_quantize_input`](Self::fake_quantize_input), but a Calibrating quantizer observes.
    ///
    /// # Errors
    /// The quantizer's errors.
    fn fake_quantize_input_mut(self, q: &mut impl FakeQuantizer) -> Result<Self>;
}

impl<S: Shape, T: Tape<f32, Cpu>> LayerInput for Tensor<S, f32, Cpu, T> {
    type Tape = T;

    fn try_with_tape<R>(self, f: impl FnOnce(&mut T) -> Result<R>) -> Result<(Self, R)> {
        let (x, mut tape) = self.split_tape();
        let r = f(&mut tape)?;
        Ok((x.put_tape(tape), r))
    }

    fn fake_quantize_input(self, q: &impl FakeQuantizer) -> Result<Self> {
        q.fake_quantize(self)
    }

    fn fake_quantize_input_mut(self, q: &mut impl FakeQuantizer) -> Result<Self> {
        q.fake_quantize_mut(self)
    }
}

macro_rules! tuple_layer_input {
    ($first:ident $($rest:ident)*) => {
        #[allow(non_snake_case)]
        impl<$first: LayerInput, $($rest: LayerInput),*> LayerInput for ($first, $($rest,)*) {
            type Tape = $first::Tape;

            fn try_with_tape<R>(
                self,
                f: impl FnOnce(&mut Self::Tape) -> Result<R>,
            ) -> Result<(Self, R)> {
                let ($first, $($rest,)*) = self;
                let ($first, r) = $first.try_with_tape(f)?;
                Ok((($first, $($rest,)*), r))
            }

            fn fake_quantize_input(self, q: &impl FakeQuantizer) -> Result<Self> {
                let ($first, $($rest,)*) = self;
                Ok(($first.fake_quantize_input(q)?, $($rest.fake_quantize_input(q)?,)*))
            }

            fn fake_quantize_input_mut(self, q: &mut impl FakeQuantizer) -> Result<Self> {
                let ($first, $($rest,)*) = self;
                Ok(($first.fake_quantize_input_mut(q)?, $($rest.fake_quantize_input_mut(q)?,)*))
            }
        }
    };
}
tuple_layer_input!(A);
tuple_layer_input!(A B);
tuple_layer_input!(A B C);
tuple_layer_input!(A B C D);
