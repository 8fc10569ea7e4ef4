//! The paths the expansions use, the dfdx `TensorCollection` boilerplate, and the frame of the
//! `QuantizedModule` impl both derives emit.

use proc_macro2::TokenStream;
use quote::{format_ident, quote, ToTokens};
use syn::{GenericParam, Generics, Ident, Path};

use super::structure::*;

pub(super) fn cpu_path(krate: &Path) -> TokenStream {
    quote!(#krate::layers::derive::dfdx::tensor::Cpu)
}

/// The paths an expansion uses.
pub struct Paths {
    /// The support module `quant_dfdx::layers::derive`.
    pub sup: TokenStream,
    /// dfdx, through the support module.
    pub dfdx: TokenStream,
    /// dfdx's CPU device.
    pub cpu: TokenStream,
    /// `Result<T, QuantError>`.
    pub result: TokenStream,
}

impl Paths {
    /// The paths under quant-dfdx, reached at `krate`.
    pub fn new(krate: &Path) -> Paths {
        let sup = quote!(#krate::layers::derive);
        Paths {
            dfdx: quote!(#sup::dfdx),
            cpu: cpu_path(krate),
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
    let cpu = &paths.cpu;
    collection_impl(
        paths,
        generics,
        self_ty,
        [quote!(f32), quote!(#cpu)],
        quote!(::core::option::Option<Self>),
        visits,
        quote!(::core::option::Option::Some(#build)),
    )
}

/// `impl TensorCollection<E, D> for self_ty` (with `generics`' parameters and where-clause)
/// whose `To<__E2, __D2>` is `to`: it visits `visits` and rebuilds from their bindings with
/// `rebuild`.
pub fn collection_impl(
    paths: &Paths,
    generics: &Generics,
    self_ty: &TokenStream,
    [e, d]: [TokenStream; 2],
    to: TokenStream,
    visits: &[Visit],
    rebuild: TokenStream,
) -> TokenStream {
    let dfdx = &paths.dfdx;
    let (impl_generics, _, where_clause) = generics.split_for_impl();
    let (fields, pattern) = visit_fields(paths, visits);
    quote! {
        impl #impl_generics #dfdx::nn::TensorCollection<#e, #d> for #self_ty #where_clause {
            type To<__E2: #dfdx::shapes::Dtype, __D2: #dfdx::tensor_ops::Device<__E2>> = #to;

            fn iter_tensors<__V: #dfdx::nn::ModuleVisitor<Self, #e, #d>>(
                visitor: &mut __V,
            ) -> ::core::result::Result<
                ::core::option::Option<Self::To<__V::E2, __V::D2>>,
                __V::Err,
            > {
                visitor.visit_fields(#fields, |#pattern| #rebuild)
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
    let (_, ty_generics, _) = generics.split_for_impl();
    let to_args = info.args_with(&quote!(__E2), &quote!(__D2));
    let inits = info.fields.iter().enumerate().map(|(k, f)| {
        let fi = &f.ident;
        let b = binding(k);
        quote!(#fi: #b)
    });
    collection_impl(
        paths,
        &generics,
        &quote!(#ident #ty_generics),
        [quote!(#e), quote!(#d)],
        quote!(#ident #to_args),
        visits,
        quote!(#ident { #(#inits,)* }),
    )
}

/// `impl QuantizedModule for self_ty` (with `generics`' parameters and where-clause):
/// `visit_slots` runs the tokens `visit_slots` (with `name` and `f` in scope), `lower` runs the
/// tokens `lower` (with `name`, `g` and `x` in scope).
pub fn quantized_module_impl(
    paths: &Paths,
    generics: &Generics,
    self_ty: &TokenStream,
    visit_slots: TokenStream,
    lower: TokenStream,
) -> TokenStream {
    let Paths { sup, result, .. } = paths;
    let (impl_generics, _, where_clause) = generics.split_for_impl();
    quote! {
        impl #impl_generics #sup::QuantizedModule for #self_ty #where_clause {
            fn visit_slots(
                &mut self,
                name: &str,
                f: &mut dyn FnMut(#sup::SlotRef<'_>) -> #result<()>,
            ) -> #result<()> {
                #visit_slots
            }

            fn lower(
                &self,
                name: &str,
                g: &mut #sup::GraphBuilder,
                x: #sup::ValueId,
            ) -> ::core::result::Result<#sup::ValueId, #sup::GraphError> {
                #lower
            }
        }
    }
}

/// A `lower` body for a layer the graph IR cannot describe: an `GraphError::Unsupported`
/// naming the layer (`name`), with `reason`.
pub fn refuse_lowering(paths: &Paths, reason: &str) -> TokenStream {
    let sup = &paths.sup;
    quote! {
        ::core::result::Result::Err(#sup::GraphError::Unsupported {
            layer: ::std::string::ToString::to_string(name),
            reason: ::std::string::ToString::to_string(#reason),
        })
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
