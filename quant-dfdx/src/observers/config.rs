//! The observer a policy file names: [`ObserverConfig`] and its validated option types.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use quant_core::{QuantError, Result};

use super::histogram::{EntropyObserver, MseObserver, PercentileObserver};
use super::lsq::LsqInitObserver;
use super::minmax::{MinMaxObserver, MovingAverageMinMaxObserver};
use super::Observer;

/// A checked option of an observer: the newtype `$name($ty)`, its `DEFAULT`, `new` (which
/// accepts what `$valid` accepts and otherwise names option `$key` and what it may be), `get`
/// and `Default`.
macro_rules! checked_option {
    (
        $(#[$attr:meta])*
        pub struct $name:ident($ty:ty) = $default:expr;
        $key:literal: |$v:ident| $valid:expr, else $expected:expr;
    ) => {
        $(#[$attr])*
        pub struct $name($ty);

        impl $name {
            /// The default.
            pub const DEFAULT: $name = $name($default);

            /// Checks the value (see the type's docs).
            ///
            /// # Errors
            /// [`QuantError::InvalidValue`] otherwise, NaN included.
            pub fn new($v: $ty) -> Result<$name> {
                if $valid {
                    Ok($name($v))
                } else {
                    Err(QuantError::InvalidValue {
                        what: $key.into(),
                        value: $v.to_string(),
                        expected: $expected.into(),
                    })
                }
            }

            /// The value.
            pub fn get(self) -> $ty {
                self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                $name::DEFAULT
            }
        }
    };
}

checked_option! {
    /// The smoothing constant `c` of [`MovingAverageMinMaxObserver`]: `v += c·(v_batch − v)`,
    /// with `0 < c ≤ 1` (1 keeps only the last batch); PyTorch's `averaging_constant` 0.01 by
    /// default.
    #[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
    pub struct Momentum(f64) = 0.01;
    "momentum": |c| c > 0.0 && c <= 1.0, else "a number in (0, 1] (default 0.01)";
}

checked_option! {
    /// The percentile of [`PercentileObserver`], in `(50, 100]`: the share of values (or of
    /// `|x|`) the chosen range keeps. 100 keeps everything, like MinMax. 99.99 by default
    /// (PPQ's and NVIDIA's usual choice).
    #[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
    pub struct Percentile(f64) = 99.99;
    "percentile": |p| p > 50.0 && p <= 100.0, else "a number in (50, 100] (default 99.99)";
}

checked_option! {
    /// The number of histogram bins of `|x|`, in `8..=65536`; TensorRT's 2048 by default.
    /// The signed histogram the observers keep has twice as many.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub struct HistogramBins(usize) = 2048;
    "bins": |bins| (HistogramBins::MIN..=HistogramBins::MAX).contains(&bins),
        else "an integer in 8..=65536 (default 2048)";
}

impl HistogramBins {
    /// Fewest bins.
    pub const MIN: usize = 8;
    /// Most bins.
    pub const MAX: usize = 1 << 16;
}

/// Which observer to use, as written in code and in policy files.
///
/// In a file, a bare name uses the defaults; a table names the `kind` and any options:
///
/// ```toml
/// observer = "MinMax"
/// observer = { kind = "MovingAverageMinMax", momentum = 0.01 }
/// observer = { kind = "Percentile", percentile = 99.9, bins = 2048 }
/// observer = { kind = "Mse", bins = 2048 }
/// observer = { kind = "Entropy", bins = 2048 }
/// observer = "LsqInit"
/// ```
///
/// Unknown kinds, unknown options and out-of-range values are errors that list what is valid.
/// [`Display`](fmt::Display) writes the name followed by the options that differ from the
/// defaults, e.g. `Percentile(percentile = 99.9)`.
///
/// ```
/// use quant_dfdx::observers::{ObserverConfig, Percentile, HistogramBins};
/// let c: ObserverConfig = serde_json::from_str(r#"{"kind": "Percentile", "percentile": 99.9}"#).unwrap();
/// assert_eq!(c, ObserverConfig::Percentile { percentile: Percentile::new(99.9).unwrap(), bins: HistogramBins::DEFAULT });
/// assert_eq!(c.to_string(), "Percentile(percentile = 99.9)");
/// let err = serde_json::from_str::<ObserverConfig>(r#""Histogram""#).unwrap_err().to_string();
/// assert!(err.contains("valid kinds: MinMax, MovingAverageMinMax, Percentile, Mse, Entropy, LsqInit"), "{err}");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum ObserverConfig {
    /// [`MinMaxObserver`].
    #[default]
    MinMax,
    /// [`MovingAverageMinMaxObserver`].
    MovingAverageMinMax {
        /// The smoothing constant.
        momentum: Momentum,
    },
    /// [`PercentileObserver`].
    Percentile {
        /// The percentile.
        percentile: Percentile,
        /// Histogram bins of `|x|`.
        bins: HistogramBins,
    },
    /// [`MseObserver`].
    Mse {
        /// Histogram bins of `|x|`.
        bins: HistogramBins,
    },
    /// [`EntropyObserver`].
    Entropy {
        /// Histogram bins of `|x|`.
        bins: HistogramBins,
    },
    /// [`LsqInitObserver`].
    LsqInit,
}

/// Every kind, in the order error messages list them.
const KINDS: [&str; 6] = [
    "MinMax",
    "MovingAverageMinMax",
    "Percentile",
    "Mse",
    "Entropy",
    "LsqInit",
];

impl ObserverConfig {
    /// The kind's name as written in files (`"Percentile"`).
    pub const fn kind(&self) -> &'static str {
        match self {
            ObserverConfig::MinMax => "MinMax",
            ObserverConfig::MovingAverageMinMax { .. } => "MovingAverageMinMax",
            ObserverConfig::Percentile { .. } => "Percentile",
            ObserverConfig::Mse { .. } => "Mse",
            ObserverConfig::Entropy { .. } => "Entropy",
            ObserverConfig::LsqInit => "LsqInit",
        }
    }

    /// The kind `name` with default options.
    ///
    /// # Errors
    /// [`QuantError::InvalidValue`] listing the valid kinds.
    pub fn from_kind(name: &str) -> Result<ObserverConfig> {
        Ok(match name {
            "MinMax" => ObserverConfig::MinMax,
            "MovingAverageMinMax" => ObserverConfig::MovingAverageMinMax {
                momentum: Momentum::DEFAULT,
            },
            "Percentile" => ObserverConfig::Percentile {
                percentile: Percentile::DEFAULT,
                bins: HistogramBins::DEFAULT,
            },
            "Mse" => ObserverConfig::Mse {
                bins: HistogramBins::DEFAULT,
            },
            "Entropy" => ObserverConfig::Entropy {
                bins: HistogramBins::DEFAULT,
            },
            "LsqInit" => ObserverConfig::LsqInit,
            other => {
                return Err(QuantError::InvalidValue {
                    what: "observer kind".into(),
                    value: format!("`{other}`"),
                    expected: format!("valid kinds: {}", KINDS.join(", ")),
                })
            }
        })
    }

    /// The option keys this kind accepts besides `kind`.
    pub const fn options(&self) -> &'static [&'static str] {
        match self {
            ObserverConfig::MinMax | ObserverConfig::LsqInit => &[],
            ObserverConfig::MovingAverageMinMax { .. } => &["momentum"],
            ObserverConfig::Percentile { .. } => &["percentile", "bins"],
            ObserverConfig::Mse { .. } | ObserverConfig::Entropy { .. } => &["bins"],
        }
    }

    /// A fresh observer of this kind.
    pub fn build(&self) -> Box<dyn Observer> {
        match *self {
            ObserverConfig::MinMax => Box::new(MinMaxObserver::new()),
            ObserverConfig::MovingAverageMinMax { momentum } => {
                Box::new(MovingAverageMinMaxObserver::new(momentum))
            }
            ObserverConfig::Percentile { percentile, bins } => {
                Box::new(PercentileObserver::new(percentile, bins))
            }
            ObserverConfig::Mse { bins } => Box::new(MseObserver::new(bins)),
            ObserverConfig::Entropy { bins } => Box::new(EntropyObserver::new(bins)),
            ObserverConfig::LsqInit => Box::new(LsqInitObserver::new()),
        }
    }

    /// The options that differ from the defaults, as `(key, value)` text.
    fn non_default_options(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        match *self {
            ObserverConfig::MovingAverageMinMax { momentum } if momentum != Momentum::DEFAULT => {
                out.push(("momentum", momentum.get().to_string()));
            }
            ObserverConfig::Percentile { percentile, bins } => {
                if percentile != Percentile::DEFAULT {
                    out.push(("percentile", percentile.get().to_string()));
                }
                if bins != HistogramBins::DEFAULT {
                    out.push(("bins", bins.get().to_string()));
                }
            }
            ObserverConfig::Mse { bins } | ObserverConfig::Entropy { bins }
                if bins != HistogramBins::DEFAULT =>
            {
                out.push(("bins", bins.get().to_string()));
            }
            _ => {}
        }
        out
    }

    /// Sets option `key` of this kind from `value`.
    fn set(&mut self, key: &str, value: &Value) -> std::result::Result<(), String> {
        let (kind, valid) = (self.kind(), self.options());
        let unknown = || {
            if valid.is_empty() {
                format!(
                    "observer `{kind}` has no option `{key}`; it takes no options (only `kind`)"
                )
            } else {
                format!(
                    "observer `{kind}` has no option `{key}`; valid options: kind, {}",
                    valid.join(", ")
                )
            }
        };
        match (self, key) {
            (ObserverConfig::MovingAverageMinMax { momentum }, "momentum") => {
                *momentum = Momentum::new(value.number(key)?).map_err(|e| e.to_string())?;
            }
            (ObserverConfig::Percentile { percentile, .. }, "percentile") => {
                *percentile = Percentile::new(value.number(key)?).map_err(|e| e.to_string())?;
            }
            (
                ObserverConfig::Percentile { bins, .. }
                | ObserverConfig::Mse { bins }
                | ObserverConfig::Entropy { bins },
                "bins",
            ) => {
                *bins = HistogramBins::new(value.integer(key)?).map_err(|e| e.to_string())?;
            }
            _ => return Err(unknown()),
        }
        Ok(())
    }
}

impl fmt::Display for ObserverConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind())?;
        let options = self.non_default_options();
        if !options.is_empty() {
            let list: Vec<String> = options.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            write!(f, "({})", list.join(", "))?;
        }
        Ok(())
    }
}

impl FromStr for ObserverConfig {
    type Err = QuantError;

    /// A bare kind name with default options.
    fn from_str(s: &str) -> Result<Self> {
        ObserverConfig::from_kind(s.trim())
    }
}

impl Serialize for ObserverConfig {
    /// A bare name when every option is the default, else a table with `kind` and every option.
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        if self.non_default_options().is_empty() {
            return s.serialize_str(self.kind());
        }
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("kind", self.kind())?;
        match *self {
            ObserverConfig::MovingAverageMinMax { momentum } => {
                map.serialize_entry("momentum", &momentum.get())?
            }
            ObserverConfig::Percentile { percentile, bins } => {
                map.serialize_entry("percentile", &percentile.get())?;
                map.serialize_entry("bins", &bins.get())?;
            }
            ObserverConfig::Mse { bins } | ObserverConfig::Entropy { bins } => {
                map.serialize_entry("bins", &bins.get())?
            }
            ObserverConfig::MinMax | ObserverConfig::LsqInit => {}
        }
        map.end()
    }
}

/// An option value as any self-describing format (TOML, JSON) gives it.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Int(i128),
    Float(f64),
    Other(&'static str),
}

impl Value {
    fn number(&self, key: &str) -> std::result::Result<f64, String> {
        match self {
            Value::Int(i) => Ok(*i as f64),
            Value::Float(f) => Ok(*f),
            Value::Other(t) => Err(format!("observer option `{key}` must be a number, not {t}")),
        }
    }

    fn integer(&self, key: &str) -> std::result::Result<usize, String> {
        match self {
            Value::Int(i) => usize::try_from(*i).map_err(|_| {
                format!(
                    "bins = {i} is invalid: an integer in {}..={} (default 2048)",
                    HistogramBins::MIN,
                    HistogramBins::MAX
                )
            }),
            Value::Float(f) => Err(format!(
                "observer option `{key}` must be an integer, not the float {f}"
            )),
            Value::Other(t) => Err(format!(
                "observer option `{key}` must be an integer, not {t}"
            )),
        }
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Value;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an option value")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Value, E> {
                Ok(Value::Int(i128::from(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Value, E> {
                Ok(Value::Int(i128::from(v)))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Value, E> {
                Ok(Value::Float(v))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> std::result::Result<Value, E> {
                Ok(Value::Other("a boolean"))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> std::result::Result<Value, E> {
                Ok(Value::Other("a string"))
            }
            fn visit_unit<E: de::Error>(self) -> std::result::Result<Value, E> {
                Ok(Value::Other("null"))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Value, A::Error> {
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                Ok(Value::Other("an array"))
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Value, A::Error> {
                while map
                    .next_entry::<de::IgnoredAny, de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Value::Other("a table"))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for ObserverConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ObserverConfig;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(
                    f,
                    "an observer: one of {} or a table {{ kind = \"...\", ... }}",
                    KINDS.join(", ")
                )
            }

            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<ObserverConfig, E> {
                ObserverConfig::from_kind(v).map_err(E::custom)
            }

            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<ObserverConfig, A::Error> {
                // The kind may come after the options (JSON has no order), so collect first.
                let mut kind: Option<String> = None;
                let mut options: Vec<(String, Value)> = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    if key == "kind" {
                        if kind.is_some() {
                            return Err(de::Error::custom(
                                "duplicate key `kind` in observer table",
                            ));
                        }
                        kind = Some(map.next_value::<String>().map_err(|e| {
                            de::Error::custom(format!(
                                "observer `kind` must be one of {}: {e}",
                                KINDS.join(", ")
                            ))
                        })?);
                    } else {
                        if options.iter().any(|(k, _)| *k == key) {
                            return Err(de::Error::custom(format!(
                                "duplicate key `{key}` in observer table"
                            )));
                        }
                        let value = map.next_value::<Value>()?;
                        options.push((key, value));
                    }
                }
                let kind = kind.ok_or_else(|| {
                    de::Error::custom(format!(
                        "observer table needs a `kind` key; valid kinds: {}",
                        KINDS.join(", ")
                    ))
                })?;
                let mut config = ObserverConfig::from_kind(&kind).map_err(de::Error::custom)?;
                for (key, value) in &options {
                    config.set(key, value).map_err(de::Error::custom)?;
                }
                Ok(config)
            }
        }
        d.deserialize_any(V)
    }
}
