//! What `#[derive(QuantizedLayer)]` and `#[derive(QuantizedModel)]` share: the `#[quantized(...)]`
//! grammar and its checks, the checks of the struct's shape and generics, the paths the
//! expansions use, and the dfdx `TensorCollection` boilerplate.
//!
//! Every problem is a `syn::Error` on the offending token, collected and reported at once.

use proc_macro2::{TokenStream, TokenTree};
use quote::{format_ident, quote, ToTokens};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{
    Attribute, Data, DeriveInput, Expr, Fields, GenericParam, Generics, Ident, Lit, Meta, Path,
    Token, Type, TypeParamBound, Visibility, WherePredicate,
};

use crate::crate_path::{ops_path, Errors};

/// Which derive is expanding.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Derive {
    /// `#[derive(QuantizedLayer)]`.
    Layer,
    /// `#[derive(QuantizedModel)]`.
    Model,
}

impl Derive {
    fn name(self) -> &'static str {
        match self {
            Derive::Layer => "QuantizedLayer",
            Derive::Model => "QuantizedModel",
        }
    }

    /// The keys `#[quantized(...)]` accepts on the struct.
    fn struct_keys(self) -> &'static [&'static str] {
        match self {
            Derive::Layer => &["name", "input", "crate"],
            Derive::Model => &["name", "forward", "crate"],
        }
    }

    /// The keys `#[quantized(...)]` accepts on a field.
    fn field_keys(self) -> &'static [&'static str] {
        match self {
            Derive::Layer => &["weights", "channels"],
            Derive::Model => &[],
        }
    }
}

/// One `key` or `key = value` of `#[quantized(...)]`.
struct Arg {
    key: Ident,
    eq: Option<Token![=]>,
    value: Option<Expr>,
}

impl Parse for Arg {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        // `crate` is a keyword; every other key is an identifier.
        let key = if input.peek(Token![crate]) {
            let kw: Token![crate] = input.parse()?;
            Ident::new("crate", kw.span)
        } else {
            Ident::parse_any(input)?
        };
        let (eq, value) = if input.peek(Token![=]) {
            (Some(input.parse()?), Some(input.parse()?))
        } else {
            (None, None)
        };
        Ok(Arg { key, eq, value })
    }
}

/// The arguments of every `#[quantized(...)]` among `attrs`, in order. Malformed attributes are
/// reported and skipped.
fn quantized_args(attrs: &[Attribute], errors: &mut Errors) -> Vec<Arg> {
    let mut out = Vec::new();
    for attr in attrs.iter().filter(|a| a.path().is_ident("quantized")) {
        match &attr.meta {
            Meta::List(list) => {
                match list.parse_args_with(Punctuated::<Arg, Token![,]>::parse_terminated) {
                    Ok(args) => out.extend(args),
                    Err(e) => errors.push(e),
                }
            }
            other => errors.push(syn::Error::new_spanned(
                other,
                "expected `#[quantized(...)]` with a list of arguments, e.g. `#[quantized(weights)]`",
            )),
        }
    }
    out
}

/// Where a key that is not valid here belongs, for the error message.
fn misplaced(derive: Derive, key: &str, on_field: bool) -> Option<String> {
    let other = match derive {
        Derive::Layer => Derive::Model,
        Derive::Model => Derive::Layer,
    };
    let here = if on_field {
        derive.struct_keys()
    } else {
        derive.field_keys()
    };
    if here.contains(&key) {
        Some(if on_field {
            format!("`{key}` goes on the struct, not on a field")
        } else {
            format!("`{key}` goes on a field, not on the struct")
        })
    } else if other.struct_keys().contains(&key) || other.field_keys().contains(&key) {
        Some(format!(
            "`{key}` is an argument of #[derive({})]",
            other.name()
        ))
    } else {
        None
    }
}

fn unknown_key(derive: Derive, key: &Ident, on_field: bool) -> syn::Error {
    let name = key.unraw().to_string();
    let valid = if on_field {
        derive.field_keys()
    } else {
        derive.struct_keys()
    };
    let expected = if valid.is_empty() {
        format!(
            "#[derive({})] takes no field arguments: a model's fields are layers, converted by their own `Convert`",
            derive.name()
        )
    } else {
        let list: Vec<String> = valid.iter().map(|k| format!("`{k}`")).collect();
        format!("expected one of {}", list.join(", "))
    };
    let hint = misplaced(derive, &name, on_field)
        .map(|h| format!(" ({h})"))
        .unwrap_or_default();
    syn::Error::new_spanned(key, format!("unknown key `{name}`; {expected}{hint}"))
}

/// Checks that `arg` has no value.
fn flag(arg: &Arg, errors: &mut Errors) -> bool {
    match (&arg.eq, &arg.value) {
        (Some(eq), Some(v)) => {
            let key = arg.key.unraw();
            errors.push(syn::Error::new_spanned(
                quote!(#eq #v),
                format!("`{key}` takes no value: write `{key}` alone"),
            ));
            false
        }
        _ => true,
    }
}

/// The value of `arg`, or an error that it needs one (`form` shows it).
fn value<'a>(arg: &'a Arg, form: &str, errors: &mut Errors) -> Option<&'a Expr> {
    if arg.value.is_none() {
        errors.push(syn::Error::new_spanned(
            &arg.key,
            format!("`{}` needs a value: `{form}`", arg.key.unraw()),
        ));
    }
    arg.value.as_ref()
}

/// A single identifier written as an expression (`QMlp`, `manual`).
fn bare_ident(e: &Expr) -> Option<&Ident> {
    match e {
        Expr::Path(p) if p.qself.is_none() && p.attrs.is_empty() => p.path.get_ident(),
        _ => None,
    }
}

/// Keeps the first occurrence of each key; reports the others.
fn first_of_each(args: Vec<Arg>, errors: &mut Errors) -> Vec<Arg> {
    let mut seen: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for arg in args {
        let key = arg.key.unraw().to_string();
        if seen.contains(&key) {
            errors.push(syn::Error::new_spanned(
                &arg.key,
                format!("`{key}` is given more than once"),
            ));
        } else {
            seen.push(key);
            out.push(arg);
        }
    }
    out
}

/// The struct-level arguments.
#[derive(Default)]
pub struct StructOptions {
    /// `name = Ident`: the generated struct's name.
    pub name: Option<Ident>,
    /// `input` (layers): quantize the layer's input.
    pub input: bool,
    /// `forward = manual` (models): the user writes the forward pass.
    pub manual_forward: bool,
    /// `crate = path`: the path to quant-ops.
    pub krate: Option<Path>,
}

/// Parses and checks `#[quantized(...)]` on the struct `ident`.
pub fn struct_options(
    derive: Derive,
    ident: &Ident,
    attrs: &[Attribute],
    errors: &mut Errors,
) -> StructOptions {
    let mut opts = StructOptions::default();
    for arg in first_of_each(quantized_args(attrs, errors), errors) {
        let key = arg.key.unraw().to_string();
        if !derive.struct_keys().contains(&key.as_str()) {
            errors.push(unknown_key(derive, &arg.key, false));
            continue;
        }
        match key.as_str() {
            "name" => {
                let example = match derive {
                    Derive::Layer => "name = QMyLayer",
                    Derive::Model => "name = QMyModel",
                };
                let Some(v) = value(&arg, example, errors) else {
                    continue;
                };
                match bare_ident(v) {
                    Some(name) if name == ident => errors.push(syn::Error::new_spanned(
                        v,
                        format!(
                            "the generated struct needs a name of its own; `{ident}` is the struct deriving {}",
                            derive.name()
                        ),
                    )),
                    Some(name) => opts.name = Some(name.clone()),
                    None => errors.push(syn::Error::new_spanned(
                        v,
                        format!(
                            "expected the generated struct's name as an identifier, e.g. `{example}` (no path, no generics, no quotes)"
                        ),
                    )),
                }
            }
            "input" => opts.input = flag(&arg, errors),
            "forward" => {
                let Some(v) = value(&arg, "forward = manual", errors) else {
                    continue;
                };
                match bare_ident(v) {
                    Some(m) if m == "manual" => opts.manual_forward = true,
                    _ => errors.push(syn::Error::new_spanned(
                        v,
                        "expected `forward = manual` (you implement Module and ModuleMut); without it, the forward pass runs the fields in order",
                    )),
                }
            }
            "crate" => {
                let Some(v) = value(&arg, "crate = ::quant::quant_ops", errors) else {
                    continue;
                };
                match v {
                    Expr::Path(p) if p.qself.is_none() => opts.krate = Some(p.path.clone()),
                    other => errors.push(syn::Error::new_spanned(
                        other,
                        "expected a path to quant-ops, e.g. `crate = ::quant::quant_ops`",
                    )),
                }
            }
            _ => unreachable_key(&arg.key, errors),
        }
    }
    opts
}

/// A key listed as valid but not handled: a bug of this crate, reported instead of panicking.
fn unreachable_key(key: &Ident, errors: &mut Errors) {
    errors.push(syn::Error::new_spanned(
        key,
        "internal error of quant-macros: this key is accepted but not handled; please report it",
    ));
}

/// The field-level arguments of a layer's field.
#[derive(Default)]
pub struct FieldOptions {
    /// `weights`: quantize this tensor.
    pub weights: bool,
    /// `channels = N`: per channel on axis 0, with `N` channels.
    pub channels: Option<Expr>,
}

/// Parses and checks `#[quantized(...)]` on a field.
pub fn field_options(derive: Derive, attrs: &[Attribute], errors: &mut Errors) -> FieldOptions {
    let mut opts = FieldOptions::default();
    let mut channels_key: Option<Ident> = None;
    for arg in first_of_each(quantized_args(attrs, errors), errors) {
        let key = arg.key.unraw().to_string();
        if !derive.field_keys().contains(&key.as_str()) {
            errors.push(unknown_key(derive, &arg.key, true));
            continue;
        }
        match key.as_str() {
            "weights" => {
                opts.weights = flag(&arg, errors);
            }
            "channels" => {
                let Some(v) = value(&arg, "channels = N", errors) else {
                    continue;
                };
                if let Expr::Lit(l) = v {
                    let zero =
                        matches!(&l.lit, Lit::Int(i) if i.base10_parse::<u128>().ok() == Some(0));
                    if zero {
                        errors.push(syn::Error::new_spanned(
                            v,
                            "`channels` counts the weight's output channels (its first dimension): at least 1",
                        ));
                        continue;
                    }
                }
                channels_key = Some(arg.key.clone());
                opts.channels = Some(v.clone());
            }
            _ => unreachable_key(&arg.key, errors),
        }
    }
    if let (Some(key), false) = (&channels_key, opts.weights) {
        errors.push(syn::Error::new_spanned(
            key,
            "`channels` sets how a weights quantizer is laid out; it needs `weights` too: `#[quantized(weights, channels = N)]`",
        ));
        opts.channels = None;
    }
    opts
}

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

impl StructInfo {
    /// Checks the derive input: a struct with named fields, supported generics, valid
    /// `#[quantized(...)]` arguments. Field-specific checks are the caller's.
    pub fn parse(derive: Derive, input: &DeriveInput, errors: &mut Errors) -> Option<StructInfo> {
        let options = struct_options(derive, &input.ident, &input.attrs, errors);
        let (dtype, device) = generic_pair(derive, &input.generics, errors);
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
                errors.push(syn::Error::new_spanned(
                    e.enum_token,
                    format!(
                        "#[derive({})] applies to a struct with named fields, not to an enum",
                        derive.name()
                    ),
                ));
                None
            }
            Data::Union(u) => {
                errors.push(syn::Error::new_spanned(
                    u.union_token,
                    format!(
                        "#[derive({})] applies to a struct with named fields, not to a union",
                        derive.name()
                    ),
                ));
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
        let cpu = cpu_path(&info.ops_path());
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

    /// The path to quant-ops.
    pub fn ops_path(&self) -> Path {
        self.options.krate.clone().unwrap_or_else(ops_path)
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

fn cpu_path(ops: &Path) -> TokenStream {
    quote!(#ops::layers::derive::dfdx::tensor::Cpu)
}

/// The paths an expansion uses.
pub struct Paths {
    /// The support module `quant_ops::layers::derive`.
    pub sup: TokenStream,
    /// dfdx, through the support module.
    pub dfdx: TokenStream,
    /// dfdx's CPU device.
    pub cpu: TokenStream,
    /// `Result<T, QuantError>`.
    pub result: TokenStream,
}

impl Paths {
    /// The paths under quant-ops at `ops`.
    pub fn new(ops: &Path) -> Paths {
        let sup = quote!(#ops::layers::derive);
        Paths {
            dfdx: quote!(#sup::dfdx),
            cpu: cpu_path(ops),
            result: quote!(#sup::Result),
            sup,
        }
    }
}

/// One field of a `TensorCollection::iter_tensors` visit.
pub struct Visit {
    /// The saved name.
    pub name: String,
    /// The place, after `s.` (`weight`, `layer.weight`).
    pub place: TokenStream,
    /// Whether it is a tensor (else a module).
    pub tensor: bool,
}

/// `(fields, pattern)` for `visitor.visit_fields(fields, |pattern| ...)`: dfdx implements its
/// field lists for tuples of up to six, so longer lists nest.
fn nest(items: Vec<(TokenStream, TokenStream)>) -> (TokenStream, TokenStream) {
    if items.len() <= 6 {
        let (fields, patterns): (Vec<_>, Vec<_>) = items.into_iter().unzip();
        return (quote!((#(#fields,)*)), quote!((#(#patterns,)*)));
    }
    let mut groups = Vec::new();
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        let chunk: Vec<_> = items.by_ref().take(6).collect();
        groups.push(nest(chunk));
    }
    nest(groups)
}

/// The binding of the `k`-th visited field in the builder closure.
pub fn binding(k: usize) -> Ident {
    format_ident!("__field{}", k)
}

/// The field list and closure pattern of a visit, with tensor options from the support module.
pub fn visit_fields(paths: &Paths, visits: &[Visit]) -> (TokenStream, TokenStream) {
    let sup = &paths.sup;
    let items = visits
        .iter()
        .enumerate()
        .map(|(k, v)| {
            let name = &v.name;
            let place = &v.place;
            let field = if v.tensor {
                quote!(Self::tensor(#name, |s| &s.#place, |s| &mut s.#place, #sup::param_options()))
            } else {
                quote!(Self::module(#name, |s| &s.#place, |s| &mut s.#place))
            };
            (field, binding(k).to_token_stream())
        })
        .collect();
    nest(items)
}

/// `impl TensorCollection` for a struct that is not generic over the dtype and device: `To` is
/// `Option<Self>`, built only when every visited field is the concrete type it stores (f32 on
/// the CPU). `build` is the struct literal, with each field bound by [`binding`] and passed
/// through `field::<Type, _>`.
pub fn concrete_collection(
    paths: &Paths,
    self_ty: &TokenStream,
    generics: &Generics,
    visits: &[Visit],
    build: TokenStream,
) -> TokenStream {
    let Paths { dfdx, cpu, .. } = paths;
    let (impl_generics, _, where_clause) = generics.split_for_impl();
    let (fields, pattern) = visit_fields(paths, visits);
    quote! {
        impl #impl_generics #dfdx::nn::TensorCollection<f32, #cpu> for #self_ty #where_clause {
            type To<__E2: #dfdx::shapes::Dtype, __D2: #dfdx::tensor_ops::Device<__E2>> =
                ::core::option::Option<Self>;

            fn iter_tensors<__V: #dfdx::nn::ModuleVisitor<Self, f32, #cpu>>(
                visitor: &mut __V,
            ) -> ::core::result::Result<
                ::core::option::Option<Self::To<__V::E2, __V::D2>>,
                __V::Err,
            > {
                visitor.visit_fields(#fields, |#pattern| ::core::option::Option::Some(#build))
            }
        }
    }
}

/// `field::<ty, _>(binding?)` for the builder of [`concrete_collection`].
pub fn rebuilt(paths: &Paths, k: usize, ty: &dyn ToTokens) -> TokenStream {
    let sup = &paths.sup;
    let b = binding(k);
    quote!(#sup::field::<#ty, _>(#b)?)
}

/// `impl TensorCollection` for the float struct: dfdx-style (`To<E2, D2>` is the struct with E2
/// and D2) when it is generic over the dtype/device pair, else [`concrete_collection`]; plus
/// an inherent `build(&Cpu)` for the latter, which `dev.build_module` cannot build.
pub fn float_collection(info: &StructInfo, paths: &Paths, visits: &[Visit]) -> TokenStream {
    let ident = &info.ident;
    let Paths { sup, dfdx, cpu, .. } = paths;
    let (Some(e), Some(d)) = (&info.dtype, &info.device) else {
        let self_ty = info.concrete_self(paths);
        let generics = info.concrete_generics();
        let (impl_generics, _, where_clause) = generics.split_for_impl();
        let inits = info.fields.iter().enumerate().map(|(k, f)| {
            let fi = &f.ident;
            let r = rebuilt(paths, k, &f.concrete);
            quote!(#fi: #r)
        });
        let collection = concrete_collection(
            paths,
            &self_ty,
            &generics,
            visits,
            quote!(Self { #(#inits,)* }),
        );
        return quote! {
            #collection

            // The user may never call it (a model built by hand or loaded).
            #[allow(dead_code)]
            impl #impl_generics #self_ty #where_clause {
                /// Builds the layer on `dev`, every tensor initialised as its options say (this
                /// struct is not generic over the dtype and device, so `dev.build_module` cannot
                /// build it; conversion and `load_safetensors` work as for any module).
                ///
                /// # Errors
                /// Allocation fails, or a field cannot be rebuilt by dfdx's visitors (a tuple
                /// holding a struct that is not generic over the dtype and device).
                pub fn build(dev: &#cpu) -> #sup::Result<Self> {
                    #sup::build::<Self>(dev)
                }
            }
        };
    };
    let mut generics = info.generics.clone();
    {
        let w = generics.make_where_clause();
        w.predicates.push(syn::parse_quote!(#e: #sup::FloatDtype));
        w.predicates
            .push(syn::parse_quote!(#d: #dfdx::tensor_ops::Device<#e>));
    }
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    let to_args = info.args_with(&quote!(__E2), &quote!(__D2));
    let (fields, pattern) = visit_fields(paths, visits);
    let inits = info.fields.iter().enumerate().map(|(k, f)| {
        let fi = &f.ident;
        let b = binding(k);
        quote!(#fi: #b)
    });
    quote! {
        impl #impl_generics #dfdx::nn::TensorCollection<#e, #d> for #ident #ty_generics #where_clause {
            type To<__E2: #dfdx::shapes::Dtype, __D2: #dfdx::tensor_ops::Device<__E2>> = #ident #to_args;

            fn iter_tensors<__V: #dfdx::nn::ModuleVisitor<Self, #e, #d>>(
                visitor: &mut __V,
            ) -> ::core::result::Result<
                ::core::option::Option<Self::To<__V::E2, __V::D2>>,
                __V::Err,
            > {
                visitor.visit_fields(#fields, |#pattern| #ident { #(#inits,)* })
            }
        }
    }
}

/// Generics with one more type parameter `name` in front.
pub fn with_type_param(generics: &Generics, name: &Ident) -> Generics {
    let mut g = generics.clone();
    g.params
        .insert(0, GenericParam::Type(syn::TypeParam::from(name.clone())));
    g
}

/// A doc attribute.
pub fn doc(text: &str) -> TokenStream {
    quote!(#[doc = #text])
}
