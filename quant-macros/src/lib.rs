//! Procedural macros of `quant`. Thin: they parse and check attributes, and emit calls into
//! quant-core (through its hidden `__private` module) and quant-dfdx (through its hidden
//! `layers::derive` module). Use them through the `quant` facade.
//!
//! The `quant` crate's documentation shows `#[mark_quantizer]` on a quantizer of your own,
//! registered and found by enum (a doctest there: this crate cannot depend on the facade that
//! re-exports it without building the facade a second time for its own tests).
//!
//! The derives, `#[derive(QuantizedLayer)]` and `#[derive(QuantizedModel)]`, are shown end to
//! end in the workspace's `tests/integration/derive.rs` and `examples/custom_wrapper.rs`.

#![forbid(unsafe_code)]

mod crate_path;
mod derive_common;
mod derive_layer;
mod derive_model;
mod mark_quantizer;

use proc_macro::TokenStream;

/// Registers a trainable quantizer and records its metadata.
///
/// ```text
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
///   Cargo.toml, `::quant_core` or the facade `::quant`).
///
/// Generates `impl MarkedQuantizer` (the metadata as an associated `const`) and an entry in the
/// quantizer registry. The struct must not be generic. Every problem in the attribute is a
/// compile error on its own token, all reported at once.
#[proc_macro_attribute]
pub fn mark_quantizer(args: TokenStream, item: TokenStream) -> TokenStream {
    mark_quantizer::expand(args.into(), item.into()).into()
}

/// Derives a quantized wrapper for a user's own layer: a struct whose named fields are dfdx
/// tensors and modules, with a float forward pass written as an ordinary dfdx `Module` impl that
/// reads its weight fields with `.retaped::<T>()`.
///
/// ```text
/// #[derive(Clone, Debug, QuantizedLayer)]
/// #[quantized(name = QGatedMix, input)]
/// pub struct GatedMix<const N: usize> {
///     #[quantized(weights, channels = N)]
///     pub weight: Tensor<Rank2<N, N>, f32, Cpu>,
///     #[quantized(weights)]
///     pub gate: Tensor<Rank1<N>, f32, Cpu>,
///     pub bias: Tensor<Rank1<N>, f32, Cpu>,
/// }
/// ```
///
/// Arguments of `#[quantized(...)]`:
/// - on the struct: `name = Ident` (the wrapper's name; default `Q` + the struct's name),
///   `input` (quantize the layer's input, per tensor), `crate = path` (the path to quant-dfdx,
///   for renamed dependencies);
/// - on a tensor field: `weights` (quantize it, per tensor), `weights, channels = N` (per
///   channel along axis 0; `N` a const parameter of the struct or a constant expression without
///   generic parameters, and the field's first dimension must be `N`).
///
/// Generates, for the struct `L` (which must be `Clone + Debug`):
/// - the wrapper `QL { pub layer: L, pub <field>_quantizer: TensorQuantizer<N or 1>, ...,
///   pub input_quantizer: TensorQuantizer<1> }` with `QL::new(layer, &dev)`, `Clone`, `Debug`,
///   dfdx `TensorCollection` (the layer's tensors under their own names, then the quantizers),
///   `Module` and `ModuleMut` for every input `X: LayerInput` that `L` accepts (`Error =
///   QuantError`; the quantized weights replace the float ones in the user's forward, their
///   gradients reach the float weights and the quantizers' parameters) and `QuantizedModule`:
///   kind `LayerKind::Custom`, slots `input` and one per weights field, named like the field
///   (quantizers `<layer>.input`, `<layer>.<field>`; a field without `channels` quantizes per
///   tensor whatever the policy's `per_channel`); its `lower` is a typed error saying the
///   layer's Rust forward pass has no graph form;
/// - for `L`: `TensorCollection` (tensors of rank ≥ 2 reset uniform in ±1/√fan_in, others to
///   zero) and `Convert` (into the wrapper, float weights copied).
///
/// `L` may be generic over const parameters and over dfdx's dtype/device pair
/// (`E: Dtype, D: Device<E>`; the wrapper is always `f32` on the CPU). A struct that is not
/// generic over the pair gets `TensorCollection::To<E2, D2> = Option<Self>` (dfdx's visitors can
/// only rebuild it as itself) and an inherent `L::build(&Cpu)` in place of `dev.build_module`.
/// Every misuse is a compile error on the offending token, all reported at once.
#[proc_macro_derive(QuantizedLayer, attributes(quantized))]
pub fn derive_quantized_layer(item: TokenStream) -> TokenStream {
    match syn::parse(item) {
        Ok(input) => derive_layer::expand(input).into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// Derives the dfdx boilerplate of a model struct whose named fields are layers, and its
/// quantized twin.
///
/// ```text
/// #[derive(QuantizedModel)]
/// pub struct Encoder<E: Dtype, D: Device<E>> {
///     pub fc1: Linear<16, 32, E, D>,
///     pub act: ReLU,
///     pub fc2: Linear<32, 8, E, D>,
/// }
/// ```
///
/// Arguments of `#[quantized(...)]` on the struct:
/// - `name = Ident`: the twin's name (default: the struct's name prefixed with `Q`);
/// - `forward = manual`: you implement `Module`/`ModuleMut` for both structs; the twin's graph
///   form (`QuantizedModule::lower`) is then a typed error, as it follows the forward pass;
/// - `crate = path`: the path to quant-dfdx, for renamed dependencies.
///
/// Fields take no arguments.
///
/// Generates, for the struct `M`:
/// - for `M`: `TensorCollection`, `Module` and `ModuleMut` running the fields in order (error:
///   the first field's, into which the others' must convert) and `Convert` (field by field);
/// - the twin `QM`, always `f32` on the CPU, with `Clone`, `Debug`, `TensorCollection`,
///   `Module`/`ModuleMut` in field order (`Error = QuantError`) and `QuantizedModule`: its slots
///   under each field's name (`encoder.fc1.weights`) and its graph form, the fields' in order
///   (layer names `encoder.fc1`).
///
/// The twin is generic over its fields' types, which default to `<F as Convert>::Quantized`:
/// `QM` (or `QM<N>` for const parameters) names the twin of `M`. Like a tuple, it maps
/// `TensorCollection::To<E2, D2>` field by field.
///
/// A struct written dfdx-style, generic over `E: Dtype, D: Device<E>`, maps `To<E2, D2>` to
/// itself with `E2, D2`, and builds with `BuildModule::build(&dev)`. A concrete (`f32`, `Cpu`)
/// struct cannot: it has `To<E2, D2> = Option<Self>` (`Some` only for f32 on the CPU), so it is
/// built by conversion or by the generated inherent `M::build(&Cpu)`, not by
/// `dev.build_module`; dfdx optimizers, `ZeroGrads` and safetensors save/load work as for any
/// module. Derived structs and tuples nest both ways; dfdx's visitors cannot rebuild a tuple
/// holding a concrete struct, so `M::build` reports an error for such a field.
#[proc_macro_derive(QuantizedModel, attributes(quantized))]
pub fn derive_quantized_model(item: TokenStream) -> TokenStream {
    match syn::parse(item) {
        Ok(input) => derive_model::expand(input).into(),
        Err(e) => e.to_compile_error().into(),
    }
}
