//! The quantizer registry: every struct marked with `#[mark_quantizer]` in any linked crate,
//! found by `(target, method, training method)`.
//!
//! Registration uses a [linkme](https://docs.rs/linkme) distributed slice, so quantizers defined
//! in other crates appear without any central list. **The one caveat:** the linker only keeps
//! a crate whose items the program references. A crate that only defines quantizers and is
//! never otherwise used is dropped, and its registrations with it. Reference it once, e.g.
//! `use my_quantizers as _;` in the binary (or any module that is compiled in).
//!
//! ```
//! use quant_core::{registry, QuantizationMethod, QuantizationTarget, TrainingMethod};
//! // quant-core itself registers nothing; quant-dfdx registers the built-ins.
//! let err = registry::find(QuantizationTarget::Weights, QuantizationMethod::Symmetric, TrainingMethod::new("Nope"))
//!     .unwrap_err();
//! assert!(err.to_string().contains("no quantizer registered"));
//! ```

use std::fmt;

use linkme::distributed_slice;

use crate::config::QuantizerConfig;
use crate::error::{QuantError, Result};
use crate::quantizer::{ActivationQuantizer, TrainableQuantizer, WeightsQuantizer};
use crate::vocab::{QuantizationMethod, QuantizationTarget, TrainingMethod};

/// What `#[mark_quantizer]` records about a quantizer. Usable in `const` context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantizerMetadata {
    /// What it quantizes.
    pub target: QuantizationTarget,
    /// The grid layouts it supports (non-empty, no duplicates).
    pub methods: &'static [QuantizationMethod],
    /// Its training-method id.
    pub training_method: TrainingMethod,
    /// The struct's name.
    pub name: &'static str,
    /// The module that defines it (`module_path!()`).
    pub module_path: &'static str,
}

impl QuantizerMetadata {
    /// Whether it supports `method`.
    pub fn supports(&self, method: QuantizationMethod) -> bool {
        self.methods.contains(&method)
    }

    /// `module::path::Name`.
    pub fn path(&self) -> String {
        format!("{}::{}", self.module_path, self.name)
    }
}

impl fmt::Display for QuantizerMetadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let methods: Vec<&str> = self.methods.iter().map(|m| m.name()).collect();
        write!(
            f,
            "{} [{}] {} ({})",
            self.training_method,
            methods.join(", "),
            self.target,
            self.path()
        )
    }
}

/// Implemented by `#[mark_quantizer]`: the quantizer's metadata as an associated constant.
///
/// ```
/// # use quant_core::{MarkedQuantizer, QuantizerMetadata, QuantizationTarget, QuantizationMethod, TrainingMethod};
/// # struct Foo;
/// # impl MarkedQuantizer for Foo {
/// #     const METADATA: QuantizerMetadata = QuantizerMetadata {
/// #         target: QuantizationTarget::Weights, methods: &[QuantizationMethod::Symmetric],
/// #         training_method: TrainingMethod::Ste, name: "Foo", module_path: module_path!() };
/// # }
/// const TARGET: QuantizationTarget = Foo::METADATA.target;
/// assert_eq!(TARGET, QuantizationTarget::Weights);
/// ```
pub trait MarkedQuantizer {
    /// What the attribute declared.
    const METADATA: QuantizerMetadata;
}

/// One registered quantizer: its metadata and how to build it.
#[derive(Clone, Copy)]
pub struct QuantizerEntry {
    /// What `#[mark_quantizer]` declared.
    pub metadata: QuantizerMetadata,
    build: fn(&QuantizerConfig) -> Built,
}

impl fmt::Debug for QuantizerEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuantizerEntry")
            .field("metadata", &self.metadata)
            .finish_non_exhaustive()
    }
}

impl QuantizerEntry {
    /// The entry of a weights quantizer (used by `#[mark_quantizer]`).
    pub const fn weights<T: WeightsQuantizer + MarkedQuantizer>() -> QuantizerEntry {
        QuantizerEntry {
            metadata: T::METADATA,
            build: build_weights::<T>,
        }
    }

    /// The entry of an activation quantizer (used by `#[mark_quantizer]`).
    pub const fn activation<T: ActivationQuantizer + MarkedQuantizer>() -> QuantizerEntry {
        QuantizerEntry {
            metadata: T::METADATA,
            build: build_activation::<T>,
        }
    }

    /// Builds the quantizer from `config`.
    ///
    /// # Errors
    /// [`QuantError::ConfigMismatch`] when the config's target, method or training method is
    /// not this quantizer's; whatever the quantizer's own constructor rejects.
    pub fn build(&self, config: &QuantizerConfig) -> Result<Box<dyn TrainableQuantizer>> {
        let m = &self.metadata;
        let mismatch = |reason: String| QuantError::ConfigMismatch {
            quantizer: m.path(),
            reason,
        };
        if config.target() != m.target {
            return Err(mismatch(format!(
                "it quantizes {} but the config is for {}",
                m.target,
                config.target()
            )));
        }
        if !m.supports(config.method()) {
            let methods: Vec<&str> = m.methods.iter().map(|x| x.name()).collect();
            return Err(mismatch(format!(
                "method {} is not supported; it supports {}",
                config.method(),
                methods.join(", ")
            )));
        }
        if config.training_method() != m.training_method {
            return Err(mismatch(format!(
                "the config asks for training method {} but this quantizer is {}",
                config.training_method(),
                m.training_method
            )));
        }
        (self.build)(config)
    }
}

/// What an entry's builder gives: the quantizer, boxed.
type Built = Result<Box<dyn TrainableQuantizer>>;

fn build_weights<T: WeightsQuantizer>(config: &QuantizerConfig) -> Built {
    match config {
        QuantizerConfig::Weights(c) => Ok(Box::new(T::from_config(c)?)),
        QuantizerConfig::Activation(_) => unreachable_target(),
    }
}

fn build_activation<T: ActivationQuantizer>(config: &QuantizerConfig) -> Built {
    match config {
        QuantizerConfig::Activation(c) => Ok(Box::new(T::from_config(c)?)),
        QuantizerConfig::Weights(_) => unreachable_target(),
    }
}

fn unreachable_target() -> Built {
    // QuantizerEntry::build checks the target before calling the builder.
    Err(QuantError::ConfigMismatch {
        quantizer: "registry".into(),
        reason: "target checked before building".into(),
    })
}

/// Every quantizer registered with `#[mark_quantizer]` in the linked crates.
#[distributed_slice]
pub static QUANTIZERS: [QuantizerEntry];

/// Training-method ids declared with [`training_methods!`](crate::training_methods).
#[distributed_slice]
pub static TRAINING_METHODS: [TrainingMethod];

/// Every registered quantizer, sorted by target, training method and path.
pub fn registered() -> Vec<&'static QuantizerEntry> {
    let mut all: Vec<&'static QuantizerEntry> = QUANTIZERS.iter().collect();
    all.sort_by(|a, b| {
        let (a, b) = (&a.metadata, &b.metadata);
        (a.target, a.training_method, a.path()).cmp(&(b.target, b.training_method, b.path()))
    });
    all
}

/// The one registered quantizer for `(target, method, training_method)`.
///
/// # Errors
/// [`QuantError::NotFound`] (listing what is registered for `target`) or
/// [`QuantError::Ambiguous`] (listing the candidates with their module paths).
pub fn find(
    target: QuantizationTarget,
    method: QuantizationMethod,
    training_method: TrainingMethod,
) -> Result<&'static QuantizerEntry> {
    let matches: Vec<&'static QuantizerEntry> = registered()
        .into_iter()
        .filter(|e| {
            e.metadata.target == target
                && e.metadata.training_method == training_method
                && e.metadata.supports(method)
        })
        .collect();
    match matches.as_slice() {
        [one] => Ok(one),
        [] => {
            let for_target: Vec<String> = registered()
                .iter()
                .filter(|e| e.metadata.target == target)
                .map(|e| {
                    let methods: Vec<&str> = e.metadata.methods.iter().map(|m| m.name()).collect();
                    format!("{} [{}]", e.metadata.training_method, methods.join(", "))
                })
                .collect();
            Err(QuantError::NotFound {
                target,
                method,
                training_method,
                registered: if for_target.is_empty() {
                    "none (is the crate that defines them linked? see quant_core::registry)".into()
                } else {
                    for_target.join("; ")
                },
            })
        }
        many => Err(QuantError::Ambiguous {
            target,
            method,
            training_method,
            count: many.len(),
            candidates: many
                .iter()
                .map(|e| e.metadata.path())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// Finds the quantizer `config` names (its target, method and training method) and builds it.
///
/// ```no_run
/// use quant_core::{registry, WeightsQuantizerConfig, QuantizationMethod, TrainingMethod};
/// let cfg = WeightsQuantizerConfig::new(TrainingMethod::Lsq, QuantizationMethod::Symmetric, 4);
/// let quantizer = registry::build(&cfg.into())?;
/// # Ok::<(), quant_core::QuantError>(())
/// ```
///
/// # Errors
/// See [`find`] and [`QuantizerEntry::build`].
pub fn build(config: &QuantizerConfig) -> Result<Box<dyn TrainableQuantizer>> {
    find(config.target(), config.method(), config.training_method())?.build(config)
}
