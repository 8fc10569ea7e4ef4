//! Kernels written once, as plain Rust loops, and compiled three times: for any x86-64 (the
//! reference), with AVX2 enabled and with AVX-512 enabled, so that the compiler vectorizes the
//! same loops with the widest registers the CPU has. A default build targets baseline x86-64
//! (SSE2), where the compiler cannot use `vpmullq`, `vpsravq` or 512-bit registers at all.
//!
//! The kernels compiled this way use integer arithmetic, or float operations IEEE rounds exactly
//! (division, no fused multiply-add), which have one answer whatever instructions compute them:
//! every width gives the same bits. The property tests still run each width the CPU has
//! against the reference (`with_isa` on each kernel).

use super::Isa;

/// The register width a kernel of this module is compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Width {
    /// Baseline x86-64 (or any other architecture): the reference.
    Portable,
    /// AVX2.
    Avx2,
    /// AVX-512 F, BW, DQ and VL (and AVX2): 64-bit multiplies and shifts in vector registers.
    Avx512,
}

impl Isa {
    /// The width the vectorized loops of this path run at. The AVX-512 paths need DQ as well
    /// (`vpmullq`); a CPU with F and BW but no DQ runs them at AVX2 width.
    pub(crate) fn width(self) -> Width {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx512 = has!("avx512f")
                && has!("avx512bw")
                && has!("avx512dq")
                && has!("avx512vl")
                && has!("avx2");
            match self {
                Isa::Portable => Width::Portable,
                Isa::Avx512Bw | Isa::Avx512Vnni if avx512 => Width::Avx512,
                // Every path but the portable one runs on a CPU with AVX2 in practice; checked
                // here all the same, since AVX-512 F does not formally promise it.
                _ if has!("avx2") => Width::Avx2,
                _ => Width::Portable,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = self;
            Width::Portable
        }
    }
}

/// Defines `$name(isa, args…)`, which runs `$body(args…)` (an `#[inline(always)]` function)
/// compiled for `isa`'s [`Width`], which checks the CPU's features itself: any `isa` is safe.
macro_rules! compiled_for_each_width {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident<$($g:ident: $bound:path),*>($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?
            => $body:path;
    ) => {
        $(#[$meta])*
        $vis fn $name<$($g: $bound),*>(isa: $crate::int8::Isa, $($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                fn avx2<$($g: $bound),*>($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2")]
                fn avx512<$($g: $bound),*>($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                match isa.width() {
                    $crate::int8::widths::Width::Avx512 => {
                        // SAFETY: `Isa::width` gives `Width::Avx512` only after checking that
                        // this CPU runs AVX-512 F, BW, DQ, VL and AVX2, what `avx512` enables.
                        return unsafe { avx512($($arg),*) };
                    }
                    $crate::int8::widths::Width::Avx2 => {
                        // SAFETY: `Isa::width` gives `Width::Avx2` only after checking that this
                        // CPU runs AVX2, what `avx2` enables.
                        return unsafe { avx2($($arg),*) };
                    }
                    $crate::int8::widths::Width::Portable => {}
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = isa;
            $body($($arg),*)
        }
    };
}

pub(crate) use compiled_for_each_width;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::__m256i;

/// Defines `$name(a, b)`: the AVX2 instruction `$instruction` on two registers, written as
/// assembly because the compiler otherwise folds the multiply intrinsics into the shifts and
/// sign extensions around them and emits a full 64-bit product (three multiplies and as many
/// shifts each). For the AVX2 kernels of the softmax's `exp` and the LayerNorm's outputs.
macro_rules! one_instruction {
    ($(#[$doc:meta])* $name:ident = $instruction:literal) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2")]
        #[inline]
        pub(crate) fn $name(a: __m256i, b: __m256i) -> __m256i {
            let product;
            // SAFETY: one instruction on registers, which this function's AVX2 provides.
            unsafe {
                std::arch::asm!(
                    concat!($instruction, " {p}, {a}, {b}"),
                    p = lateout(ymm_reg) product,
                    a = in(ymm_reg) a,
                    b = in(ymm_reg) b,
                    options(pure, nomem, nostack, preserves_flags),
                )
            };
            product
        }
    };
}

one_instruction! {
    /// `vpmuldq`: the products of the low 32 bits of each 64-bit lane, read as signed.
    mul_epi32 = "vpmuldq"
}
one_instruction! {
    /// `vpmuludq`: the same, the low halves read as unsigned.
    mul_epu32 = "vpmuludq"
}
