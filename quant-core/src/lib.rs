//! # quant-core
//!
//! The vocabulary and the machinery of `quant`: what is quantized
//! ([`QuantizationTarget`]), how the grid is laid out ([`QuantizationMethod`],
//! [`IntegerGrid`]), how a quantizer trains ([`TrainingMethod`]), how values round
//! ([`RoundingPolicy`]), quantization parameters ([`QParams`]), exact fake-quantization
//! [`kernels`] on slices, differentiable dfdx ops ([`dfdx_ops`], behind the default `dfdx` feature), the [`TrainableQuantizer`] trait, the
//! [`InferableQuantizer`] a trained quantizer becomes, the quantizer [`registry`], and the
//! exact [`int8`] kernels (matrix product, requantization, im2col, pooling) that integer
//! inference runs on, with the widest instructions the CPU has.
//!
//! ```
//! use quant_core::kernels::fake_quantize_per_tensor_affine;
//! use quant_core::{qparams_from_range, IntegerGrid, QuantizationMethod};
//!
//! // 4-bit symmetric (MCT's threshold convention): scale = 2.0 / 8.
//! let grid = IntegerGrid::new(4, true, false)?;
//! let (scale, zero_point) = qparams_from_range(QuantizationMethod::Symmetric, grid, -1.0, 2.0)?;
//! assert_eq!((scale, zero_point), (0.25, 0));
//! let y = fake_quantize_per_tensor_affine(&[0.3, -0.125, 5.0], scale, zero_point, grid.quant_min(), grid.quant_max())?;
//! assert_eq!(y, vec![0.25, 0.0, 1.75]); // -0.5 rounds half to even → 0; 5.0 clamps to 7 * 0.25
//! # Ok::<(), quant_core::QuantError>(())
//! ```
//!
//! Most users depend on the `quant` facade crate, which re-exports this one.

// Lets `::quant_core::...` paths emitted by the macros resolve inside this crate's own tests.
extern crate self as quant_core;

/// Serde through a type's constructor: `$repr` holds `$name`'s fields as files store them
/// (unknown fields rejected); `$name` deserializes by passing them, in field order, to
/// `$name::new`, which checks them, and serializes through them. `$name` derives `Serialize`
/// and `Deserialize` with `#[serde(try_from = "$repr", into = "$repr")]`.
macro_rules! serde_via_new {
    ($name:ident as $repr:ident { $($(#[$attr:meta])* $field:ident: $ty:ty),* $(,)? }) => {
        #[derive(serde::Serialize, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct $repr {
            $($(#[$attr])* $field: $ty,)*
        }

        impl TryFrom<$repr> for $name {
            type Error = $crate::QuantError;
            fn try_from(r: $repr) -> $crate::Result<Self> {
                $name::new($(r.$field),*)
            }
        }

        impl From<$name> for $repr {
            fn from(v: $name) -> Self {
                $repr { $($field: v.$field),* }
            }
        }
    };
}

pub mod accumulator;
pub mod config;
#[cfg(feature = "dfdx")]
pub mod dfdx_ops;
pub mod error;
pub mod grid;
pub mod inferable;
pub mod int8;
pub mod kernels;
pub mod quantizer;
pub mod registry;
pub mod scratch;
pub mod vocab;

pub use config::{ActivationQuantizerConfig, QuantizerConfig, WeightsQuantizerConfig};
pub use error::{QuantError, Result};
pub use grid::{
    power_of_two_scale, power_of_two_threshold, qparams_from_range, symmetric_scale,
    uniform_qparams, IntegerGrid, QParams, MIN_SCALE,
};
pub use inferable::InferableQuantizer;
pub use quantizer::{
    ActivationQuantizer, ChannelLayout, ParamBank, ParamBankMut, ParamDecl, QuantizerInput,
    TrainableQuantizer, WeightsQuantizer, MAX_PARAMETERS,
};
pub use registry::{MarkedQuantizer, QuantizerEntry, QuantizerMetadata};
pub use vocab::{QuantizationMethod, QuantizationTarget, RoundingPolicy, TrainingMethod};

/// Not public API: what the macros' expansions refer to.
#[doc(hidden)]
pub mod __private {
    pub use crate::registry::{QuantizerEntry, QUANTIZERS, TRAINING_METHODS};
    pub use linkme;
}

/// Not public API: crate-internal kernels, reference paths and switches, reachable only so
/// that quant-core's tests (`quant-core/tests/integration`, compiled without optimisation while
/// the kernels are optimised here) can check every code path against its reference. The
/// library has no unit tests of its own: a second, optimised build of it just for them took
/// 68 of the default test tier's 1020 unit-seconds of compiling on a 2-core Zen 3. Nothing
/// here is stable.
#[doc(hidden)]
pub mod __internals {
    #[cfg(feature = "dfdx")]
    pub use crate::dfdx_ops::nonlinear::{layer_norm_backward, softmax_backward};
    pub use crate::int8::nonlinear::softmax::FixedPointExpForms;
    pub use crate::int8::nonlinear::{codes_into, codes_of};
    #[cfg(target_arch = "x86_64")]
    pub use crate::int8::x86::gemm_u8_on_avx_vnni_tiles_in_evex;
    #[cfg(feature = "dfdx")]
    pub use crate::kernels::affine::fma_available;
    #[cfg(target_arch = "x86_64")]
    pub use crate::kernels::channel_sums::sum_group_avx;
    pub use crate::kernels::channel_sums::sum_group_portable;
    pub use crate::kernels::driver::{limit_kernel_paths, VectorPath};
    #[cfg(feature = "dfdx")]
    pub use crate::kernels::exp::{exp_nonpositive, exp_nonpositive_in_place, FLUSH_BELOW};
    pub use crate::kernels::gelu::{erf_branchless, expf_reduced, gelu_forward_on, GELU_PARALLEL};
    #[cfg(target_arch = "x86_64")]
    pub use crate::kernels::pool::max_pool_2x2_avx2;
    pub use crate::kernels::pool::max_pool_2x2_portable;
    #[cfg(feature = "dfdx")]
    pub use crate::kernels::round::round_ties_even_f64;
    pub use crate::scratch::pool::Pool as ScratchPool;
}
