//! Platforms: backend presets for how weights and activations are quantized (PPQ's
//! `TargetPlatform`, mmrazor's backend quantizers). A policy names one and overrides what it
//! needs.
//!
//! A downstream crate adds a platform without editing this crate, with
//! [`register_platform!`](crate::register_platform); a policy file then names it like a
//! built-in one. See `examples/custom_platform.rs`.
//!
//! # ONNX export
//!
//! `quant run` writes `model.onnx` in the layout of the policy's platform, which each
//! platform carries as data ([`Platform::onnx`]; a platform of your own picks any):
//!
//! - `TensorRtInt8` → [`OnnxConvention::TensorRt`],
//!   TensorRT's explicit quantization: every `QuantizeLinear` / `DequantizeLinear` int8 with
//!   zero point 0 (TensorRT's Q/DQ layers are symmetric int8), weights per channel on the
//!   output axis (axis 0 of `Conv` and `Gemm` weights), Q/DQ pairs where the graph quantizes:
//!   on the inputs of each quantizable op (its activation and its weights) and on both inputs
//!   of a residual `Add` (which the graph quantizes onto one grid), and float biases (TensorRT
//!   refuses a `DequantizeLinear` of int32 and quantizes biases itself).
//! - `OpenVinoInt8` → [`OnnxConvention::OpenVino`],
//!   what OpenVINO's ONNX import turns into its low-precision form (activation Q/DQ pairs into
//!   `FakeQuantize`, weight `DequantizeLinear`s into int8 constants with a dequantization):
//!   signed int8 weights with zero point 0, per channel on the output axis, activations uint8
//!   or int8 per tensor with any zero point, float biases (as NNCF writes them).
//! - any other platform → [`OnnxConvention::Standard`],
//!   onnxruntime's QDQ format with int32 biases at `s_input · s_weight`.
//!
//! A model whose quantizers break its convention (a TensorRT policy overridden to unsigned
//! activations, say) gets no `model.onnx`; the run's report says which node and why.

use std::collections::BTreeMap;
use std::fmt;

use linkme::distributed_slice;
use quant_core::{QuantError, QuantizationMethod, Result, RoundingPolicy, TrainingMethod};

use crate::convert::LayerKind;
use crate::observers::{HistogramBins, Momentum, ObserverConfig};
use crate::policy::QuantizerSettings;
use quant_runtime::export::onnx::OnnxConvention;

/// A backend preset: complete default settings for weights and for activations.
#[derive(Debug, Clone, PartialEq)]
pub struct Platform {
    /// The name a policy file uses (`platform = "TensorRtInt8"`).
    pub name: String,
    /// One line saying what it models.
    pub description: String,
    /// Defaults for weights quantizers.
    pub weights: QuantizerSettings,
    /// Defaults for activation (input) quantizers.
    pub input: QuantizerSettings,
    /// Layer kinds the target computes in floating point: their slots stay float by default
    /// under this platform (a policy's `[kinds.X]` table or an override still turns them on).
    /// TensorRT and OpenVINO run LayerNorm and GELU in float (or fp16); quant's integer runtime
    /// runs them on integers, so its presets keep none.
    pub float_kinds: Vec<LayerKind>,
    /// What the target does with a transformer's attention, softmax, GELU and LayerNorm.
    pub attention: String,
    /// The ONNX layout exports for this target follow (`model.onnx`).
    pub onnx: OnnxConvention,
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}. Transformers: {}",
            self.name, self.description, self.attention
        )
    }
}

/// What quant's integer runtime does with attention, for the presets that target it.
const INTEGER_RUNTIME_ATTENTION: &str = "every attention matmul input, the softmax output, \
     LayerNorm and GELU inputs quantized; quant's integer runtime runs softmax, GELU and \
     LayerNorm on integers (fixed-point kernels the fake-quantized model simulates)";

/// A registered platform: its name and how to build it.
pub struct PlatformEntry {
    /// The name a policy file uses.
    pub name: &'static str,
    /// Builds the preset.
    pub build: fn() -> Platform,
}

/// Every platform registered with [`register_platform!`](crate::register_platform), built-ins
/// included.
#[allow(unsafe_code)] // linkme's link section; see `register_platform!`
#[distributed_slice]
pub static PLATFORMS: [PlatformEntry];

/// Registers a platform under `name`, built by `build` (a `fn() -> Platform`).
///
/// ```
/// use quant_dfdx::platform::{Platform, find_platform};
/// fn my_dsp() -> Platform {
///     let mut p = find_platform("Academic").unwrap();
///     p.name = "MyDsp".into();
///     p.description = "8-bit symmetric everywhere, ties away from zero".into();
///     p.input.method = Some(quant_core::QuantizationMethod::Symmetric);
///     p.input.rounding = Some(quant_core::RoundingPolicy::HalfAwayFromZero);
///     p
/// }
/// quant_dfdx::register_platform!(MY_DSP = "MyDsp", my_dsp);
/// assert_eq!(find_platform("MyDsp").unwrap().input.rounding, Some(quant_core::RoundingPolicy::HalfAwayFromZero));
/// ```
#[macro_export]
macro_rules! register_platform {
    ($ident:ident = $name:literal, $build:path) => {
        // linkme puts the entry in a link section: the `unsafe_code` lint's only concern in
        // quant-dfdx, which denies it everywhere else.
        #[allow(unsafe_code)]
        #[$crate::__dfdx_private::linkme::distributed_slice($crate::platform::PLATFORMS)]
        #[linkme(crate = $crate::__dfdx_private::linkme)]
        static $ident: $crate::platform::PlatformEntry = $crate::platform::PlatformEntry {
            name: $name,
            build: $build,
        };
    };
}

/// The names of every registered platform, sorted.
pub fn platform_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = PLATFORMS.iter().map(|p| p.name).collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// Builds the platform registered as `name`.
///
/// # Errors
/// No platform has that name (the message lists the registered ones), or two do.
pub fn find_platform(name: &str) -> Result<Platform> {
    let matches: Vec<&PlatformEntry> = PLATFORMS.iter().filter(|p| p.name == name).collect();
    match matches.as_slice() {
        [one] => Ok((one.build)()),
        [] => Err(QuantError::InvalidValue {
            what: "platform".into(),
            value: name.into(),
            expected: format!(
                "one of the registered platforms: {}",
                platform_names().join(", ")
            ),
        }),
        many => Err(QuantError::InvalidValue {
            what: "platform".into(),
            value: name.into(),
            expected: format!(
                "a unique name, but {} platforms are registered under it",
                many.len()
            ),
        }),
    }
}

fn settings(
    method: QuantizationMethod,
    bits: u32,
    per_channel: bool,
    narrow_range: bool,
    signed: Option<bool>,
    observer: ObserverConfig,
) -> QuantizerSettings {
    QuantizerSettings {
        training_method: Some(TrainingMethod::Ste),
        method: Some(method),
        bits: Some(bits),
        per_channel: Some(per_channel),
        narrow_range: Some(narrow_range),
        signed,
        rounding: Some(RoundingPolicy::HalfEven),
        observer: Some(observer),
        learned_rounding: None,
        bias_correction: None,
        smoothing: None,
        options: BTreeMap::new(),
    }
}

/// Symmetric signed 8-bit weights per output channel on `[-127, 127]` (narrow range),
/// calibrated by min/max: the weights both TensorRT and OpenVINO take.
fn narrow_int8_channel_weights() -> QuantizerSettings {
    settings(
        QuantizationMethod::Symmetric,
        8,
        true,
        true,
        Some(true),
        ObserverConfig::MinMax,
    )
}

fn academic() -> Platform {
    Platform {
        name: "Academic".into(),
        description:
            "8-bit, symmetric per-tensor weights, asymmetric (uniform) per-tensor activations: \
                      the common academic setting (PPQ's ACADEMIC_INT8)"
                .into(),
        weights: settings(
            QuantizationMethod::Symmetric,
            8,
            false,
            false,
            None,
            ObserverConfig::MinMax,
        ),
        input: settings(
            QuantizationMethod::Uniform,
            8,
            false,
            false,
            None,
            ObserverConfig::MinMax,
        ),
        float_kinds: Vec::new(),
        attention: INTEGER_RUNTIME_ATTENTION.into(),
        onnx: OnnxConvention::Standard,
    }
}

/// TensorRT INT8 (explicit quantization): symmetric int8 everywhere, zero point 0; weights per
/// output channel on `[-127, 127]` (`amax / 127`), activations per tensor, entropy-calibrated;
/// ties to even, as TensorRT's `IQuantizeLayer` rounds. Exported to ONNX in
/// [`OnnxConvention::TensorRt`] (see the module
/// docs): int8 zero-point-0 Q/DQ on the inputs of each quantizable op, per-channel weights on
/// the output axis, float biases.
fn tensorrt_int8() -> Platform {
    Platform {
        name: "TensorRtInt8".into(),
        description:
            "TensorRT INT8: symmetric per-channel weights on [-127, 127] (amax/127), symmetric \
                      per-tensor activations calibrated by entropy (KL), ties to even"
                .into(),
        weights: narrow_int8_channel_weights(),
        input: settings(
            QuantizationMethod::Symmetric,
            8,
            false,
            true,
            Some(true),
            ObserverConfig::Entropy {
                bins: HistogramBins::DEFAULT,
            },
        ),
        float_kinds: vec![LayerKind::LayerNorm, LayerKind::Gelu],
        attention: "Q/DQ on the inputs of both attention matmuls (queries, keys, softmax output, \
             values), as pytorch-quantization's BERT; softmax, LayerNorm and GELU run in \
             float or fp16, so their inputs are not quantized"
            .into(),
        onnx: OnnxConvention::TensorRt,
    }
}

/// OpenVINO INT8: symmetric int8 weights per output channel on `[-127, 127]` (OpenVINO's
/// 255-level weights), symmetric 8-bit activations per tensor, unsigned after a ReLU (256
/// levels), moving-average min/max. Exported to ONNX in
/// [`OnnxConvention::OpenVino`] (see the module
/// docs): int8 zero-point-0 weights behind `DequantizeLinear`, uint8/int8 activation Q/DQ
/// pairs, float biases.
fn openvino_int8() -> Platform {
    Platform {
        name: "OpenVinoInt8".into(),
        description:
            "OpenVINO INT8: symmetric per-channel weights on [-127, 127], symmetric per-tensor \
                      activations (unsigned after ReLU), moving-average min/max"
                .into(),
        weights: narrow_int8_channel_weights(),
        input: settings(
            QuantizationMethod::Symmetric,
            8,
            false,
            false,
            None,
            ObserverConfig::MovingAverageMinMax {
                momentum: Momentum::DEFAULT,
            },
        ),
        float_kinds: vec![LayerKind::LayerNorm, LayerKind::Gelu],
        attention: "FakeQuantize on the inputs of both attention matmuls (as NNCF's transformer \
             preset); softmax, LayerNorm and GELU run in float, so their inputs are not quantized"
            .into(),
        onnx: OnnxConvention::OpenVino,
    }
}

fn generic_int4() -> Platform {
    Platform {
        name: "GenericInt4".into(),
        description:
            "4-bit: symmetric per-channel weights, uniform per-tensor activations, MSE-calibrated"
                .into(),
        weights: settings(
            QuantizationMethod::Symmetric,
            4,
            true,
            false,
            Some(true),
            ObserverConfig::Mse {
                bins: HistogramBins::DEFAULT,
            },
        ),
        input: settings(
            QuantizationMethod::Uniform,
            4,
            false,
            false,
            None,
            ObserverConfig::Mse {
                bins: HistogramBins::DEFAULT,
            },
        ),
        float_kinds: Vec::new(),
        attention: INTEGER_RUNTIME_ATTENTION.into(),
        onnx: OnnxConvention::Standard,
    }
}

crate::register_platform!(ACADEMIC = "Academic", academic);
crate::register_platform!(TENSORRT_INT8 = "TensorRtInt8", tensorrt_int8);
crate::register_platform!(OPENVINO_INT8 = "OpenVinoInt8", openvino_int8);
crate::register_platform!(GENERIC_INT4 = "GenericInt4", generic_int4);
