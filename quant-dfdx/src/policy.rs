//! The policy file: which quantizer each layer gets (QuanTransformer's `quan_policy` +
//! `special_layers`, ModelOpt's wildcard configs, PPQ's platform + per-op settings).
//!
//! ```toml
//! platform = "Academic"            # preset defaults (see quant_dfdx::platform)
//!
//! [weights]                        # defaults for every layer with weights
//! training_method = "Lsq"
//! bits = 4
//! per_channel = true
//!
//! [input]                          # defaults for the input of every layer with weights
//! training_method = "Lsq"
//! method = "Uniform"
//! bits = 4
//! observer = "LsqInit"
//!
//! [kinds.MaxPool2d]                # per layer kind (layers without weights have no input
//! input = { bits = 8 }             # quantizer unless their kind or an override gives one)
//!
//! [kinds.Conv2d]                   # learned rounding and bias correction after calibration
//! weights = { learned_rounding = "AdaRound", bias_correction = true }
//!
//! [adaround]                       # their samples and optimisation (see quant_dfdx::ptq)
//! iterations = 1000
//!
//! [gptq]                           # GPTQ's, for `learned_rounding = "GPTQ"`
//! damping = 0.01
//!
//! [kinds.Linear]                   # SmoothQuant before calibration, where a LayerNorm
//! input = { smoothing = 0.5 }      # feeds the layer (see quant_dfdx::ptq::smooth)
//!
//! [[overrides]]                    # by dotted layer name, glob patterns; applied in order
//! pattern = "0"
//! weights = { bits = 8 }
//! input = "float"                  # leave this slot float
//!
//! unmatched_patterns = "error"     # or "warn": an override that matches no layer
//! ```
//!
//! Which slots the defaults cover: those of layers with weights, adds, attention's matrix
//! products, LayerNorm and GELU (what an integer model needs quantized), except the kinds the
//! platform computes in float ([`Platform::float_kinds`](crate::platform::Platform): TensorRT
//! keeps LayerNorm and GELU float).
//!
//! Settings merge field by field: platform, then `[weights]` / `[input]`, then
//! `[kinds.<Kind>]`, then every matching override in file order. `"float"` leaves a slot float
//! (a later table turns it back on). Loading checks everything it can before any model exists:
//! unknown keys, unknown training methods, platforms or observers, bit widths, and whether a
//! registered quantizer supports each combination the file can produce; every error names
//! its key path. Conversion then checks each layer exactly and reports patterns that matched
//! nothing.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use quant_core::{
    registry, ActivationQuantizerConfig, IntegerGrid, QuantError, QuantizationMethod,
    QuantizationTarget, QuantizerConfig, Result, RoundingPolicy, TrainingMethod,
    WeightsQuantizerConfig,
};

use crate::convert::{LayerKind, LayerPolicy};
use crate::layers::{glob, join_name, QuantizerSpec, Slot};
use crate::observers::ObserverConfig;
use crate::platform::find_platform;
use crate::ptq::{AdaRoundSettings, GptqSettings, Refinement, WeightRounding};

/// Largest policy or run file read, in bytes (larger files are refused before reading): a
/// policy of a thousand overrides takes a few hundred kilobytes.
pub const MAX_CONFIG_FILE_BYTES: u64 = 1 << 20;

/// Longest platform or option name accepted, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// The text of a policy or run file: a regular file (not a FIFO or device, which could block
/// or never end) of at most [`MAX_CONFIG_FILE_BYTES`], UTF-8, a leading byte-order mark
/// dropped.
///
/// # Errors
/// [`ConfigError::Read`] saying which of these failed.
pub fn read_config_file(path: &Path) -> std::result::Result<String, ConfigError> {
    quant_runtime::fs::read_text_limited(path, MAX_CONFIG_FILE_BYTES).map_err(|source| {
        ConfigError::Read {
            path: path.display().to_string(),
            source,
        }
    })
}

/// Errors of configuration files, policy files and run files alike: where (file, key path)
/// and what.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The text is not valid TOML for a policy (syntax, unknown key, wrong type, bad value).
    #[error("{origin}: `{key}`: {message}")]
    Parse {
        /// The file (or `<string>`).
        origin: String,
        /// The key path, e.g. `overrides[1].weights.bits` (`.` for the top level).
        key: String,
        /// What is wrong and what is valid.
        message: String,
    },
    /// The file parses but asks for something invalid.
    #[error("{origin}: `{key}`: {source}")]
    Invalid {
        /// The file (or `<string>`).
        origin: String,
        /// The key path.
        key: String,
        /// What is wrong.
        #[source]
        source: QuantError,
    },
}

/// Settings of one quantizer slot, every field optional so that layers of settings merge.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuantizerSettings {
    /// Training method id (`Ste`, `Lsq`, `Pact`, `Dsq`, or a registered custom one).
    pub training_method: Option<TrainingMethod>,
    /// Grid layout.
    pub method: Option<QuantizationMethod>,
    /// Bit width, 2..=16.
    pub bits: Option<u32>,
    /// Per-channel weights (ignored for inputs).
    pub per_channel: Option<bool>,
    /// Narrow range.
    pub narrow_range: Option<bool>,
    /// Signedness of a symmetric activation grid (absent: decided from the data). Ignored for
    /// weights.
    pub signed: Option<bool>,
    /// Rounding policy.
    pub rounding: Option<RoundingPolicy>,
    /// Calibration observer.
    pub observer: Option<ObserverConfig>,
    /// How weights round onto their grid once calibrated: `Nearest` (the rounding policy, the
    /// default), `AdaRound` or `GPTQ` (learned per layer, see [`crate::ptq`]). Weights only.
    pub learned_rounding: Option<WeightRounding>,
    /// Whether the layer's bias absorbs the mean error quantization adds to its outputs once
    /// calibrated (see [`crate::ptq`]). Weights only; default `false`.
    pub bias_correction: Option<bool>,
    /// SmoothQuant's migration strength `α` in `[0, 1]` for an input slot of a Linear layer fed
    /// by a LayerNorm: before calibration, each input channel `c` is divided by
    /// `s_c = max|x_c|^α / max|W_{·c}|^(1−α)` (folded into the LayerNorm's scale and shift) and
    /// the weights' column `c` multiplied by it, so the float model computes the same and the
    /// per-tensor activation grid sees channels of more equal range (see [`crate::ptq`]).
    /// Activations only; absent: no smoothing.
    pub smoothing: Option<f64>,
    /// Method-specific options, merged key by key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, f64>,
}

impl QuantizerSettings {
    /// `self` with every field `over` sets replaced.
    pub fn merged(&self, over: &QuantizerSettings) -> QuantizerSettings {
        let mut options = self.options.clone();
        options.extend(over.options.iter().map(|(k, v)| (k.clone(), *v)));
        QuantizerSettings {
            training_method: over.training_method.or(self.training_method),
            method: over.method.or(self.method),
            bits: over.bits.or(self.bits),
            per_channel: over.per_channel.or(self.per_channel),
            narrow_range: over.narrow_range.or(self.narrow_range),
            signed: over.signed.or(self.signed),
            rounding: over.rounding.or(self.rounding),
            observer: over.observer.or(self.observer),
            learned_rounding: over.learned_rounding.or(self.learned_rounding),
            bias_correction: over.bias_correction.or(self.bias_correction),
            smoothing: over.smoothing.or(self.smoothing),
            options,
        }
    }

    /// The complete spec for a slot of `target`, checking that a registered quantizer supports
    /// it. `key` prefixes error messages about missing fields.
    ///
    /// # Errors
    /// A required field (`training_method`, `method`, `bits`) is missing, the bit width is out
    /// of range, or no quantizer is registered for the combination.
    pub fn to_spec(&self, target: QuantizationTarget) -> Result<QuantizerSpec> {
        let missing = |field: &str| {
            QuantError::InvalidValue {
            what: field.into(),
            value: "(missing)".into(),
            expected: format!(
                "a value: set `{field}` in the defaults (`[weights]` / `[input]`), the platform, a kind or an override"
            ),
        }
        };
        if let Some(name) = self.options.keys().find(|k| k.len() > MAX_NAME_BYTES) {
            return Err(QuantError::InvalidValue {
                what: "options".into(),
                value: quant_runtime::fs::shorten(name).into_owned(),
                expected: format!("option names of at most {MAX_NAME_BYTES} bytes"),
            });
        }
        let training_method = self
            .training_method
            .ok_or_else(|| missing("training_method"))?;
        let method = self.method.ok_or_else(|| missing("method"))?;
        let bits = self.bits.ok_or_else(|| missing("bits"))?;
        IntegerGrid::new(bits, true, false)?;
        match (target, self.smoothing) {
            (QuantizationTarget::Weights, Some(_)) => {
                return Err(QuantError::InvalidValue {
                    what: "smoothing".into(),
                    value: "(set on a weights slot)".into(),
                    expected: "`smoothing` only in input settings (`[input]`, `input = { ... }`): it rescales the channels of the activation a layer reads".into(),
                });
            }
            (QuantizationTarget::Activation, Some(a)) if !(0.0..=1.0).contains(&a) => {
                return Err(QuantError::InvalidValue {
                    what: "smoothing".into(),
                    value: a.to_string(),
                    expected: "a migration strength from 0 to 1 (SmoothQuant's α; 0.5 is usual)"
                        .into(),
                });
            }
            _ => {}
        }
        if target == QuantizationTarget::Activation {
            for (field, set) in [
                ("learned_rounding", self.learned_rounding.is_some()),
                ("bias_correction", self.bias_correction.is_some()),
            ] {
                if set {
                    return Err(QuantError::InvalidValue {
                        what: field.into(),
                        value: "(set on an activation slot)".into(),
                        expected: format!(
                            "`{field}` only in weights settings (`[weights]`, `weights = {{ ... }}`): it adjusts a layer's weights and bias"
                        ),
                    });
                }
            }
        }
        let config: QuantizerConfig = match target {
            QuantizationTarget::Weights => WeightsQuantizerConfig {
                training_method,
                method,
                bits,
                per_channel: self.per_channel.unwrap_or(true),
                narrow_range: self.narrow_range.unwrap_or(false),
                rounding: self.rounding.unwrap_or_default(),
                options: self.options.clone(),
            }
            .into(),
            QuantizationTarget::Activation => ActivationQuantizerConfig {
                training_method,
                method,
                bits,
                signed: self.signed,
                narrow_range: self.narrow_range.unwrap_or(false),
                rounding: self.rounding.unwrap_or_default(),
                options: self.options.clone(),
            }
            .into(),
        };
        // Fails with NotFound (listing what exists) or with the quantizer's own complaint.
        registry::build(&config)?;
        Ok(QuantizerSpec {
            config,
            observer: self.observer.unwrap_or(ObserverConfig::MinMax),
        })
    }
}

/// A slot's setting: quantize with (partial) settings, or leave it float.
#[derive(Debug, Clone, PartialEq)]
pub enum SlotSetting {
    /// `"float"`: leave the slot float.
    Float,
    /// A table of settings merged onto what came before.
    Quantize(QuantizerSettings),
}

impl Serialize for SlotSetting {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            SlotSetting::Float => s.serialize_str("float"),
            SlotSetting::Quantize(q) => q.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for SlotSetting {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct SlotVisitor;
        impl<'de> serde::de::Visitor<'de> for SlotVisitor {
            type Value = SlotSetting;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"float\" or a table of quantizer settings")
            }
            fn visit_str<E: serde::de::Error>(
                self,
                v: &str,
            ) -> std::result::Result<SlotSetting, E> {
                if v == "float" {
                    Ok(SlotSetting::Float)
                } else {
                    Err(E::invalid_value(serde::de::Unexpected::Str(v), &self))
                }
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<SlotSetting, A::Error> {
                QuantizerSettings::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(SlotSetting::Quantize)
            }
        }
        d.deserialize_any(SlotVisitor)
    }
}

/// Settings of a layer's slots: `weights` for every weights slot, `input` for every activation
/// slot, then `slots.<name>` for one slot by name.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerSettings {
    /// Every weights slot (`weights` of Linear and Conv2d, each quantized field of a custom
    /// layer).
    pub weights: Option<SlotSetting>,
    /// Every activation slot (`input`).
    pub input: Option<SlotSetting>,
    /// One slot by name, applied after `weights` and `input`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub slots: BTreeMap<String, SlotSetting>,
}

/// The settings of a table that apply to `slot`, in order: its target's group (not for an
/// optional slot), then its name.
fn steps<'a>(
    weights: &'a Option<SlotSetting>,
    input: &'a Option<SlotSetting>,
    slots: &'a BTreeMap<String, SlotSetting>,
    slot: Slot,
) -> [Option<&'a SlotSetting>; 2] {
    let group = match (slot.optional, slot.target) {
        (true, _) => None,
        (false, QuantizationTarget::Weights) => weights.as_ref(),
        (false, QuantizationTarget::Activation) => input.as_ref(),
    };
    [group, slots.get(slot.name)]
}

/// Settings for the layers whose dotted name matches `pattern`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Override {
    /// A glob over dotted layer names (`0`, `encoder.*`, `*.fc?`, `{0,2}`, `![0-3]`; the syntax
    /// is [`NamePattern`](crate::layers::NamePattern)'s).
    pub pattern: String,
    /// Every weights slot of the matching layers.
    pub weights: Option<SlotSetting>,
    /// Every activation slot of the matching layers.
    pub input: Option<SlotSetting>,
    /// One slot by name, applied after `weights` and `input`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub slots: BTreeMap<String, SlotSetting>,
}

/// What to do with an override that matches no layer of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnmatchedPatterns {
    /// Conversion fails (the default: a typo in a layer name must not go unnoticed).
    #[default]
    Error,
    /// Conversion succeeds; the unmatched patterns are reported by [`Policy::unmatched`].
    Warn,
}

/// A parsed, validated policy.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// A registered platform whose presets are the starting point.
    pub platform: Option<String>,
    /// Defaults for weights slots.
    pub weights: Option<SlotSetting>,
    /// Defaults for the input slots of layers with weights.
    pub input: Option<SlotSetting>,
    /// Settings per layer kind.
    #[serde(default)]
    pub kinds: BTreeMap<LayerKind, LayerSettings>,
    /// Settings per layer name pattern, applied in order.
    #[serde(default)]
    pub overrides: Vec<Override>,
    /// What to do with overrides that match no layer.
    #[serde(default)]
    pub unmatched_patterns: UnmatchedPatterns,
    /// Samples and optimisation of learned rounding and bias correction (weights settings
    /// `learned_rounding`, `bias_correction`; see [`crate::ptq`]).
    #[serde(default)]
    pub adaround: AdaRoundSettings,
    /// GPTQ's dampening and column order (weights setting `learned_rounding = "GPTQ"`).
    #[serde(default)]
    pub gptq: GptqSettings,
    /// Layers seen during conversion and the slots asked of each, to report overrides that
    /// matched nothing.
    #[serde(skip)]
    seen: RefCell<BTreeMap<String, BTreeSet<&'static str>>>,
    /// Where the policy came from (its file, and the key it sits under in a run file), for the
    /// errors of [`Policy::check_unmatched`].
    #[serde(skip)]
    location: (String, String),
}

/// One step of the merge: the accumulated setting, plus the key that set it.
fn apply(acc: &mut Option<QuantizerSettings>, step: Option<&SlotSetting>) {
    match step {
        None => {}
        Some(SlotSetting::Float) => *acc = None,
        Some(SlotSetting::Quantize(s)) => *acc = Some(acc.clone().unwrap_or_default().merged(s)),
    }
}

impl Policy {
    /// Parses and validates a policy from TOML text. `origin` names the source in errors.
    ///
    /// # Errors
    /// [`ConfigError::Parse`] for syntax, unknown keys and bad values (with the key path),
    /// [`ConfigError::Invalid`] for combinations no quantizer supports, unknown platforms and
    /// invalid patterns.
    pub fn from_toml_str(text: &str, origin: &str) -> std::result::Result<Policy, ConfigError> {
        let mut policy: Policy = deserialize_toml(text, origin)?;
        policy.validate(origin, "")?;
        policy.set_location(origin, "");
        Ok(policy)
    }

    /// Reads and validates a policy file (a regular file of at most [`MAX_CONFIG_FILE_BYTES`];
    /// see [`read_config_file`]).
    ///
    /// # Errors
    /// See [`Policy::from_toml_str`]; also [`ConfigError::Read`].
    pub fn from_file(path: &Path) -> std::result::Result<Policy, ConfigError> {
        let text = read_config_file(path)?;
        Policy::from_toml_str(&text, &path.display().to_string())
    }

    /// Whether the platform computes layers of `kind` in float (their slots then stay float
    /// unless the policy's kind table or an override turns them on).
    fn platform_keeps_float(&self, kind: LayerKind) -> Result<bool> {
        match &self.platform {
            Some(name) if name.len() <= MAX_NAME_BYTES => {
                Ok(find_platform(name)?.float_kinds.contains(&kind))
            }
            _ => Ok(false),
        }
    }

    /// The platform's defaults, or empty settings.
    fn base(&self) -> Result<(QuantizerSettings, QuantizerSettings)> {
        match &self.platform {
            Some(name) if name.len() > MAX_NAME_BYTES => Err(QuantError::InvalidValue {
                what: "platform".into(),
                value: quant_runtime::fs::shorten(name).into_owned(),
                expected: format!(
                    "the name of a registered platform (at most {MAX_NAME_BYTES} bytes)"
                ),
            }),
            Some(name) => {
                let p = find_platform(name)?;
                Ok((p.weights, p.input))
            }
            None => Ok(Default::default()),
        }
    }

    /// Checks everything that can be checked without a model (done by the loaders; call it for
    /// a policy embedded in a larger file, with the table's key as `key_prefix`).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key: unknown platform, invalid pattern, a slot the
    /// kind does not have, incomplete or unsupported settings.
    pub fn validate(&self, origin: &str, key_prefix: &str) -> std::result::Result<(), ConfigError> {
        let invalid = |key: &str, source: QuantError| ConfigError::Invalid {
            origin: origin.to_string(),
            key: join_name(key_prefix, key),
            source,
        };
        let (default_w, default_i) = self.defaults().map_err(|e| invalid("platform", e))?;
        for check in [self.adaround.validate(), self.gptq.validate()] {
            check.map_err(|e| {
                let field = match &e {
                    QuantError::InvalidValue { what, .. } => what.clone(),
                    _ => "adaround".into(),
                };
                invalid(&field, e)
            })?;
        }
        // Each place a setting can come from, checked merged onto the defaults it extends.
        let mut checks: Vec<(String, Option<QuantizerSettings>, QuantizationTarget)> = vec![
            (
                "weights".into(),
                default_w.clone(),
                QuantizationTarget::Weights,
            ),
            (
                "input".into(),
                default_i.clone(),
                QuantizationTarget::Activation,
            ),
        ];
        let defaults_of = |t: QuantizationTarget| match t {
            QuantizationTarget::Weights => default_w.clone(),
            QuantizationTarget::Activation => default_i.clone(),
        };
        // Settings of one table: its groups, and each named slot with the target it has.
        let mut table = |prefix: &str,
                         weights: &Option<SlotSetting>,
                         input: &Option<SlotSetting>,
                         slots: &BTreeMap<String, SlotSetting>,
                         targets: &dyn Fn(&str) -> Option<QuantizationTarget>|
         -> std::result::Result<(), ConfigError> {
            for (key, setting, target) in [
                ("weights", weights, QuantizationTarget::Weights),
                ("input", input, QuantizationTarget::Activation),
            ] {
                if setting.is_some() {
                    let mut s = defaults_of(target);
                    apply(&mut s, setting.as_ref());
                    checks.push((join_name(prefix, key), s, target));
                }
            }
            for (name, setting) in slots {
                let key = join_name(prefix, &format!("slots.{name}"));
                let target = targets(name).ok_or_else(|| {
                    invalid(
                        &key,
                        QuantError::InvalidValue {
                            what: "slot".into(),
                            value: name.clone(),
                            expected: "a slot of the layer kind (see LayerKind::slots)".into(),
                        },
                    )
                })?;
                let mut s = defaults_of(target);
                apply(&mut s, Some(setting));
                checks.push((key, s, target));
            }
            Ok(())
        };
        for (kind, s) in &self.kinds {
            let prefix = format!("kinds.{kind}");
            if s.weights.is_some() && !kind.has_weights() {
                return Err(invalid(
                    &join_name(&prefix, "weights"),
                    QuantError::InvalidValue {
                        what: "weights".into(),
                        value: kind.to_string(),
                        expected: format!("no weights settings: {kind} layers have no weights"),
                    },
                ));
            }
            let kind = *kind;
            table(&prefix, &s.weights, &s.input, &s.slots, &|name: &str| {
                slot_target(kind, name)
            })?;
        }
        for (n, o) in self.overrides.iter().enumerate() {
            let prefix = format!("overrides[{n}]");
            glob(&o.pattern).map_err(|e| invalid(&join_name(&prefix, "pattern"), e))?;
            // A named slot may belong to any kind (a custom layer's field): both targets are
            // checked where the name does not say.
            table(&prefix, &o.weights, &o.input, &o.slots, &|name: &str| {
                LayerKind::ALL
                    .iter()
                    .find_map(|k| k.slots().iter().find(|s| s.name == name))
                    .map(|s| s.target)
                    .or(Some(QuantizationTarget::Weights))
            })?;
        }
        for (key, settings, target) in checks {
            if let Some(s) = settings {
                s.to_spec(target).map_err(|e| invalid(&key, e))?;
            }
        }
        Ok(())
    }

    /// The default settings of weights slots and of activation slots: the platform's, merged
    /// with `[weights]` and `[input]` (`None` where the file says `"float"`).
    fn defaults(&self) -> Result<(Option<QuantizerSettings>, Option<QuantizerSettings>)> {
        let (base_w, base_i) = self.base()?;
        let mut w = Some(base_w);
        apply(&mut w, self.weights.as_ref());
        let mut i = Some(base_i);
        apply(&mut i, self.input.as_ref());
        Ok((w, i))
    }

    /// The decision for `slot` of layer `name` of `kind` (the merge described in the module
    /// docs): the defaults where the kind is quantized by default; then the kind's table and
    /// every matching override, each turning a float slot on from the defaults of its target.
    ///
    /// # Errors
    /// The merged settings are incomplete or unsupported; the error names the layer and slot.
    pub fn resolve(
        &self,
        name: &str,
        kind: LayerKind,
        slot: Slot,
    ) -> Result<Option<QuantizerSpec>> {
        self.seen
            .borrow_mut()
            .entry(name.to_string())
            .or_default()
            .insert(slot.name);
        self.settings(name, kind, slot)?
            .map(|s| {
                s.to_spec(slot.target)
                    .map_err(|e| e.at(format!("layer `{name}` ({kind}) {}", slot.name)))
            })
            .transpose()
    }

    /// The ONNX layout exports under this policy follow: its platform's
    /// ([`Platform::onnx`](crate::platform::Platform::onnx)), or onnxruntime's standard QDQ
    /// without one.
    ///
    /// # Errors
    /// A platform that is not registered.
    pub fn onnx_convention(&self) -> Result<quant_runtime::export::onnx::OnnxConvention> {
        match &self.platform {
            Some(name) if name.len() <= MAX_NAME_BYTES => Ok(find_platform(name)?.onnx),
            Some(_) => self.base().map(|_| Default::default()),
            None => Ok(Default::default()),
        }
    }

    /// What runs on a weights slot after calibration ([`crate::ptq`]): the slot's
    /// `learned_rounding` and `bias_correction`, merged as every other setting. A float slot
    /// asks for nothing.
    ///
    /// # Errors
    /// An invalid pattern or platform.
    pub fn refinement(&self, name: &str, kind: LayerKind, slot: Slot) -> Result<Refinement> {
        if slot.target != QuantizationTarget::Weights {
            return Ok(Refinement::default());
        }
        Ok(self
            .settings(name, kind, slot)?
            .map(|s| Refinement {
                rounding: s.learned_rounding.unwrap_or_default(),
                bias_correction: s.bias_correction.unwrap_or(false),
            })
            .unwrap_or_default())
    }

    /// The SmoothQuant strength asked of an activation slot ([`crate::ptq::smooth`]): its
    /// `smoothing`, merged as every other setting; `None` for a float slot, a weights slot or
    /// none set.
    ///
    /// # Errors
    /// An invalid pattern or platform.
    pub fn smoothing(&self, name: &str, kind: LayerKind, slot: Slot) -> Result<Option<f64>> {
        if slot.target != QuantizationTarget::Activation {
            return Ok(None);
        }
        Ok(self.settings(name, kind, slot)?.and_then(|s| s.smoothing))
    }

    /// The merged settings of a slot, `None` when it stays float.
    fn settings(
        &self,
        name: &str,
        kind: LayerKind,
        slot: Slot,
    ) -> Result<Option<QuantizerSettings>> {
        let (default_w, default_i) = self.defaults()?;
        let defaults = match slot.target {
            QuantizationTarget::Weights => default_w,
            QuantizationTarget::Activation => default_i,
        };
        let by_default =
            kind.quantized_by_default() && !slot.optional && !self.platform_keeps_float(kind)?;
        let mut acc = if by_default { defaults.clone() } else { None };
        let mut step = |setting: Option<&SlotSetting>| {
            if acc.is_none() && matches!(setting, Some(SlotSetting::Quantize(_))) {
                acc = defaults.clone();
            }
            apply(&mut acc, setting);
        };
        if let Some(s) = self.kinds.get(&kind) {
            for setting in steps(&s.weights, &s.input, &s.slots, slot) {
                step(setting);
            }
        }
        for o in &self.overrides {
            if glob(&o.pattern)?.is_match(name) {
                for setting in steps(&o.weights, &o.input, &o.slots, slot) {
                    step(setting);
                }
            }
        }
        Ok(acc)
    }

    /// Names this policy's origin in the errors of [`Policy::check_unmatched`]: the file, and
    /// the key the policy sits under (`quantization` in a run file; empty for a policy file).
    /// [`Policy::from_toml_str`] sets it.
    pub fn set_location(&mut self, origin: &str, key_prefix: &str) {
        self.location = (origin.to_string(), key_prefix.to_string());
    }

    /// Override patterns that matched none of the layers resolved so far.
    pub fn unmatched(&self) -> Vec<String> {
        let seen = self.seen.borrow();
        self.overrides
            .iter()
            .filter(|o| {
                glob(&o.pattern)
                    .map(|g| !seen.keys().any(|n| g.is_match(n)))
                    .unwrap_or(true)
            })
            .map(|o| o.pattern.clone())
            .collect()
    }

    /// After a conversion: checks every override against the layers the conversion resolved.
    /// An override naming a slot (`slots.input`) that none of the layers it matches has is an
    /// error (a typo would otherwise leave the slot as it was); so is an override matching no
    /// layer, when the policy says `unmatched_patterns = "error"` (the default). Returns the
    /// unmatched patterns otherwise.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the file and the override (`overrides[2].pattern`,
    /// `overrides[0].slots.inptu`), with the layers (or slots) there are.
    pub fn check_unmatched(&self) -> std::result::Result<Vec<String>, ConfigError> {
        let seen = self.seen.borrow();
        let (origin, prefix) = &self.location;
        let invalid = |key: String, value: String, expected: String| ConfigError::Invalid {
            origin: origin.clone(),
            key: join_name(prefix, &key),
            source: QuantError::InvalidValue {
                what: join_name(prefix, &key),
                value,
                expected,
            },
        };
        let mut unmatched = Vec::new();
        for (n, o) in self.overrides.iter().enumerate() {
            let pattern = glob(&o.pattern).map_err(|e| ConfigError::Invalid {
                origin: origin.clone(),
                key: join_name(prefix, &format!("overrides[{n}].pattern")),
                source: e,
            })?;
            let matched: Vec<(&String, &BTreeSet<&'static str>)> = seen
                .iter()
                .filter(|(name, _)| pattern.is_match(name))
                .collect();
            if matched.is_empty() {
                if self.unmatched_patterns == UnmatchedPatterns::Error {
                    return Err(invalid(
                        format!("overrides[{n}].pattern"),
                        format!("`{}`", quant_runtime::fs::shorten(&o.pattern)),
                        format!(
                            "a pattern matching layers of this model ({}), or unmatched_patterns = \"warn\"",
                            listed(seen.keys().map(String::as_str))
                        ),
                    ));
                }
                unmatched.push(o.pattern.clone());
                continue;
            }
            for slot in o.slots.keys() {
                if !matched
                    .iter()
                    .any(|(_, slots)| slots.contains(slot.as_str()))
                {
                    let slots: BTreeSet<&str> = matched
                        .iter()
                        .flat_map(|(_, s)| s.iter().copied())
                        .collect();
                    return Err(invalid(
                        format!("overrides[{n}].slots.{slot}"),
                        format!("`{}`", quant_runtime::fs::shorten(slot)),
                        format!(
                            "a slot of the layers `{}` matches: {}",
                            quant_runtime::fs::shorten(&o.pattern),
                            listed(slots.into_iter())
                        ),
                    ));
                }
            }
        }
        Ok(unmatched)
    }
}

/// Names for a message: all of them, or the first 20 and how many there are.
fn listed<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    if names.len() <= 20 {
        names.join(", ")
    } else {
        format!("{}, … ({} in all)", names[..20].join(", "), names.len())
    }
}

impl LayerPolicy for Policy {
    fn slot(&self, layer: &str, kind: LayerKind, slot: Slot) -> Result<Option<QuantizerSpec>> {
        self.resolve(layer, kind, slot)
    }
}

/// The target of slot `name` of a layer of `kind`; any name for a custom layer, whose slots
/// are its own (weights fields, or `input`).
fn slot_target(kind: LayerKind, name: &str) -> Option<QuantizationTarget> {
    if kind == LayerKind::Custom {
        return Some(if name == Slot::INPUT.name {
            QuantizationTarget::Activation
        } else {
            QuantizationTarget::Weights
        });
    }
    kind.slots()
        .iter()
        .find(|s| s.name == name)
        .map(|s| s.target)
}

/// Deserializes a policy or run file's TOML text, its errors as [`ConfigError::Parse`] with the
/// key path (where the parser failed before any key was known, the key written on the
/// offending line under its table) and the line, column and byte offset; `origin` names the
/// text in them.
///
/// # Errors
/// Syntax errors, unknown keys, wrong types and bad values.
pub fn deserialize_toml<T: serde::de::DeserializeOwned>(
    text: &str,
    origin: &str,
) -> std::result::Result<T, ConfigError> {
    // toml 1 parses the whole text first (syntax errors, at the top level), then deserializes
    // (keys and values, with their path).
    let de = toml::Deserializer::parse(text)
        .map_err(|e| toml_parse_error(origin, text, ".".into(), &e))?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let key = e.path().to_string();
        toml_parse_error(origin, text, key, &e.into_inner())
    })
}

/// A TOML error as a [`ConfigError::Parse`]: the key path serde reported, or, when the TOML
/// parser failed before any key was known (syntax errors, numbers too large for their type),
/// the key written on the offending line under its table (`qat.batch_size`,
/// `overrides[1].pattern`); the message gains the line, column and byte offset. `key` is the
/// path serde reported (`.` for none). [`deserialize_toml`] maps every error through it.
fn toml_parse_error(origin: &str, text: &str, key: String, e: &toml::de::Error) -> ConfigError {
    let mut message = e.message().to_string();
    let mut key = key;
    if let Some(start) = e.span().map(|s| s.start.min(text.len())) {
        let before = text.get(..start).unwrap_or("");
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        message = format!("{message} (line {line}, column {column}, at byte {start})");
        if key == "." || key.is_empty() {
            if let Some(found) = key_at_line(text, line) {
                key = found;
            }
        }
    }
    // A key or value can be as long as the file: messages quote at most a readable part.
    ConfigError::Parse {
        origin: origin.to_string(),
        key: quant_runtime::fs::shorten(&key).into_owned(),
        message: quant_runtime::fs::shorten_quoted(&message).into_owned(),
    }
}

/// The dotted key assigned on 1-based line `line` of a TOML text, under the table header before
/// it (`[a.b]`, or `[[a]]` counted as `a[i]`), when the line reads `key = ...`.
fn key_at_line(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let this = lines.get(line.checked_sub(1)?)?.trim();
    let (name, _) = this.split_once('=')?;
    let name = name.trim().trim_matches('"');
    if name.is_empty() || name.starts_with('[') || name.starts_with('#') {
        return None;
    }
    let mut table = String::new();
    for (i, l) in lines[..line - 1].iter().enumerate().rev() {
        let l = l.trim();
        if let Some(inner) = l.strip_prefix("[[").and_then(|r| r.split_once("]]")) {
            let header = inner.0.trim();
            let index = lines[..i]
                .iter()
                .filter(|p| {
                    p.trim()
                        .strip_prefix("[[")
                        .and_then(|r| r.split_once("]]"))
                        .is_some_and(|(h, _)| h.trim() == header)
                })
                .count();
            table = format!("{header}[{index}]");
            break;
        }
        if let Some(inner) = l.strip_prefix('[').and_then(|r| r.split_once(']')) {
            table = inner.0.trim().to_string();
            break;
        }
    }
    Some(if table.is_empty() {
        name.to_string()
    } else {
        format!("{table}.{name}")
    })
}
