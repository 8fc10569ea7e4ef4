//! Quantizers as dfdx modules: the per-quantizer mode, the control interface reachable by
//! name, and [`TensorQuantizer`], the module that runs a quantizer chosen at run time.

use std::fmt;
use std::sync::Arc;

use dfdx::nn::tensor_collection::{ScalarOptions, TensorOptions};
use dfdx::prelude::*;
use serde::{Deserialize, Serialize};

use quant_core::{
    dfdx_ops::{self, read_contiguous},
    registry, ChannelLayout, InferableQuantizer, IntegerGrid, ParamBank, ParamBankMut, QParams,
    QuantError, QuantizationMethod, QuantizationTarget, QuantizerConfig, QuantizerMetadata, Result,
    TrainableQuantizer, TrainingMethod, MAX_PARAMETERS,
};

use crate::observers::{Observer, ObserverConfig};

/// What a quantizer does in the forward pass. Like pytorch-quantization's
/// `TensorQuantizer.disable()` / `enable_calib()` and MCT's training vs. frozen quantizers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum QuantizerMode {
    /// Pass-through: the layer runs in float.
    #[default]
    Disabled,
    /// Pass-through while an observer records statistics (`forward_mut` only).
    Calibrating,
    /// Convert with fixed parameters: gradients reach the input (straight-through) but not
    /// the quantizer's parameters.
    Frozen,
    /// Convert and train the quantizer's learnable parameters with the model.
    Training,
}

impl QuantizerMode {
    const ALL: [QuantizerMode; 4] = [
        QuantizerMode::Disabled,
        QuantizerMode::Calibrating,
        QuantizerMode::Frozen,
        QuantizerMode::Training,
    ];

    fn code(self) -> u8 {
        self as u8
    }

    fn from_code(code: u8) -> QuantizerMode {
        Self::ALL.get(code as usize).copied().unwrap_or_default()
    }

    /// Whether the forward pass quantizes.
    pub fn quantizes(self) -> bool {
        matches!(self, QuantizerMode::Frozen | QuantizerMode::Training)
    }
}

impl fmt::Display for QuantizerMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A quantizer's configuration as a policy chose it: what to build and which observer
/// calibrates it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantizerSpec {
    /// The trainable quantizer's config (target, method, training method, bits, ...).
    pub config: QuantizerConfig,
    /// How calibration turns statistics into quantization parameters.
    pub observer: ObserverConfig,
}

/// What a configured quantizer is, for reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuantizerDescription {
    /// Registry metadata of the quantizer (`None` for quantizers fixed at compile time that are
    /// not registered).
    #[serde(skip)]
    pub metadata: Option<QuantizerMetadata>,
    /// Training method id.
    pub training_method: TrainingMethod,
    /// Grid layout.
    pub method: QuantizationMethod,
    /// Bit width.
    pub bits: u32,
    /// Whether parameters are per channel.
    pub per_channel: bool,
    /// The observer used in calibration.
    pub observer: String,
    /// The current mode.
    pub mode: QuantizerMode,
}

/// Controls one quantizer inside a model: mode, calibration, parameters, deployment. Reachable
/// by name through [`QuantizedModule::visit_slots`](crate::layers::QuantizedModule::visit_slots).
pub trait QuantizerControl {
    /// The current mode.
    fn mode(&self) -> QuantizerMode;
    /// Changes the mode.
    ///
    /// # Errors
    /// [`QuantError::NotInitialized`] when asked to quantize (Frozen, Training) before the
    /// parameters were calibrated or initialised, or to calibrate an unconfigured quantizer.
    fn set_mode(&mut self, mode: QuantizerMode) -> Result<()>;
    /// What the quantizer is; `None` when no quantizer is configured (the slot stays float).
    fn describe(&self) -> Option<QuantizerDescription>;
    /// Feeds data to the observer (used for weights, which the layer passes itself).
    fn observe(&mut self, x: &[f32], layout: ChannelLayout) -> Result<()>;
    /// Turns the observed statistics into parameters and switches to Frozen.
    ///
    /// # Errors
    /// Nothing was observed.
    fn finish_calibration(&mut self) -> Result<()>;
    /// The current quantization parameters (`None` before initialisation or when unconfigured).
    fn qparams(&self) -> Result<Option<QParams>>;
    /// The deployable quantizer (`None` before initialisation or when unconfigured).
    fn inferable(&self) -> Result<Option<InferableQuantizer>>;
    /// Whether parameters are calibrated or initialised.
    fn is_initialized(&self) -> bool;
    /// Sets the quantizer up as a policy says, naming it `name` (its dotted name, in errors and
    /// reports), and enters Calibrating. A quantizer fixed at compile time checks that `spec`
    /// describes it, and rejects it otherwise.
    ///
    /// # Errors
    /// A spec the quantizer cannot be built from.
    fn configure(&mut self, name: &str, spec: &QuantizerSpec) -> Result<()>;
    /// Removes the quantizer: the slot stays float (Disabled) for good.
    fn clear(&mut self);
}

/// The run-time part of a [`TensorQuantizer`]: not tensors, so not saved with the model (a
/// converted model is rebuilt from its policy, then loads its tensors).
#[derive(Clone)]
struct Setup {
    metadata: QuantizerMetadata,
    quantizer: Arc<dyn TrainableQuantizer>,
    spec: QuantizerSpec,
}

impl fmt::Debug for Setup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Setup")
            .field("quantizer", &self.metadata.path())
            .field("spec", &self.spec)
            .finish()
    }
}

/// Codes of the `signedness` scalar.
const SIGN_UNRESOLVED: u8 = 0;
const SIGN_UNSIGNED: u8 = 1;
const SIGN_SIGNED: u8 = 2;

/// A quantizer chosen at run time (from the registry, by enum or by config), as a dfdx module.
///
/// Its parameters live in two banks of `MAX_PARAMETERS × C` values, one column per channel
/// (`C = 1` per tensor): `learned` trains with the model's optimiser, `fixed` is detached (STE
/// thresholds, calibrated values). Both save and load with the model, as do the mode, the
/// resolved signedness and the initialised flag (dfdx scalars). The quantizer's choice itself
/// is configuration: a model is rebuilt from its policy, then loads its tensors.
///
/// `TensorQuantizer<1>` is also a module on its own: put it anywhere in a model to quantize an
/// activation (MCT's activation holder, Brevitas' `QuantIdentity`).
pub struct TensorQuantizer<const C: usize, E: Dtype = f32, D: Storage<E> = Cpu> {
    /// Trainable parameter slots.
    pub learned: Tensor<Rank2<MAX_PARAMETERS, C>, E, D>,
    /// Fixed (detached) parameter slots.
    pub fixed: Tensor<Rank2<MAX_PARAMETERS, C>, E, D>,
    mode: u8,
    signedness: u8,
    initialized: u8,
    name: String,
    setup: Option<Setup>,
    observer: Option<Box<dyn Observer>>,
}

impl<const C: usize, E: Dtype, D: Storage<E>> Clone for TensorQuantizer<C, E, D> {
    fn clone(&self) -> Self {
        TensorQuantizer {
            learned: self.learned.clone(),
            fixed: self.fixed.clone(),
            mode: self.mode,
            signedness: self.signedness,
            initialized: self.initialized,
            name: self.name.clone(),
            setup: self.setup.clone(),
            observer: self.observer.as_ref().map(|o| o.box_clone()),
        }
    }
}

impl<const C: usize, E: Dtype, D: Storage<E>> fmt::Debug for TensorQuantizer<C, E, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorQuantizer")
            .field("name", &self.name)
            .field("mode", &QuantizerMode::from_code(self.mode))
            .field("setup", &self.setup)
            .finish_non_exhaustive()
    }
}

tensor_collection! {
    impl[const C: usize, E: Dtype, D: Device<E>] TensorQuantizer<C, E, D> => TensorQuantizer<C, E2, D2>;
    TensorQuantizer {
        learned: tensor(TensorOptions::reset_to_zeros()),
        fixed: tensor(TensorOptions::detached(|t| t.try_fill_with_zeros())),
        mode: scalar(ScalarOptions::from_default(0u8)),
        signedness: scalar(ScalarOptions::from_default(SIGN_UNRESOLVED)),
        initialized: scalar(ScalarOptions::from_default(0u8)),
    }
    // Not visited: a quantizer a visitor rebuilds (on another dtype or device) starts
    // unconfigured.
    with { name: String::new(), setup: None, observer: None }
}

impl<const C: usize> TensorQuantizer<C> {
    /// An unconfigured quantizer (Disabled, pass-through).
    pub fn new(dev: &Cpu) -> Self {
        TensorQuantizer {
            learned: dev.zeros(),
            fixed: dev.zeros(),
            mode: QuantizerMode::Disabled.code(),
            signedness: SIGN_UNRESOLVED,
            initialized: 0,
            name: String::new(),
            setup: None,
            observer: None,
        }
    }

    /// Builds the quantizer `spec.config` names from the registry, and enters Calibrating.
    /// `name` (e.g. `fc1.weights`) appears in errors and reports.
    ///
    /// # Errors
    /// The registry has no (or more than one) quantizer for the config, the quantizer rejects
    /// the config, or it declares more parameters than [`MAX_PARAMETERS`].
    pub fn configure(&mut self, name: impl Into<String>, spec: QuantizerSpec) -> Result<()> {
        let name = name.into();
        let entry = registry::find(
            spec.config.target(),
            spec.config.method(),
            spec.config.training_method(),
        )
        .map_err(|e| e.at(&name))?;
        let quantizer: Arc<dyn TrainableQuantizer> =
            entry.build(&spec.config).map_err(|e| e.at(&name))?.into();
        let declared = quantizer.parameters().len();
        if declared > MAX_PARAMETERS {
            return Err(QuantError::TooManyParameters {
                quantizer: entry.metadata.path(),
                count: declared,
                max: MAX_PARAMETERS,
            }
            .at(&name));
        }
        if spec.config.per_channel() && C == 1 {
            return Err(QuantError::ConfigMismatch {
                quantizer: entry.metadata.path(),
                reason:
                    "per-channel parameters need a channel axis; this slot quantizes per tensor"
                        .into(),
            }
            .at(&name));
        }
        self.observer = Some(spec.observer.build());
        self.setup = Some(Setup {
            metadata: entry.metadata,
            quantizer,
            spec,
        });
        self.name = name;
        self.signedness = SIGN_UNRESOLVED;
        self.initialized = 0;
        self.mode = QuantizerMode::Calibrating.code();
        Ok(())
    }

    /// Removes the quantizer: the slot stays float (Disabled) for good.
    pub fn clear(&mut self) {
        self.setup = None;
        self.observer = None;
        self.mode = QuantizerMode::Disabled.code();
        self.initialized = 0;
    }

    /// The name given at configuration (empty when unconfigured).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The spec it was configured with.
    pub fn spec(&self) -> Option<&QuantizerSpec> {
        self.setup.as_ref().map(|s| &s.spec)
    }

    /// The integer grid, with the signedness resolved from the data where the config leaves it
    /// open.
    pub fn grid(&self) -> Result<Option<IntegerGrid>> {
        match &self.setup {
            None => Ok(None),
            Some(s) => s.spec.config.grid(self.signedness == SIGN_SIGNED).map(Some),
        }
    }

    /// The channel axis used for `shape`-ranked data: `Some(0)` for per-channel weights.
    fn axis(&self) -> Option<usize> {
        match &self.setup {
            Some(s) if s.spec.config.per_channel() => Some(0),
            _ => None,
        }
    }

    fn not_initialized(&self) -> QuantError {
        QuantError::NotInitialized {
            hint: "calibrate it (Calibrating mode, forward_mut on data, then finish_calibration) before quantizing"
                .into(),
        }
        .at(self.label())
    }

    /// The error of an operation that needs a configured quantizer, in a slot that has none.
    fn not_configured(&self) -> QuantError {
        QuantError::NotInitialized {
            hint: "no quantizer is configured in this slot".into(),
        }
        .at(self.label())
    }

    fn label(&self) -> String {
        if self.name.is_empty() {
            "quantizer".into()
        } else {
            self.name.clone()
        }
    }

    /// Fake-quantizes `x` according to the mode. Per-channel quantizers use axis 0 of `x`.
    ///
    /// # Errors
    /// Calibrating mode (observing needs `fake_quantize_mut`), uninitialised parameters, or a channel
    /// count along axis 0 other than `C` for per-channel quantizers.
    pub fn fake_quantize<S: Shape, T: Tape<f32, Cpu>>(
        &self,
        x: Tensor<S, f32, Cpu, T>,
    ) -> Result<Tensor<S, f32, Cpu, T>> {
        if QuantizerMode::from_code(self.mode) == QuantizerMode::Calibrating && self.setup.is_some()
        {
            return Err(QuantError::InvalidValue {
                what: "mode".into(),
                value: "Calibrating".into(),
                expected: "forward_mut while calibrating: the observer records statistics, which needs &mut".into(),
            }
            .at(self.label()));
        }
        match self.quantization(x.shape())? {
            None => Ok(x),
            // The op's own errors already name the quantizer (`quantization`); the tensor's
            // (allocation) get the name here.
            Some(op) => op.apply(x).map_err(|e| match e {
                QuantError::At { .. } => e,
                e => e.at(self.label()),
            }),
        }
    }

    /// The op [`fake_quantize`](Self::fake_quantize) would run on a tensor of `shape`, taken
    /// apart ([`dfdx_ops::DynQuantization`]) for an op that quantizes a tensor it reads;
    /// `None` where `fake_quantize` runs no op (disabled or unconfigured) or where it must not
    /// run (Calibrating: the observer needs `fake_quantize_mut`).
    ///
    /// # Errors
    /// As [`fake_quantize`](Self::fake_quantize): parameters not initialised, a shape whose
    /// channels do not match.
    pub fn quantization<S: Shape>(&self, shape: &S) -> Result<Option<dfdx_ops::DynQuantization>> {
        let mode = QuantizerMode::from_code(self.mode);
        let setup = match (mode, &self.setup) {
            (QuantizerMode::Disabled | QuantizerMode::Calibrating, _) | (_, None) => {
                return Ok(None)
            }
            (_, Some(setup)) => setup,
        };
        if self.initialized == 0 {
            return Err(self.not_initialized());
        }
        let grid = self.grid()?.ok_or_else(|| self.not_initialized())?;
        dfdx_ops::DynQuantization::new(
            &setup.quantizer,
            shape,
            &self.learned,
            &self.fixed,
            grid,
            self.axis(),
            mode == QuantizerMode::Training,
        )
        .map(|mut op| {
            // The forward pass's errors name the quantizer, as `fake_quantize`'s do.
            let (forward, label) = (op.forward, self.label());
            op.forward = Box::new(move |x, y| forward(x, y).map_err(|e| e.at(label)));
            Some(op)
        })
        .map_err(|e| e.at(self.label()))
    }

    /// Like [`fake_quantize`](Self::fake_quantize), but in Calibrating mode records `x` in the observer and
    /// passes it through.
    pub fn fake_quantize_mut<S: Shape, T: Tape<f32, Cpu>>(
        &mut self,
        x: Tensor<S, f32, Cpu, T>,
    ) -> Result<Tensor<S, f32, Cpu, T>> {
        if QuantizerMode::from_code(self.mode) == QuantizerMode::Calibrating && self.setup.is_some()
        {
            let dims = x.shape().concrete();
            let layout = ChannelLayout::new(dims.as_ref(), self.axis())?;
            self.observe(&x.as_vec(), layout)?;
            return Ok(x);
        }
        self.fake_quantize(x)
    }

    /// Sets the parameters from quantization parameters directly (bypassing the observer), and
    /// switches to Frozen. `grid` fixes the signedness.
    pub fn set_qparams(&mut self, qparams: &QParams, grid: IntegerGrid) -> Result<()> {
        let label = self.label();
        let setup = self.setup.as_ref().ok_or_else(|| self.not_configured())?;
        let mut bank = merged_bank(&setup.quantizer, &self.learned, &self.fixed);
        setup
            .quantizer
            .set_qparams(qparams, grid, &mut ParamBankMut::new(&mut bank, C)?)
            .map_err(|e| e.at(&label))?;
        let (learned, fixed) = split_bank(&setup.quantizer, &bank, C);
        self.learned.copy_from(&learned);
        self.fixed.copy_from(&fixed);
        self.signedness = if grid.signed() {
            SIGN_SIGNED
        } else {
            SIGN_UNSIGNED
        };
        self.initialized = 1;
        self.mode = QuantizerMode::Frozen.code();
        Ok(())
    }
}

impl TensorQuantizer<1> {
    /// The grid its forward pass puts values on now (scale, zero point, code range), `None`
    /// while it passes values through (disabled, calibrating or unconfigured): what a layer
    /// needs to run an integer kernel of [`quant_core::int8`] on the quantized values, as the
    /// integer runtime will.
    ///
    /// # Errors
    /// Parameters that cannot be read.
    pub fn code_grid(&self) -> Result<Option<quant_core::dfdx_ops::CodeGrid>> {
        if !self.mode().quantizes() || self.setup.is_none() || self.initialized == 0 {
            return Ok(None);
        }
        Ok(self.inferable()?.map(|q| quant_core::dfdx_ops::CodeGrid {
            scale: q.qparams().scales()[0],
            zero_point: q.qparams().zero_points()[0],
            codes: q.grid().quant_min()..=q.grid().quant_max(),
        }))
    }
}

/// One bank with each slot taken from where the quantizer keeps it: the fixed bank, with the
/// trainable slots' rows from the learned bank.
fn merged_bank<const C: usize>(
    q: &Arc<dyn TrainableQuantizer>,
    learned: &Tensor<Rank2<MAX_PARAMETERS, C>, f32, Cpu>,
    fixed: &Tensor<Rank2<MAX_PARAMETERS, C>, f32, Cpu>,
) -> Vec<f32> {
    let mut bank = read_contiguous(fixed);
    let learned = dfdx_ops::Scratch::copy_of(learned);
    for (k, decl) in q.parameters().iter().enumerate() {
        if decl.trainable {
            let r = k * C..(k + 1) * C;
            bank[r.clone()].copy_from_slice(&learned[r]);
        }
    }
    bank
}

/// Splits a bank into (learned, fixed) by the quantizer's declarations.
fn split_bank(
    q: &Arc<dyn TrainableQuantizer>,
    bank: &[f32],
    channels: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut learned = vec![0.0; bank.len()];
    let mut fixed = vec![0.0; bank.len()];
    for (k, decl) in q.parameters().iter().enumerate() {
        let r = k * channels..(k + 1) * channels;
        if decl.trainable {
            learned[r.clone()].copy_from_slice(&bank[r]);
        } else {
            fixed[r.clone()].copy_from_slice(&bank[r]);
        }
    }
    (learned, fixed)
}

impl<const C: usize> QuantizerControl for TensorQuantizer<C> {
    fn mode(&self) -> QuantizerMode {
        QuantizerMode::from_code(self.mode)
    }

    fn set_mode(&mut self, mode: QuantizerMode) -> Result<()> {
        match mode {
            QuantizerMode::Disabled => {}
            QuantizerMode::Calibrating => {
                let setup = self.setup.as_ref().ok_or_else(|| QuantError::NotInitialized {
                    hint: "no quantizer is configured in this slot, so there is nothing to calibrate".into(),
                }
                .at(self.label()))?;
                self.observer = Some(setup.spec.observer.build());
            }
            QuantizerMode::Frozen | QuantizerMode::Training => {
                if self.setup.is_none() || self.initialized == 0 {
                    return Err(self.not_initialized());
                }
            }
        }
        self.mode = mode.code();
        Ok(())
    }

    fn describe(&self) -> Option<QuantizerDescription> {
        let s = self.setup.as_ref()?;
        Some(QuantizerDescription {
            metadata: Some(s.metadata),
            training_method: s.spec.config.training_method(),
            method: s.spec.config.method(),
            bits: s.spec.config.bits(),
            per_channel: s.spec.config.per_channel(),
            observer: s.spec.observer.to_string(),
            mode: self.mode(),
        })
    }

    fn observe(&mut self, x: &[f32], layout: ChannelLayout) -> Result<()> {
        let label = self.label();
        let Some(observer) = self.observer.as_mut() else {
            return Err(self.not_configured());
        };
        observer.observe(x, layout).map_err(|e| e.at(label))
    }

    fn finish_calibration(&mut self) -> Result<()> {
        let label = self.label();
        let (Some(setup), Some(observer)) = (&self.setup, &self.observer) else {
            return Err(self.not_configured());
        };
        let (mins, _) = observer.ranges().ok_or_else(|| {
            QuantError::NotInitialized {
                hint: "no data was observed: run forward_mut on calibration batches first".into(),
            }
            .at(&label)
        })?;
        let has_negatives = mins.iter().any(|m| *m < 0.0);
        let grid = setup
            .spec
            .config
            .grid(has_negatives)
            .map_err(|e| e.at(&label))?;
        let qparams = observer
            .qparams(
                setup.spec.config.method(),
                grid,
                setup.spec.config.rounding(),
            )
            .map_err(|e| e.at(&label))?;
        self.set_qparams(&qparams, grid)
    }

    fn qparams(&self) -> Result<Option<QParams>> {
        self.with_bank(|q, bank, grid, axis| q.qparams(bank, grid, axis))
    }

    fn inferable(&self) -> Result<Option<InferableQuantizer>> {
        self.with_bank(|q, bank, grid, axis| q.to_inferable(bank, grid, axis))
    }

    fn is_initialized(&self) -> bool {
        self.initialized != 0
    }

    fn configure(&mut self, name: &str, spec: &QuantizerSpec) -> Result<()> {
        TensorQuantizer::configure(self, name, spec.clone())
    }

    fn clear(&mut self) {
        TensorQuantizer::clear(self)
    }
}

impl<const C: usize> TensorQuantizer<C> {
    /// Runs `f` on the configured quantizer with its merged parameter slots, grid and axis;
    /// `None` when unconfigured or not initialised.
    fn with_bank<R>(
        &self,
        f: impl FnOnce(&dyn TrainableQuantizer, &ParamBank<'_>, IntegerGrid, Option<usize>) -> Result<R>,
    ) -> Result<Option<R>> {
        let (Some(setup), Some(grid)) = (&self.setup, self.grid()?) else {
            return Ok(None);
        };
        if self.initialized == 0 {
            return Ok(None);
        }
        let bank = merged_bank(&setup.quantizer, &self.learned, &self.fixed);
        f(
            setup.quantizer.as_ref(),
            &ParamBank::new(&bank, C)?,
            grid,
            self.axis(),
        )
        .map(Some)
        .map_err(|e| e.at(self.label()))
    }

    /// The target the configured quantizer quantizes.
    pub fn target(&self) -> Option<QuantizationTarget> {
        self.setup.as_ref().map(|s| s.metadata.target)
    }
}

impl<S: Shape, T: Tape<f32, Cpu>> Module<Tensor<S, f32, Cpu, T>> for TensorQuantizer<1> {
    type Output = Tensor<S, f32, Cpu, T>;
    type Error = QuantError;

    fn try_forward(&self, x: Tensor<S, f32, Cpu, T>) -> Result<Self::Output> {
        self.fake_quantize(x)
    }
}

impl<S: Shape, T: Tape<f32, Cpu>> ModuleMut<Tensor<S, f32, Cpu, T>> for TensorQuantizer<1> {
    type Output = Tensor<S, f32, Cpu, T>;
    type Error = QuantError;

    fn try_forward_mut(&mut self, x: Tensor<S, f32, Cpu, T>) -> Result<Self::Output> {
        self.fake_quantize_mut(x)
    }
}
