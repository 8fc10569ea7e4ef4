//! The checks of the struct's shape and generics, the substitution of its dtype/device
//! parameters, and the frame of both derives' expansion.

use proc_macro2::{TokenStream, TokenTree};
use quote::{format_ident, quote, ToTokens};
use syn::ext::IdentExt;
use syn::punctuated::Punctuated;
use syn::{
    Attribute, Data, DeriveInput, Fields, GenericParam, Generics, Ident, Path, Token, Type,
    TypeParamBound, Visibility, WherePredicate,
};

use crate::crate_path::{dfdx_path, Errors};

use super::attrs::*;
use super::collection::{cpu_path, Paths, Visit};

/// A named field of the struct.
pub struct FieldInfo {
    /// Its name.
    pub ident: Ident,
    /// Its name without `r#`, as saved tensors and quantizers are named.
    pub name: String,
    /// Its type as written.
    pub ty: Type,
    /// Its type with the dtype/device parameters replaced by `f32` and `Cpu`.
    pub concrete: Type,
    /// Whether the type is written as a dfdx `Tensor<...>`.
    pub is_tensor: bool,
    /// Its doc comments.
    pub docs: Vec<Attribute>,
    /// Its visibility.
    pub vis: Visibility,
    /// Its `#[quantized(...)]` arguments.
    pub options: FieldOptions,
}

/// The checked struct.
pub struct StructInfo {
    /// The struct's name.
    pub ident: Ident,
    /// Its visibility.
    pub vis: Visibility,
    /// Its generics, as written.
    pub generics: Generics,
    /// The dtype parameter of a struct written dfdx-style (`E: Dtype`).
    pub dtype: Option<Ident>,
    /// The device parameter of a struct written dfdx-style (`D: Device<E>`).
    pub device: Option<Ident>,
    /// Its fields, in order.
    pub fields: Vec<FieldInfo>,
    /// The struct-level arguments.
    pub options: StructOptions,
}

/// The last path segment's name of a bound (`Dtype` for `dfdx::shapes::Dtype`).
fn bound_names(bounds: &Punctuated<TypeParamBound, Token![+]>) -> Vec<String> {
    bounds
        .iter()
        .filter_map(|b| match b {
            TypeParamBound::Trait(t) => t.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        })
        .collect()
}

/// Finds the dtype/device pair among the type parameters; every other lifetime or type
/// parameter is an error.
fn generic_pair(
    derive: Derive,
    generics: &Generics,
    errors: &mut Errors,
) -> (Option<Ident>, Option<Ident>) {
    let mut dtype: Option<Ident> = None;
    let mut device: Option<Ident> = None;
    let where_bounds = |ident: &Ident| -> Vec<String> {
        generics
            .where_clause
            .iter()
            .flat_map(|w| w.predicates.iter())
            .filter_map(|p| match p {
                WherePredicate::Type(t) => match &t.bounded_ty {
                    Type::Path(tp) if tp.qself.is_none() && tp.path.is_ident(ident) => {
                        Some(bound_names(&t.bounds))
                    }
                    _ => None,
                },
                _ => None,
            })
            .flatten()
            .collect()
    };
    for param in &generics.params {
        match param {
            GenericParam::Lifetime(l) => errors.push(syn::Error::new_spanned(
                l,
                format!(
                    "#[derive({})] does not support lifetime parameters: {}",
                    derive.name(),
                    match derive {
                        Derive::Layer => "a layer owns its tensors and modules",
                        Derive::Model => "a model owns its layers",
                    }
                ),
            )),
            GenericParam::Const(_) => {}
            GenericParam::Type(t) => {
                let mut names = bound_names(&t.bounds);
                names.extend(where_bounds(&t.ident));
                let is_dtype = names.iter().any(|n| n == "Dtype");
                let is_device = names.iter().any(|n| n == "Device" || n == "Storage");
                let slot = match (is_dtype, is_device) {
                    (true, false) => &mut dtype,
                    (false, true) => &mut device,
                    _ => {
                        errors.push(syn::Error::new_spanned(
                            &t.ident,
                            format!(
                                "#[derive({})] supports const parameters and dfdx's dtype/device pair \
                                 (`E: Dtype, D: Device<E>`); `{}` is neither",
                                derive.name(),
                                t.ident
                            ),
                        ));
                        continue;
                    }
                };
                if let Some(first) = slot {
                    errors.push(syn::Error::new_spanned(
                        &t.ident,
                        format!(
                            "a second {} parameter (`{first}` is one already): a dfdx layer has one dtype and one device",
                            if is_dtype { "dtype" } else { "device" }
                        ),
                    ));
                } else {
                    *slot = Some(t.ident.clone());
                }
            }
        }
    }
    match (&dtype, &device) {
        (Some(e), None) => errors.push(syn::Error::new_spanned(
            e,
            format!("a struct generic over the dtype `{e}` must be generic over the device too (`D: Device<{e}>`), as dfdx modules are"),
        )),
        (None, Some(d)) => errors.push(syn::Error::new_spanned(
            d,
            format!("a struct generic over the device `{d}` must be generic over the dtype too (`E: Dtype`), as dfdx modules are"),
        )),
        _ => {}
    }
    (dtype, device)
}

/// Whether `ty` is written as a dfdx tensor (`Tensor<...>`, `dfdx::tensor::Tensor<...>`).
fn is_tensor(ty: &Type) -> bool {
    match ty {
        Type::Path(p) => p.path.segments.last().is_some_and(|s| s.ident == "Tensor"),
        Type::Group(g) => is_tensor(&g.elem),
        Type::Paren(p) => is_tensor(&p.elem),
        _ => false,
    }
}

/// Replaces the identifiers `from[i]` by `to[i]` in `tokens`, except right after `::`, where the
/// same name is a path segment of something else.
fn substitute(tokens: TokenStream, from: &[&Ident], to: &[TokenStream]) -> TokenStream {
    let mut out = TokenStream::new();
    // Consecutive `:` just before the current token.
    let mut colons = 0usize;
    for tt in tokens {
        match &tt {
            TokenTree::Ident(i) => {
                match from.iter().position(|f| *f == i) {
                    Some(k) if colons < 2 => out.extend(to[k].clone()),
                    _ => out.extend([tt.clone()]),
                }
                colons = 0;
            }
            TokenTree::Group(g) => {
                let mut group =
                    proc_macro2::Group::new(g.delimiter(), substitute(g.stream(), from, to));
                group.set_span(g.span());
                out.extend([TokenTree::Group(group)]);
                colons = 0;
            }
            TokenTree::Punct(p) if p.as_char() == ':' => {
                out.extend([tt.clone()]);
                colons += 1;
            }
            _ => {
                out.extend([tt.clone()]);
                colons = 0;
            }
        }
    }
    out
}

/// Expands a derive: parses the struct for `derive`, runs the derive's own `check`, then
/// `generate`s the items, or reports every error found, all at once.
pub fn expand(
    derive: Derive,
    input: &DeriveInput,
    check: fn(&StructInfo, &mut Errors),
    generate: fn(&StructInfo) -> TokenStream,
) -> TokenStream {
    let mut errors = Errors::default();
    let info = StructInfo::parse(derive, input, &mut errors);
    if let Some(info) = &info {
        check(info, &mut errors);
    }
    match info {
        Some(info) if errors.is_empty() => generate(&info),
        _ => errors.to_compile_errors(),
    }
}

impl StructInfo {
    /// Checks the derive input: a struct with named fields, supported generics, valid
    /// `#[quantized(...)]` arguments. Field-specific checks are the caller's.
    pub fn parse(derive: Derive, input: &DeriveInput, errors: &mut Errors) -> Option<StructInfo> {
        let options = struct_options(derive, &input.ident, &input.attrs, errors);
        let (dtype, device) = generic_pair(derive, &input.generics, errors);
        let not_a_struct = |token: &dyn ToTokens, what: &str| {
            syn::Error::new_spanned(
                token,
                format!(
                    "#[derive({})] applies to a struct with named fields, not to {what}",
                    derive.name()
                ),
            )
        };
        let named = match &input.data {
            Data::Struct(s) => match &s.fields {
                Fields::Named(named) => Some(named),
                Fields::Unnamed(unnamed) => {
                    errors.push(syn::Error::new_spanned(
                        unnamed,
                        format!(
                            "#[derive({})] needs named fields: saved tensors and quantizers are named after them",
                            derive.name()
                        ),
                    ));
                    None
                }
                Fields::Unit => {
                    let hint = match derive {
                        Derive::Layer => "write `struct Name {}` for a layer without fields",
                        Derive::Model => "a model needs its layers as named fields",
                    };
                    errors.push(syn::Error::new_spanned(
                        &input.ident,
                        format!(
                            "#[derive({})] needs a struct with named fields; {hint}",
                            derive.name()
                        ),
                    ));
                    None
                }
            },
            Data::Enum(e) => {
                errors.push(not_a_struct(&e.enum_token, "an enum"));
                None
            }
            Data::Union(u) => {
                errors.push(not_a_struct(&u.union_token, "a union"));
                None
            }
        };
        let mut info = StructInfo {
            ident: input.ident.clone(),
            vis: input.vis.clone(),
            generics: input.generics.clone(),
            dtype,
            device,
            fields: Vec::new(),
            options,
        };
        let cpu = cpu_path(&info.dfdx_path());
        for f in named?.named.iter() {
            let Some(ident) = f.ident.clone() else {
                continue;
            };
            let options = field_options(derive, &f.attrs, errors);
            info.fields.push(FieldInfo {
                name: ident.unraw().to_string(),
                ident,
                concrete: info.concrete_type(&f.ty, &cpu),
                is_tensor: is_tensor(&f.ty),
                ty: f.ty.clone(),
                docs: f
                    .attrs
                    .iter()
                    .filter(|a| a.path().is_ident("doc"))
                    .cloned()
                    .collect(),
                vis: f.vis.clone(),
                options,
            });
        }
        Some(info)
    }

    fn pair(&self) -> Vec<&Ident> {
        self.dtype.iter().chain(self.device.iter()).collect()
    }

    /// `ty` with the dtype and device parameters replaced by `e` and `d`.
    fn substituted(&self, ty: &Type, e: TokenStream, d: TokenStream) -> Type {
        let pair = self.pair();
        if pair.is_empty() {
            return ty.clone();
        }
        let to: Vec<TokenStream> = match (&self.dtype, &self.device) {
            (Some(_), Some(_)) => vec![e, d],
            (Some(_), None) => vec![e],
            _ => vec![d],
        };
        let tokens = substitute(ty.to_token_stream(), &pair, &to);
        syn::parse2(tokens).unwrap_or_else(|_| ty.clone())
    }

    /// `ty` for `f32` on the CPU (`cpu` the path to dfdx's `Cpu`).
    fn concrete_type(&self, ty: &Type, cpu: &TokenStream) -> Type {
        self.substituted(ty, quote!(f32), cpu.clone())
    }

    /// The name of the generated quantized type: `#[quantized(name = ...)]`, or `Q` + the
    /// struct's name.
    pub fn generated_name(&self) -> Ident {
        self.options
            .name
            .clone()
            .unwrap_or_else(|| format_ident!("Q{}", self.ident))
    }

    /// One visit per field, under the field's name, at `place(field)` (`quote!(#field)`, or
    /// `quote!(layer.#field)` inside a wrapper).
    pub fn field_visits(&self, place: impl Fn(&Ident) -> TokenStream) -> Vec<Visit> {
        self.fields
            .iter()
            .map(|f| Visit {
                name: f.name.clone(),
                place: place(&f.ident),
                tensor: f.is_tensor,
            })
            .collect()
    }

    /// The path to quant-dfdx.
    pub fn dfdx_path(&self) -> Path {
        self.options.krate.clone().unwrap_or_else(dfdx_path)
    }

    /// The generics of the generated (always `f32`-on-CPU) structs and impls: the const
    /// parameters, and the where-predicates that do not mention the dtype or device.
    pub fn concrete_generics(&self) -> Generics {
        let pair = self.pair();
        let mut g = self.generics.clone();
        g.params = g
            .params
            .into_iter()
            .filter(|p| !matches!(p, GenericParam::Type(t) if pair.contains(&&t.ident)))
            .collect();
        if let Some(w) = &mut g.where_clause {
            w.predicates = w
                .predicates
                .clone()
                .into_iter()
                .filter(|p| !mentions(p.to_token_stream(), &pair))
                .collect();
        }
        g
    }

    /// The struct's type arguments with the dtype/device pair replaced by `e` and `d`
    /// (`<N, f32, Cpu>`), or nothing for a struct without parameters.
    pub fn args_with(&self, e: &TokenStream, d: &TokenStream) -> TokenStream {
        if self.generics.params.is_empty() {
            return TokenStream::new();
        }
        let args = self.generics.params.iter().map(|p| match p {
            GenericParam::Type(t) if Some(&t.ident) == self.dtype.as_ref() => e.clone(),
            GenericParam::Type(t) if Some(&t.ident) == self.device.as_ref() => d.clone(),
            GenericParam::Type(t) => t.ident.to_token_stream(),
            GenericParam::Const(c) => c.ident.to_token_stream(),
            GenericParam::Lifetime(l) => l.lifetime.to_token_stream(),
        });
        quote!(<#(#args),*>)
    }

    /// The struct's type for `f32` on the CPU: `Mlp<N, f32, Cpu>`.
    pub fn concrete_self(&self, paths: &Paths) -> TokenStream {
        let ident = &self.ident;
        let args = self.args_with(&quote!(f32), &paths.cpu);
        quote!(#ident #args)
    }
}

/// Whether `tokens` mention any of `idents`.
fn mentions(tokens: TokenStream, idents: &[&Ident]) -> bool {
    tokens.into_iter().any(|tt| match tt {
        TokenTree::Ident(i) => idents.contains(&&i),
        TokenTree::Group(g) => mentions(g.stream(), idents),
        _ => false,
    })
}
