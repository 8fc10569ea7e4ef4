//! Trainable quantizers: the trait a quantizer implements (MCT's trainable quantizer, in Rust
//! terms), the per-target constructor traits that `#[mark_quantizer]` checks, and the views
//! through which a quantizer reads its input and its learnable parameters.

use std::fmt;

use crate::config::{ActivationQuantizerConfig, QuantizerConfig, WeightsQuantizerConfig};
use crate::error::{QuantError, Result};
use crate::grid::{IntegerGrid, QParams};
use crate::inferable::InferableQuantizer;

/// How many parameters a quantizer chosen at run time can keep in a layer's parameter slots.
/// A quantizer fixed at compile time (a type parameter of the layer) owns its own tensors and
/// has no such limit.
pub const MAX_PARAMETERS: usize = 4;

/// Where the elements of a tensor sit relative to its channel axis: the tensor is viewed as
/// `[outer, channels, inner]`, so element `i` belongs to channel `(i / inner) % channels`.
/// Per-tensor quantization uses one channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelLayout {
    /// Product of the dimensions before the channel axis.
    pub outer: usize,
    /// Size of the channel axis (1 per tensor).
    pub channels: usize,
    /// Product of the dimensions after the channel axis.
    pub inner: usize,
    /// The channel axis of the original shape (`None` per tensor).
    pub axis: Option<usize>,
}

impl ChannelLayout {
    /// One channel covering `numel` elements.
    pub const fn per_tensor(numel: usize) -> ChannelLayout {
        ChannelLayout {
            outer: 1,
            channels: 1,
            inner: numel,
            axis: None,
        }
    }

    /// The layout of `shape` around `axis` (`None`: per tensor).
    ///
    /// # Errors
    /// An axis outside the shape, or a shape whose element count overflows `usize`.
    pub fn new(shape: &[usize], axis: Option<usize>) -> Result<ChannelLayout> {
        let prod = |dims: &[usize]| -> Result<usize> {
            dims.iter().try_fold(1usize, |acc, d| {
                acc.checked_mul(*d).ok_or_else(|| QuantError::InvalidValue {
                    what: "shape".into(),
                    value: format!("{shape:?}"),
                    expected: "a shape whose element count fits in usize".into(),
                })
            })
        };
        match axis {
            None => Ok(ChannelLayout::per_tensor(prod(shape)?)),
            Some(axis) if axis >= shape.len() => Err(QuantError::InvalidAxis {
                axis,
                rank: shape.len(),
            }),
            Some(axis) => {
                let outer = prod(&shape[..axis])?;
                let inner = prod(&shape[axis + 1..])?;
                // Validate the total too.
                prod(shape)?;
                Ok(ChannelLayout {
                    outer,
                    channels: shape[axis],
                    inner,
                    axis: Some(axis),
                })
            }
        }
    }

    /// Total number of elements. The fields are public, so a layout built by hand may claim
    /// more than `usize` holds: the product saturates at `usize::MAX`, which no slice's length
    /// equals, so every length check against it fails instead of wrapping around.
    pub const fn numel(&self) -> usize {
        self.outer
            .saturating_mul(self.channels)
            .saturating_mul(self.inner)
    }

    /// The channel of element `i` (0 for a layout without elements).
    pub const fn channel_of(&self, i: usize) -> usize {
        if self.inner == 0 || self.channels == 0 {
            return 0;
        }
        (i / self.inner) % self.channels
    }
}

/// The tensor a quantizer acts on: its data (contiguous, row-major), its layout around the
/// channel axis, and the integer grid the owner resolved for it.
#[derive(Debug, Clone, Copy)]
pub struct QuantizerInput<'a> {
    /// The values.
    pub data: &'a [f32],
    /// Layout around the channel axis (one channel when per tensor).
    pub layout: ChannelLayout,
    /// The grid to quantize onto.
    pub grid: IntegerGrid,
}

impl<'a> QuantizerInput<'a> {
    /// Checks that `data` has as many elements as `layout` says.
    pub fn new(data: &'a [f32], layout: ChannelLayout, grid: IntegerGrid) -> Result<Self> {
        if data.len() != layout.numel() {
            return Err(QuantError::LengthMismatch {
                what: "quantizer input".into(),
                expected: layout.numel(),
                actual: data.len(),
            });
        }
        Ok(QuantizerInput { data, layout, grid })
    }

    /// Per-channel (or, with one channel, per-tensor) minimum and maximum of the finite values;
    /// channels without finite values get `(0, 0)`.
    pub fn channel_ranges(&self) -> (Vec<f32>, Vec<f32>) {
        let l = self.layout;
        let mut mins = vec![f32::INFINITY; l.channels];
        let mut maxs = vec![f32::NEG_INFINITY; l.channels];
        for (block, chunk) in self.data.chunks(l.inner.max(1)).enumerate() {
            let c = block % l.channels;
            for v in chunk.iter().filter(|v| v.is_finite()) {
                mins[c] = mins[c].min(*v);
                maxs[c] = maxs[c].max(*v);
            }
        }
        for c in 0..l.channels {
            if mins[c] > maxs[c] {
                mins[c] = 0.0;
                maxs[c] = 0.0;
            }
        }
        (mins, maxs)
    }
}

/// The check both parameter-bank views make: `len` values in rows of `channels`.
fn check_bank(len: usize, channels: usize) -> Result<()> {
    if channels == 0 || !len.is_multiple_of(channels) {
        return Err(QuantError::LengthMismatch {
            what: "parameter bank".into(),
            expected: channels.max(1) * MAX_PARAMETERS,
            actual: len,
        });
    }
    Ok(())
}

/// A read-only view of a quantizer's parameter slots: `slots` rows of `channels` values each.
/// A per-tensor parameter uses the first value of its row.
#[derive(Debug, Clone, Copy)]
pub struct ParamBank<'a> {
    data: &'a [f32],
    channels: usize,
}

impl<'a> ParamBank<'a> {
    /// Views `data` as rows of `channels` values.
    ///
    /// # Errors
    /// `channels == 0` or a length that is not a multiple of `channels`.
    pub fn new(data: &'a [f32], channels: usize) -> Result<Self> {
        check_bank(data.len(), channels)?;
        Ok(ParamBank { data, channels })
    }
    /// Number of values per slot.
    pub fn channels(&self) -> usize {
        self.channels
    }
    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.data.len() / self.channels
    }
    /// The values of slot `k` (one per channel).
    ///
    /// # Panics
    /// If `k >= self.slots()`: a quantizer reads only the slots it declared, which its owner
    /// sized before the first call.
    pub fn slot(&self, k: usize) -> &'a [f32] {
        &self.data[k * self.channels..(k + 1) * self.channels]
    }
    /// The first value of slot `k`, for per-tensor parameters.
    pub fn scalar(&self, k: usize) -> f32 {
        self.slot(k)[0]
    }
    /// Slot `k` as used along `axis`: every channel's value when per channel, the first value
    /// alone when `axis` is `None`.
    pub fn values(&self, k: usize, axis: Option<usize>) -> &'a [f32] {
        let slot = self.slot(k);
        if axis.is_some() {
            slot
        } else {
            &slot[..1]
        }
    }
}

/// A writable view of a quantizer's parameter slots (or of their gradients).
#[derive(Debug)]
pub struct ParamBankMut<'a> {
    data: &'a mut [f32],
    channels: usize,
}

impl<'a> ParamBankMut<'a> {
    /// Views `data` as rows of `channels` values.
    ///
    /// # Errors
    /// `channels == 0` or a length that is not a multiple of `channels`.
    pub fn new(data: &'a mut [f32], channels: usize) -> Result<Self> {
        check_bank(data.len(), channels)?;
        Ok(ParamBankMut { data, channels })
    }
    /// Number of values per slot.
    pub fn channels(&self) -> usize {
        self.channels
    }
    /// The values of slot `k`, writable.
    ///
    /// # Panics
    /// If `k` is not a slot of this bank (see [`ParamBank::slot`]).
    pub fn slot_mut(&mut self, k: usize) -> &mut [f32] {
        &mut self.data[k * self.channels..(k + 1) * self.channels]
    }
    /// Sets every value of slot `k`.
    pub fn fill(&mut self, k: usize, v: f32) {
        self.slot_mut(k).fill(v);
    }
    /// Sets slot `k` from per-channel `values` (one per channel), or fills it with the single
    /// value of per-tensor parameters.
    ///
    /// # Errors
    /// `values` is neither one value nor one per channel.
    pub fn set(&mut self, k: usize, values: &[f32]) -> Result<()> {
        let channels = self.channels;
        match values.len() {
            1 => self.fill(k, values[0]),
            n if n == channels => self.slot_mut(k).copy_from_slice(values),
            n => {
                return Err(QuantError::LengthMismatch {
                    what: "quantization parameters (one per channel)".into(),
                    expected: channels,
                    actual: n,
                })
            }
        }
        Ok(())
    }
    /// A read-only view of the same slots.
    pub fn as_ref(&self) -> ParamBank<'_> {
        ParamBank {
            data: self.data,
            channels: self.channels,
        }
    }
}

/// Declaration of one learnable (or fixed) parameter of a quantizer, in slot order. MCT's
/// `initialize_quantization` registering a parameter with the layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamDecl {
    /// Name, used in reports and in save files (`<layer>.<quantizer>.<name>`).
    pub name: &'static str,
    /// Whether the optimiser updates it. Fixed parameters (e.g. an STE threshold) live in
    /// detached storage so weight decay or momentum never moves them.
    pub trainable: bool,
}

/// A trainable quantizer: fake-quantizes a tensor in the forward pass, propagates gradients
/// to its input and its parameters in the backward pass, and converts to an
/// [`InferableQuantizer`] for deployment.
///
/// The quantizer object holds only configuration; its parameter values live with the layer
/// that owns it (so they train with dfdx optimisers and save with the model) and are passed
/// in as a [`ParamBank`] of the slots it declared in [`parameters`](Self::parameters).
/// Implement [`WeightsQuantizer`] or [`ActivationQuantizer`] too, and mark the struct with
/// `#[mark_quantizer]` to register it.
pub trait TrainableQuantizer: Send + Sync + fmt::Debug + 'static {
    /// The config it was built from.
    fn config(&self) -> &QuantizerConfig;

    /// The parameters it keeps, in slot order (at most [`MAX_PARAMETERS`] when chosen at run
    /// time).
    fn parameters(&self) -> Vec<ParamDecl>;

    /// Sets the parameters from calibrated quantization parameters (an observer's result).
    /// `params` holds every slot; trainable and fixed slots alike.
    fn set_qparams(
        &self,
        qparams: &QParams,
        grid: IntegerGrid,
        params: &mut ParamBankMut<'_>,
    ) -> Result<()>;

    /// The scale(s) and zero point(s) the current parameters quantize with: one per channel
    /// along `axis`, or one (from each slot's first value) when `axis` is `None`.
    fn qparams(
        &self,
        params: &ParamBank<'_>,
        grid: IntegerGrid,
        axis: Option<usize>,
    ) -> Result<QParams>;

    /// Initialises the parameters from data (the weights themselves, or a first batch of
    /// activations). The default takes the per-channel min/max of `x` and calls
    /// [`set_qparams`](Self::set_qparams).
    fn initialize(&self, x: QuantizerInput<'_>, params: &mut ParamBankMut<'_>) -> Result<()> {
        let (mins, maxs) = x.channel_ranges();
        let q = QParams::from_ranges(self.config().method(), x.grid, &mins, &maxs, x.layout.axis)?;
        self.set_qparams(&q, x.grid, params)
    }

    /// Fake-quantizes `x` into `y` (same length), writing every element of `y`: its values
    /// before are unspecified (a reused buffer's). Training and evaluation use the same
    /// numerics; evaluation simply records no backward pass.
    fn forward(&self, x: QuantizerInput<'_>, params: &ParamBank<'_>, y: &mut [f32]) -> Result<()>;

    /// Adds the gradients of the loss with respect to `x` into `dx` and with respect to the
    /// parameters into `dparams`, given `dy`, the gradient with respect to the output.
    ///
    /// Called only after a successful [`forward`](Self::forward) with the same input and
    /// parameters, so it cannot fail. Gradients of fixed (non-trainable) slots are ignored.
    fn backward(
        &self,
        x: QuantizerInput<'_>,
        params: &ParamBank<'_>,
        dy: &[f32],
        dx: &mut [f32],
        dparams: &mut ParamBankMut<'_>,
    );

    /// The deployable form: plain data that quantizes and dequantizes without dfdx, and
    /// reproduces [`forward`](Self::forward) exactly. The default builds it from
    /// [`qparams`](Self::qparams).
    fn to_inferable(
        &self,
        params: &ParamBank<'_>,
        grid: IntegerGrid,
        axis: Option<usize>,
    ) -> Result<InferableQuantizer> {
        InferableQuantizer::new(
            self.config().method(),
            grid,
            self.config().rounding(),
            self.qparams(params, grid, axis)?,
        )
    }
}

/// A weights quantizer that can be built from a [`WeightsQuantizerConfig`].
/// `#[mark_quantizer(target = Weights, ...)]` requires it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is marked `target = Weights` but does not implement `WeightsQuantizer`",
    label = "implement `quant_core::WeightsQuantizer` (and `TrainableQuantizer`) for this struct",
    note = "a weights quantizer is built from a `WeightsQuantizerConfig`"
)]
pub trait WeightsQuantizer: TrainableQuantizer + Sized {
    /// Builds the quantizer. The registry has already checked the target and that
    /// `config.method` is one the quantizer declares.
    fn from_config(config: &WeightsQuantizerConfig) -> Result<Self>;
}

/// An activation quantizer that can be built from an [`ActivationQuantizerConfig`].
/// `#[mark_quantizer(target = Activation, ...)]` requires it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is marked `target = Activation` but does not implement `ActivationQuantizer`",
    label = "implement `quant_core::ActivationQuantizer` (and `TrainableQuantizer`) for this struct",
    note = "an activation quantizer is built from an `ActivationQuantizerConfig`"
)]
pub trait ActivationQuantizer: TrainableQuantizer + Sized {
    /// Builds the quantizer. The registry has already checked the target and that
    /// `config.method` is one the quantizer declares.
    fn from_config(config: &ActivationQuantizerConfig) -> Result<Self>;
}
