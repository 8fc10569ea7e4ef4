//! The `#[quantized(...)]` grammar: struct- and field-level keys, their values and checks.

use quote::quote;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Attribute, Expr, Ident, Lit, Meta, Path, Token};

use crate::crate_path::Errors;

/// Which derive is expanding.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Derive {
    /// `#[derive(QuantizedLayer)]`.
    Layer,
    /// `#[derive(QuantizedModel)]`.
    Model,
}

impl Derive {
    pub(super) fn name(self) -> &'static str {
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

    /// The keys `#[quantized(...)]` accepts on a field (`on_field`) or on the struct.
    fn keys(self, on_field: bool) -> &'static [&'static str] {
        if on_field {
            self.field_keys()
        } else {
            self.struct_keys()
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
    if derive.keys(!on_field).contains(&key) {
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
    let valid = derive.keys(on_field);
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

/// The arguments of `#[quantized(...)]` in `attrs` with their keys, the first of each key.
fn keyed_args(attrs: &[Attribute], errors: &mut Errors) -> Vec<(String, Arg)> {
    let args = first_of_each(quantized_args(attrs, errors), errors);
    args.into_iter()
        .map(|arg| (arg.key.unraw().to_string(), arg))
        .collect()
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
    /// `crate = path`: the path to quant-dfdx.
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
    for (key, arg) in keyed_args(attrs, errors) {
        match key.as_str() {
            key if !derive.keys(false).contains(&key) => {
                errors.push(unknown_key(derive, &arg.key, false))
            }
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
                let Some(v) = value(&arg, "crate = ::quant", errors) else {
                    continue;
                };
                match v {
                    Expr::Path(p) if p.qself.is_none() => opts.krate = Some(p.path.clone()),
                    other => errors.push(syn::Error::new_spanned(
                        other,
                        "expected a path to quant-dfdx, e.g. `crate = ::quant`",
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
    for (key, arg) in keyed_args(attrs, errors) {
        match key.as_str() {
            key if !derive.keys(true).contains(&key) => {
                errors.push(unknown_key(derive, &arg.key, true))
            }
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
