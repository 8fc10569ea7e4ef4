//! Macros several modules share.
//!
//! - `tensor_collection!`: dfdx's `TensorCollection` for a struct, from the list of its
//!   fields. dfdx 0.13 has no derive for it; written by hand, every layer repeats the visitor
//!   frame and names each field three times (key, getter, mutable getter). Here a layer names
//!   each field once, with its key in save files when that differs from the field's name and
//!   its options when it holds a tensor or a scalar rather than a module.
//! - `for_each_tuple!`: the tuple arities a model may chain, in one place.
//! - `impl_for_conv!`: the seven const parameters of a convolution's geometry, which every
//!   impl over the stable `Conv2d` and its quantized twin lists, in one place.

/// Implements `TensorCollection<E, D>` (the dtype and device parameters must be called `E` and
/// `D`; `To` is written with `E2` and `D2`):
///
/// ```text
/// tensor_collection! {
///     impl[generics] Type<.., E, D> => Type<.., E2, D2> $(where [bounds])?;
///     Name { field, field as "key", field: tensor(options), field: scalar(options) }
///         $(with { unvisited_field: value, ... })?
/// }
/// ```
///
/// A field without a kind is a module; its key in save files is its name unless `as` gives
/// one. `Name(field as "key")` is a one-field tuple struct. Fields after `with` are not
/// visited: a struct the visitor rebuilds (on another dtype or device) gets those values.
macro_rules! tensor_collection {
    (
        impl[$($generics:tt)*] $ty:ty => $to:ty $(where [$($bounds:tt)*])?;
        $name:ident { $($field:ident $(as $key:literal)? $(: $kind:ident($options:expr))?),+ $(,)? }
        $(with { $($unvisited:ident: $value:expr),+ $(,)? })?
    ) => {
        tensor_collection!(@impl [$($generics)*] $ty => $to [$($($bounds)*)?] |visitor| {
            visitor.visit_fields(
                ($(tensor_collection!(@field $field [$($key)?] [$($kind($options))?]),)+),
                |($($field,)+)| $name { $($field,)+ $($($unvisited: $value,)+)? },
            )
        });
    };
    (
        impl[$($generics:tt)*] $ty:ty => $to:ty $(where [$($bounds:tt)*])?;
        $name:ident($field:tt as $key:literal)
    ) => {
        tensor_collection!(@impl [$($generics)*] $ty => $to [$($($bounds)*)?] |visitor| {
            visitor.visit_fields(Self::module($key, |s| &s.$field, |s| &mut s.$field), $name)
        });
    };
    (@impl [$($generics:tt)*] $ty:ty => $to:ty [$($bounds:tt)*] |$visitor:ident| $body:block) => {
        impl<$($generics)*> ::dfdx::nn::tensor_collection::TensorCollection<E, D> for $ty
        where $($bounds)*
        {
            type To<E2: ::dfdx::prelude::Dtype, D2: ::dfdx::prelude::Device<E2>> = $to;

            fn iter_tensors<Visitor: ::dfdx::nn::tensor_collection::ModuleVisitor<Self, E, D>>(
                $visitor: &mut Visitor,
            ) -> ::std::result::Result<Option<Self::To<Visitor::E2, Visitor::D2>>, Visitor::Err> {
                $body
            }
        }
    };
    (@field $field:ident [] [$($kind:ident($options:expr))?]) => {
        tensor_collection!(@field $field [stringify!($field)] [$($kind($options))?])
    };
    (@field $field:ident [$key:expr] []) => {
        Self::module($key, |s| &s.$field, |s| &mut s.$field)
    };
    (@field $field:ident [$key:expr] [$kind:ident($options:expr)]) => {
        Self::$kind($key, |s| &s.$field, |s| &mut s.$field, $options)
    };
}

/// Invokes `$m!` once per tuple arity dfdx implements `Module` for (1 to 6), with the element
/// type names and indices (`A 0, B 1, ...`), so that conversion and the model walk cover the
/// same tuples.
macro_rules! for_each_tuple {
    ($m:ident) => {
        $m!(A 0);
        $m!(A 0, B 1);
        $m!(A 0, B 1, C 2);
        $m!(A 0, B 1, C 2, D 3);
        $m!(A 0, B 1, C 2, D 3, E 4);
        $m!(A 0, B 1, C 2, D 3, E 4, F 5);
    };
}

/// Writes `impl<const C_IN, const C_OUT, const K, const S, const P, const G, const CG, ..>`:
/// an impl over every geometry of [`Conv2d`](crate::nn::Conv2d) (input and output channels,
/// kernel, stride, padding, groups and input channels per group), followed by the impl's own
/// generics in brackets and the rest of the item.
///
/// ```text
/// impl_for_conv! { [E: Dtype] Trait for Conv2d<C_IN, C_OUT, K, S, P, G, CG, E> { .. } }
/// ```
macro_rules! impl_for_conv {
    ([$($generics:tt)*] $($item:tt)*) => {
        impl<
            const C_IN: usize,
            const C_OUT: usize,
            const K: usize,
            const S: usize,
            const P: usize,
            const G: usize,
            const CG: usize,
            $($generics)*
        > $($item)*
    };
}
