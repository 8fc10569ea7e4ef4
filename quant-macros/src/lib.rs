//! Procedural macros of `quant`. Thin: they parse and check attributes, and emit calls into
//! quant-core (through its hidden `__private` module). Use them through the `quant` facade.

mod crate_path;
mod mark_quantizer;

use proc_macro::TokenStream;

/// Registers a trainable quantizer and records its metadata.
///
/// ```ignore
/// #[mark_quantizer(target = Weights, method = [Symmetric, PowerOfTwo], id = Lsq)]
/// pub struct MyQuantizer { config: QuantizerConfig }
/// ```
///
/// Arguments (each `key = value`, in any order):
/// - `target`: `Weights` or `Activation`. The struct must implement `WeightsQuantizer` or
///   `ActivationQuantizer` accordingly (checked at compile time).
/// - `method`: a non-empty list of distinct methods, `[Symmetric, PowerOfTwo, Uniform]`. A single
///   method may be written without brackets (`method = Symmetric`); it means the same as
///   `method = [Symmetric]`.
/// - `id`: the training-method id, `Lsq` or `TrainingMethod::Lsq`; a custom id declared with
///   `training_methods!` works when its extension trait is in scope.
/// - `crate` (optional): the path to quant-core, for renamed dependencies (default: found from
///   Cargo.toml, `::quant_core` or `::quant::core`).
///
/// Generates `impl MarkedQuantizer` (the metadata as an associated `const`) and an entry in the
/// quantizer registry. The struct must not be generic. Every problem in the attribute is a
/// compile error on its own token, all reported at once.
#[proc_macro_attribute]
pub fn mark_quantizer(args: TokenStream, item: TokenStream) -> TokenStream {
    mark_quantizer::expand(args.into(), item.into()).into()
}
