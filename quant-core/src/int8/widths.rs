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
