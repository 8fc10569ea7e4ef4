//! `#[mark_quantizer(target = ..., method = [...], id = ...)]`: parse and check the attribute,
//! then emit the metadata impl and the registry entry. Every problem is reported on its own
//! token, all at once, and the struct is always re-emitted so one mistake does not cascade.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, Ident, Item, Path, Token};

use crate::crate_path::{core_path, Errors};

/// Targets known to quant-core (`QuantizationTarget`).
const TARGETS: &[&str] = &["Weights", "Activation"];
/// Methods known to quant-core (`QuantizationMethod`).
const METHODS: &[&str] = &["Symmetric", "PowerOfTwo", "Uniform"];
const KEYS: &str = "`target`, `method`, `id`, `crate`";

/// One `key = value` of the attribute, value unparsed.
struct Arg {
    key: Ident,
    value: Expr,
}

impl Parse for Arg {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let key: Ident = if input.peek(Token![crate]) {
            let kw: Token![crate] = input.parse()?;
            Ident::new("crate", kw.span)
        } else {
            input.parse()?
        };
        if !input.peek(Token![=]) {
            return Err(syn::Error::new(
                input.span(),
                format!(
                    "expected `{key} = ...`: every argument of mark_quantizer is `key = value`"
                ),
            ));
        }
        input.parse::<Token![=]>()?;
        let value: Expr = input.parse()?;
        Ok(Arg { key, value })
    }
}

struct Args(Punctuated<Arg, Token![,]>);

impl Parse for Args {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        Ok(Args(Punctuated::parse_terminated(input)?))
    }
}

/// The checked attribute.
struct Attr {
    target: Ident,
    methods: Vec<Ident>,
    id: Path,
    krate: Option<Path>,
}

fn as_ident(e: &Expr, what: &str, valid: &str, errors: &mut Errors) -> Option<Ident> {
    match e {
        Expr::Path(p) if p.qself.is_none() && p.path.get_ident().is_some() => {
            p.path.get_ident().cloned()
        }
        _ => {
            errors.push(syn::Error::new_spanned(
                e,
                format!("expected {what} as a bare identifier ({valid})"),
            ));
            None
        }
    }
}

fn check_known(ident: &Ident, known: &[&str], what: &str, errors: &mut Errors) -> bool {
    if known.iter().any(|k| ident == k) {
        return true;
    }
    errors.push(syn::Error::new_spanned(
        ident,
        format!(
            "unknown {what} `{ident}`; expected one of: {}",
            known.join(", ")
        ),
    ));
    false
}

fn parse_attr(args: TokenStream, errors: &mut Errors) -> Option<Attr> {
    let args: Args = match syn::parse2(args) {
        Ok(a) => a,
        Err(e) => {
            errors.push(e);
            return None;
        }
    };
    let mut target: Option<Ident> = None;
    let mut methods: Option<Vec<Ident>> = None;
    let mut id: Option<Path> = None;
    let mut krate: Option<Path> = None;
    let mut seen: Vec<String> = Vec::new();
    // Any error from here on leaves the attribute unusable; all of them are still reported.
    let errors_before = errors.len();
    let error = |tokens: &dyn quote::ToTokens, message: String, errors: &mut Errors| {
        errors.push(syn::Error::new_spanned(tokens, message))
    };
    for arg in args.0 {
        let key = arg.key.to_string();
        if seen.contains(&key) {
            error(&arg.key, format!("`{key}` is given more than once"), errors);
            continue;
        }
        seen.push(key.clone());
        match key.as_str() {
            "target" => {
                if let Some(t) = as_ident(&arg.value, "a target", "Weights or Activation", errors) {
                    if check_known(&t, TARGETS, "target", errors) {
                        target = Some(t);
                    }
                }
            }
            "method" => {
                // Decided: `method = Symmetric` is accepted as a one-element list.
                let elems: Vec<Expr> = match &arg.value {
                    Expr::Array(a) if a.elems.is_empty() => {
                        let valid = METHODS.join(", ");
                        let message = format!("`method` needs at least one quantization method: {valid}");
                        error(&arg.value, message, errors);
                        continue;
                    }
                    Expr::Array(a) => a.elems.iter().cloned().collect(),
                    other => vec![other.clone()],
                };
                let mut list: Vec<Ident> = Vec::new();
                for e in &elems {
                    let Some(m) = as_ident(e, "a quantization method", &METHODS.join(", "), errors)
                    else {
                        continue;
                    };
                    if !check_known(&m, METHODS, "quantization method", errors) {
                        continue;
                    }
                    if list.contains(&m) {
                        error(&m, format!("method `{m}` is listed twice"), errors);
                    } else {
                        list.push(m);
                    }
                }
                methods = Some(list);
            }
            // `id = Lsq` or `id = TrainingMethod::Lsq`: keep the last segment, which names an
            // associated constant of `TrainingMethod` (built in or from a `training_methods!`
            // extension trait in scope).
            "id" => match &arg.value {
                Expr::Path(p) if p.qself.is_none() => {
                    let segments = &p.path.segments;
                    let qualified_ok = segments.len() == 1
                        || (segments.len() == 2 && segments[0].ident == "TrainingMethod");
                    match segments.last() {
                        Some(last) if qualified_ok => id = Some(Path::from(last.ident.clone())),
                        _ => error(
                            &p.path,
                            "expected a training-method id: `Lsq` or `TrainingMethod::Lsq`".into(),
                            errors,
                        ),
                    }
                }
                other => error(
                    other,
                    "expected a training-method id as an identifier (Ste, Lsq, Pact, Dsq, or one declared with training_methods!)".into(),
                    errors,
                ),
            },
            "crate" => match &arg.value {
                Expr::Path(p) if p.qself.is_none() => krate = Some(p.path.clone()),
                other => error(
                    other,
                    "expected a path to quant-core, e.g. `crate = ::quant`".into(),
                    errors,
                ),
            },
            _ => error(
                &arg.key,
                format!("unknown key `{key}`; expected one of {KEYS}"),
                errors,
            ),
        }
    }
    let missing = |key: &str, form: &str, errors: &mut Errors| {
        errors.push(syn::Error::new(
            Span::call_site(),
            format!("mark_quantizer is missing `{key} = {form}`"),
        ));
    };
    if target.is_none() && !seen.iter().any(|k| k == "target") {
        missing("target", "Weights | Activation", errors);
    }
    if methods.is_none() && !seen.iter().any(|k| k == "method") {
        missing("method", "[Symmetric, PowerOfTwo, Uniform]", errors);
    }
    if id.is_none() && !seen.iter().any(|k| k == "id") {
        missing("id", "<training method, e.g. Lsq>", errors);
    }
    if errors.len() > errors_before {
        return None;
    }
    Some(Attr {
        target: target?,
        methods: methods?,
        id: id?,
        krate,
    })
}

/// Expands `#[mark_quantizer(...)]` on `item`.
pub fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let attr = parse_attr(args, &mut errors);
    let parsed: Option<syn::ItemStruct> = match syn::parse2::<Item>(item.clone()) {
        Ok(Item::Struct(s)) => Some(s),
        Ok(other) => {
            let span_of = match &other {
                Item::Enum(e) => e.enum_token.span(),
                Item::Fn(f) => f.sig.fn_token.span(),
                Item::Union(u) => u.union_token.span(),
                Item::Trait(t) => t.trait_token.span(),
                Item::Type(t) => t.type_token.span(),
                Item::Impl(i) => i.impl_token.span(),
                _ => other.span(),
            };
            errors.push(syn::Error::new(
                span_of,
                "mark_quantizer applies to a struct: the quantizer's configuration and its TrainableQuantizer impl",
            ));
            None
        }
        Err(e) => {
            errors.push(e);
            None
        }
    };
    if let Some(s) = &parsed {
        if !s.generics.params.is_empty() {
            errors.push(syn::Error::new_spanned(
                &s.generics,
                "a registered quantizer cannot be generic: the registry builds it from a config alone; \
                 make a non-generic struct (or register one per instantiation with a newtype)",
            ));
        }
    }
    let (Some(attr), Some(s)) = (attr, parsed) else {
        let errs = errors.to_compile_errors();
        return quote!(#item #errs);
    };
    if !errors.is_empty() {
        let errs = errors.to_compile_errors();
        return quote!(#item #errs);
    }
    let krate = attr.krate.clone().unwrap_or_else(core_path);
    let name = &s.ident;
    let name_str = name.to_string();
    let target = &attr.target;
    let methods = &attr.methods;
    let id = &attr.id;
    let id_tokens = quote_spanned!(id.span()=> #krate::TrainingMethod::#id);
    let entry_fn = if target == "Weights" {
        quote!(weights)
    } else {
        quote!(activation)
    };
    // Spanned on the struct's name: the entry's trait bound is what checks that the struct
    // implements the quantizer trait of its target.
    let entry =
        quote_spanned!(name.span()=> #krate::__private::QuantizerEntry::#entry_fn::<#name>());
    let item_tokens = s.to_token_stream();
    quote! {
        #item_tokens

        impl #krate::MarkedQuantizer for #name {
            const METADATA: #krate::QuantizerMetadata = #krate::QuantizerMetadata {
                target: #krate::QuantizationTarget::#target,
                methods: &[#(#krate::QuantizationMethod::#methods),*],
                training_method: #id_tokens,
                name: #name_str,
                module_path: ::core::module_path!(),
            };
        }

        const _: () = {
            #[#krate::__private::linkme::distributed_slice(#krate::__private::QUANTIZERS)]
            #[linkme(crate = #krate::__private::linkme)]
            static REGISTRATION: #krate::__private::QuantizerEntry = #entry;
        };
    }
}
