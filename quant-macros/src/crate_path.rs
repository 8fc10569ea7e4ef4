//! Finding quant-core from the user's crate, and collecting errors to report all at once.

use proc_macro2::{Span, TokenStream};
use proc_macro_crate::{crate_name, FoundCrate};
use quote::quote;
use syn::Path;

/// The path to quant-core as the calling crate sees it: `::quant_core` (or its renamed name)
/// when it is a direct dependency or the crate itself, else `::quant` (the facade re-exports
/// every item at its root), else `::quant_core` (the compiler then says it is missing;
/// `crate = path` overrides).
pub fn core_path() -> Path {
    package_path("quant-core")
}

/// The path to a package of the workspace as the calling crate sees it: `::package` (or its
/// renamed name) when it is a direct dependency or the crate itself, else the facade's root,
/// else `::package`.
fn package_path(package: &str) -> Path {
    let ident = |name: &str| syn::Ident::new(&name.replace('-', "_"), Span::call_site());
    let own = ident(package);
    match crate_name(package) {
        Ok(FoundCrate::Itself) => return syn::parse_quote!(::#own),
        Ok(FoundCrate::Name(name)) => {
            let name = ident(&name);
            return syn::parse_quote!(::#name);
        }
        Err(_) => {}
    }
    if let Ok(FoundCrate::Name(facade)) = crate_name("quant") {
        let facade = ident(&facade);
        return syn::parse_quote!(::#facade);
    }
    syn::parse_quote!(::#own)
}

/// Errors collected while checking an attribute, reported together.
#[derive(Default)]
pub struct Errors(Vec<syn::Error>);

impl Errors {
    /// Adds one.
    pub fn push(&mut self, e: syn::Error) {
        self.0.push(e);
    }
    /// Whether none were added.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// How many were added.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// One `compile_error!` per error, each on its own span.
    pub fn to_compile_errors(&self) -> TokenStream {
        let errs = self.0.iter().map(syn::Error::to_compile_error);
        quote!(#(#errs)*)
    }
}

/// The path to quant-dfdx as the calling crate sees it: `::quant_dfdx` (or its renamed name)
/// when it is a direct dependency or the crate itself, else `::quant` (the facade), else
/// `::quant_dfdx` (the compiler then says it is missing; `crate = path` overrides).
pub fn dfdx_path() -> Path {
    package_path("quant-dfdx")
}
