//! What `#[derive(QuantizedLayer)]` and `#[derive(QuantizedModel)]` share: the `#[quantized(...)]`
//! grammar and its checks, the checks of the struct's shape and generics, the paths the
//! expansions use, and the dfdx `TensorCollection` boilerplate.
//!
//! Every problem is a `syn::Error` on the offending token, collected and reported at once.

mod attrs;
mod collection;
mod structure;

pub use attrs::*;
pub use collection::*;
pub use structure::*;
