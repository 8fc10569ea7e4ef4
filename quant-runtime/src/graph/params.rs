//! Parameters of graph ops (weights, biases, per-channel affine factors) and exported
//! quantizers.

use serde::{Deserialize, Serialize};

use quant_core::{InferableQuantizer, QuantizationMethod};

/// Provenance of an exported quantizer: which trainable quantizer produced it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuantizerOrigin {
    /// Training method id (`Lsq`, ...), by name: custom ids of crates not linked into the
    /// loading program still load.
    pub training_method: String,
    /// Registry name of the trainable quantizer, when registered.
    pub quantizer: Option<String>,
    /// Bit width.
    pub bits: u32,
    /// Grid layout.
    pub method: QuantizationMethod,
}

/// An exported quantizer: the inferable form plus where it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportedQuantizer {
    /// The deployable quantizer.
    pub inferable: InferableQuantizer,
    /// Where it came from.
    pub origin: QuantizerOrigin,
}

/// The values of a [`Parameter`].
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValues {
    /// Float values.
    Float(Vec<f32>),
    /// Integer codes on `quantizer`'s grid (per tensor, or per channel along axis 0): the
    /// weight a quantized layer computes with is `(code - zero_point) · scale`.
    Codes {
        /// The codes, row-major in the op's parameter shape.
        codes: Vec<i32>,
        /// Their quantizer.
        quantizer: ExportedQuantizer,
    },
    /// A bias held in int32 at the scale of its layer's accumulator, `s_input · s_weight[o]`
    /// (zero point 0), as integer deployment holds it.
    Accumulator(Vec<i32>),
}

impl ParamValues {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            ParamValues::Float(v) => v.len(),
            ParamValues::Codes { codes, .. } => codes.len(),
            ParamValues::Accumulator(v) => v.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The name of the encoding, as the metadata writes it.
    pub fn encoding(&self) -> &'static str {
        match self {
            ParamValues::Float(_) => "float",
            ParamValues::Codes { .. } => "codes",
            ParamValues::Accumulator(_) => "accumulator",
        }
    }

    /// The quantizer of codes.
    pub fn quantizer(&self) -> Option<&ExportedQuantizer> {
        match self {
            ParamValues::Codes { quantizer, .. } => Some(quantizer),
            _ => None,
        }
    }
}

/// A parameter of an op: its values and the name of the tensor holding them in a tensor file.
#[derive(Debug, Clone, PartialEq)]
pub struct Parameter {
    /// The tensor's name in the tensor file (`fc1.weight`).
    pub tensor: String,
    /// The values.
    pub values: ParamValues,
}

impl Parameter {
    /// A float parameter.
    pub fn float(tensor: impl Into<String>, values: Vec<f32>) -> Parameter {
        Parameter {
            tensor: tensor.into(),
            values: ParamValues::Float(values),
        }
    }
}

/// How a parameter appears in the metadata: its tensor and encoding (the values live in the
/// tensor file).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ParameterRepr {
    tensor: String,
    encoding: Encoding,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    quantizer: Option<ExportedQuantizer>,
}

#[derive(Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Encoding {
    Float,
    Codes,
    Accumulator,
}

impl Serialize for Parameter {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (encoding, quantizer) = match &self.values {
            ParamValues::Float(_) => (Encoding::Float, None),
            ParamValues::Codes { quantizer, .. } => (Encoding::Codes, Some(quantizer.clone())),
            ParamValues::Accumulator(_) => (Encoding::Accumulator, None),
        };
        ParameterRepr {
            tensor: self.tensor.clone(),
            encoding,
            quantizer,
        }
        .serialize(s)
    }
}

/// Deserializes the description only: the values are empty until the loader reads them from
/// the tensor file.
impl<'de> Deserialize<'de> for Parameter {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let r = ParameterRepr::deserialize(d)?;
        let values = match (r.encoding, r.quantizer) {
            (Encoding::Float, None) => ParamValues::Float(Vec::new()),
            (Encoding::Accumulator, None) => ParamValues::Accumulator(Vec::new()),
            (Encoding::Codes, Some(quantizer)) => ParamValues::Codes {
                codes: Vec::new(),
                quantizer,
            },
            (Encoding::Codes, None) => {
                return Err(D::Error::custom(format!(
                    "parameter `{}`: codes need a `quantizer`",
                    super::short(&r.tensor)
                )))
            }
            (_, Some(_)) => {
                return Err(D::Error::custom(format!(
                    "parameter `{}`: only codes have a `quantizer`",
                    super::short(&r.tensor)
                )))
            }
        };
        Ok(Parameter {
            tensor: r.tensor,
            values,
        })
    }
}

/// Checks a quantizer of a value or parameter: per tensor, or (for parameters, `channels`
/// given) per channel along axis 0 with one channel or `channels`.
pub(crate) fn check_quantizer(
    q: &ExportedQuantizer,
    role: &str,
    channels: Option<usize>,
) -> Result<(), String> {
    let qp = q.inferable.qparams();
    let n = qp.channels();
    match (channels, qp.axis()) {
        (_, None) => Ok(()),
        (None, Some(axis)) => Err(format!(
            "{role} must be per tensor; it is per channel on axis {axis} with {n} channels"
        )),
        (Some(c), Some(0)) if n == 1 || n == c => Ok(()),
        (Some(c), Some(0)) => Err(format!(
            "{role} has {n} channels; expected 1 or {c} (one per output channel)"
        )),
        (Some(_), Some(axis)) => Err(format!(
            "{role} is per channel on axis {axis}; only the output channels (axis 0) are supported"
        )),
    }
}

/// Checks a parameter of `numel` values with `channels` output channels along axis 0 (codes
/// allowed when `codes`, accumulator values when `accumulator`).
pub(crate) fn check_parameter(
    p: &Parameter,
    role: &str,
    numel: usize,
    channels: usize,
    allowed: &[&str],
) -> Result<(), String> {
    let encoding = p.values.encoding();
    if !allowed.contains(&encoding) {
        return Err(format!(
            "{role} `{}` is encoded as {encoding}; expected {}",
            super::short(&p.tensor),
            allowed.join(" or ")
        ));
    }
    if p.values.len() != numel {
        return Err(format!(
            "{role} `{}` holds {} values; the op needs {numel}",
            super::short(&p.tensor),
            p.values.len()
        ));
    }
    if let ParamValues::Codes { codes, quantizer } = &p.values {
        check_quantizer(quantizer, role, Some(channels))?;
        let g = quantizer.inferable.grid();
        if let Some(v) = codes
            .iter()
            .find(|v| **v < g.quant_min() || **v > g.quant_max())
        {
            return Err(format!(
                "{role} code {v} lies outside its grid [{}, {}]",
                g.quant_min(),
                g.quant_max()
            ));
        }
    }
    if let ParamValues::Float(v) = &p.values {
        if let Some(x) = v.iter().find(|x| !x.is_finite()) {
            return Err(format!(
                "{role} `{}` holds the non-finite value {x}",
                super::short(&p.tensor)
            ));
        }
    }
    Ok(())
}
