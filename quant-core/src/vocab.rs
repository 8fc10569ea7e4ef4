//! The vocabulary: what is quantized, how the grid is laid out, how a quantizer is trained,
//! and how values are rounded. Every type serialises with the same spelling as in code.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::QuantError;

/// What a quantizer is applied to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum QuantizationTarget {
    /// A layer's weights (constant during inference).
    Weights,
    /// Activations: a layer's input or any tensor flowing through the model.
    Activation,
}

impl QuantizationTarget {
    /// Every target, in declaration order.
    pub const ALL: [QuantizationTarget; 2] =
        [QuantizationTarget::Weights, QuantizationTarget::Activation];

    /// The name as written in code and config files.
    pub const fn name(self) -> &'static str {
        match self {
            QuantizationTarget::Weights => "Weights",
            QuantizationTarget::Activation => "Activation",
        }
    }
}

impl fmt::Display for QuantizationTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How the integer grid is laid over the real line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum QuantizationMethod {
    /// Symmetric around zero, zero point 0, scale derived from a threshold.
    Symmetric,
    /// Symmetric with the threshold rounded up to a power of two (shift-only rescaling).
    PowerOfTwo,
    /// Asymmetric (affine) over a `[min, max]` range that is nudged so 0 is exactly representable.
    Uniform,
}

impl QuantizationMethod {
    /// Every method, in declaration order.
    pub const ALL: [QuantizationMethod; 3] = [
        QuantizationMethod::Symmetric,
        QuantizationMethod::PowerOfTwo,
        QuantizationMethod::Uniform,
    ];

    /// The name as written in code and config files.
    pub const fn name(self) -> &'static str {
        match self {
            QuantizationMethod::Symmetric => "Symmetric",
            QuantizationMethod::PowerOfTwo => "PowerOfTwo",
            QuantizationMethod::Uniform => "Uniform",
        }
    }

    /// Whether the zero point is always 0.
    pub const fn is_symmetric(self) -> bool {
        matches!(
            self,
            QuantizationMethod::Symmetric | QuantizationMethod::PowerOfTwo
        )
    }
}

impl fmt::Display for QuantizationMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a trainable quantizer is trained: the id under which quantizers register.
///
/// Built-in ids are the associated constants [`TrainingMethod::Ste`], [`TrainingMethod::Lsq`],
/// [`TrainingMethod::Pact`] and [`TrainingMethod::Dsq`]. A downstream crate adds its own id
/// without editing quant-core with [`training_methods!`](crate::training_methods), and then
/// writes `TrainingMethod::MyTraining` in code exactly like a built-in one. In config files an id
/// is written by name (`"Lsq"`, `"MyTraining"`); deserialising checks the name against every
/// built-in and registered id.
///
/// ```
/// use quant_core::TrainingMethod;
/// quant_core::training_methods!(pub trait MyMethods { MyTraining });
///
/// let id = TrainingMethod::MyTraining;
/// assert_eq!(id.name(), "MyTraining");
/// assert_eq!(TrainingMethod::from_name("MyTraining").unwrap(), id);
/// let parsed: TrainingMethod = serde_json::from_str("\"MyTraining\"").unwrap();
/// assert_eq!(parsed, id);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrainingMethod(&'static str);

#[allow(non_upper_case_globals)]
impl TrainingMethod {
    /// Straight-through estimator: fixed quantization parameters, identity gradient inside the range.
    pub const Ste: TrainingMethod = TrainingMethod("Ste");
    /// Learned step size quantization (Esser et al. 2020): the scale (and zero point) learn.
    pub const Lsq: TrainingMethod = TrainingMethod("Lsq");
    /// Parameterized clipping activation (Choi et al. 2018): the clip value α learns.
    pub const Pact: TrainingMethod = TrainingMethod("Pact");
    /// Differentiable soft quantization (Gong et al. 2019): α and the range learn.
    pub const Dsq: TrainingMethod = TrainingMethod("Dsq");

    /// The built-in ids.
    pub const BUILT_IN: [TrainingMethod; 4] = [Self::Ste, Self::Lsq, Self::Pact, Self::Dsq];

    /// Creates an id. Downstream crates normally use [`training_methods!`](crate::training_methods),
    /// which also registers the name so config files can use it.
    ///
    /// The name must be a Rust identifier (it is written as `TrainingMethod::Name` in code);
    /// anything else fails at compile time when used in a `const`.
    pub const fn new(name: &'static str) -> TrainingMethod {
        let bytes = name.as_bytes();
        assert!(!bytes.is_empty(), "a training-method name cannot be empty");
        assert!(
            bytes[0].is_ascii_alphabetic() || bytes[0] == b'_',
            "a training-method name must start with a letter or `_`"
        );
        let mut i = 1;
        while i < bytes.len() {
            assert!(
                bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_',
                "a training-method name may only contain letters, digits and `_`"
            );
            i += 1;
        }
        TrainingMethod(name)
    }

    /// The name as written in code and config files.
    pub const fn name(self) -> &'static str {
        self.0
    }

    /// Finds a built-in or registered id by name (exact spelling).
    ///
    /// # Errors
    /// [`QuantError::UnknownTrainingMethod`] listing the known names.
    pub fn from_name(name: &str) -> Result<TrainingMethod, QuantError> {
        TrainingMethod::known()
            .into_iter()
            .find(|m| m.0 == name)
            .ok_or_else(|| QuantError::UnknownTrainingMethod {
                name: name.to_string(),
                known: TrainingMethod::known()
                    .iter()
                    .map(|m| m.0)
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// Every id known in this program: built-ins, ids declared with
    /// [`training_methods!`](crate::training_methods), and ids used by registered quantizers.
    /// Sorted by name, no duplicates.
    pub fn known() -> Vec<TrainingMethod> {
        let mut all: Vec<TrainingMethod> = TrainingMethod::BUILT_IN.to_vec();
        all.extend(crate::registry::TRAINING_METHODS.iter().copied());
        all.extend(
            crate::registry::QUANTIZERS
                .iter()
                .map(|e| e.metadata.training_method),
        );
        all.sort();
        all.dedup();
        all
    }
}

impl fmt::Debug for TrainingMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TrainingMethod::{}", self.0)
    }
}

impl fmt::Display for TrainingMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl Serialize for TrainingMethod {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for TrainingMethod {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(d)?;
        TrainingMethod::from_name(&name).map_err(serde::de::Error::custom)
    }
}

/// Declares new [`TrainingMethod`] ids in a downstream crate, usable as
/// `TrainingMethod::Name` (the trait must be in scope) and by name in config files.
///
/// ```
/// use quant_core::TrainingMethod;
/// quant_core::training_methods!(pub trait ResearchMethods { MyTraining, HalfwaveLsq });
/// assert_eq!(TrainingMethod::HalfwaveLsq.name(), "HalfwaveLsq");
/// ```
///
/// The expansion is an extension trait with one associated constant per id, implemented for
/// [`TrainingMethod`], plus a registration of each name (so that a config file naming it
/// deserialises). As with every registration, the declaring crate must be linked: see
/// [`registry`](crate::registry) for the `use my_crate as _;` rule.
#[macro_export]
macro_rules! training_methods {
    ($(#[$attr:meta])* $vis:vis trait $trait_name:ident { $($name:ident),+ $(,)? }) => {
        $(#[$attr])*
        #[allow(non_upper_case_globals)]
        $vis trait $trait_name {
            $(
                #[doc = concat!("The `", stringify!($name), "` training method.")]
                const $name: $crate::TrainingMethod;
            )+
        }
        #[allow(non_upper_case_globals)]
        impl $trait_name for $crate::TrainingMethod {
            $(const $name: $crate::TrainingMethod = $crate::TrainingMethod::new(stringify!($name));)+
        }
        $(
            const _: () = {
                #[$crate::__private::linkme::distributed_slice($crate::__private::TRAINING_METHODS)]
                #[linkme(crate = $crate::__private::linkme)]
                static REGISTRATION: $crate::TrainingMethod =
                    <$crate::TrainingMethod as $trait_name>::$name;
            };
        )+
    };
}

/// How a real value is rounded to the integer grid.
///
/// Ties are values exactly halfway between two integers; the policies differ only there,
/// except [`Floor`](RoundingPolicy::Floor) and [`Ceil`](RoundingPolicy::Ceil).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum RoundingPolicy {
    /// Ties to the even integer (PyTorch, TensorRT, IEEE default). `2.5 → 2`, `3.5 → 4`.
    #[default]
    HalfEven,
    /// Ties away from zero (`f32::round`, NCNN). `2.5 → 3`, `-2.5 → -3`.
    HalfAwayFromZero,
    /// Ties towards +∞. `2.5 → 3`, `-2.5 → -2`.
    HalfUp,
    /// Ties towards −∞. `2.5 → 2`, `-2.5 → -3`.
    HalfDown,
    /// Ties towards zero. `2.5 → 2`, `-2.5 → -2`.
    HalfTowardZero,
    /// Always down (`floor`).
    Floor,
    /// Always up (`ceil`).
    Ceil,
}

impl RoundingPolicy {
    /// Every policy, in declaration order.
    pub const ALL: [RoundingPolicy; 7] = [
        RoundingPolicy::HalfEven,
        RoundingPolicy::HalfAwayFromZero,
        RoundingPolicy::HalfUp,
        RoundingPolicy::HalfDown,
        RoundingPolicy::HalfTowardZero,
        RoundingPolicy::Floor,
        RoundingPolicy::Ceil,
    ];

    /// Rounds one value (scalar reference implementation; the kernels use a vectorised
    /// formulation that agrees with it on every input).
    pub fn round(self, v: f32) -> f32 {
        match self {
            RoundingPolicy::HalfEven => v.round_ties_even(),
            RoundingPolicy::HalfAwayFromZero => v.round(),
            RoundingPolicy::HalfUp => {
                let f = v.floor();
                if v - f >= 0.5 {
                    f + 1.0
                } else {
                    f
                }
            }
            RoundingPolicy::HalfDown => {
                let c = v.ceil();
                if c - v >= 0.5 {
                    c - 1.0
                } else {
                    c
                }
            }
            RoundingPolicy::HalfTowardZero => {
                let t = v.trunc();
                if (v - t).abs() > 0.5 {
                    t + v.signum()
                } else {
                    t
                }
            }
            RoundingPolicy::Floor => v.floor(),
            RoundingPolicy::Ceil => v.ceil(),
        }
    }
}

impl fmt::Display for RoundingPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
