//! Exact integer kernels for int8 inference: a matrix product of `u8` activation codes with
//! packed weight codes into `i32` ([`gemm_u8`]), requantization of the accumulators into the
//! next layer's `u8` codes ([`requantize_u8`], [`Requantizer`]), the NHWC helpers a
//! convolution needs ([`im2col_u8`], [`max_pool_u8`]), and depthwise convolution
//! ([`DepthwiseFilter`], taps accumulated across channels without im2col).
//!
//! Every result is exact: the matrix product is the integer sum, modulo `2^32` (so it is the
//! true value whenever that fits `i32`, which the caller guarantees), and requantization
//! rounds the exact product `acc · m / 2^shift` once, with any
//! [`RoundingPolicy`](crate::RoundingPolicy).
//!
//! # Instruction sets
//! The widest instructions the CPU has are chosen at run time ([`Isa::detected`]); a default
//! build needs no `-C target-cpu`. [`Isa::Portable`] is scalar Rust and the reference: every
//! other path gives the same bits (the property tests in `quant-core/tests/integration/int8.rs` force each
//! path the CPU has with [`PackedMatrix::with_isa`], [`Requantizer::with_isa`] and
//! [`DepthwiseFilter::with_isa`]).
//!
//! | path | weights within ±64 | weights within `i8` | wider weights (`i16`) |
//! |---|---|---|---|
//! | [`Isa::Avx2`] | `vpmaddubsw` + `vpmaddwd` | `vpmaddwd` | `vpmaddwd` |
//! | [`Isa::Avx512Bw`] | `vpmaddubsw` + `vpmaddwd` | `vpmaddwd` | `vpmaddwd` |
//! | [`Isa::AvxVnni`] | `vpdpbusd` | `vpdpbusd` | `vpdpwssd` |
//! | [`Isa::Avx512Vnni`] | `vpdpbusd` | `vpdpbusd` | `vpdpwssd` |
//!
//! `vpmaddubsw` adds two `u8 × i8` products into a saturating `i16`: exact only while
//! `2 · 255 · |w| ≤ 32767`, that is `|w| ≤ 64`; wider weights take the `i16` products of
//! `vpmaddwd`, which never saturate. VNNI's `vpdpbusd` adds four `u8 × i8` products straight
//! into `i32`. Without VNNI, where the activations' largest code and the weights' largest
//! magnitude keep a run of `vpmaddubsw` pair sums within `i16`, they are added in `i16` lanes
//! and widened once per run.
//!
//! The attention products ([`attention_scores_u8`], [`attention_context_u8`]) run on the same
//! tiles where the keys' (values') centered codes suit its `i8` weights (within ±64 without
//! VNNI, within `i8` with it; any 4-bit grid): each sample's keys or values are packed as the
//! weights of one small product per head. Otherwise they take `vpmaddwd` on centered `i16`
//! codes.
//!
//! The micro-kernel keeps a tile of rows × output channels in registers (8 × 32 on AVX-512,
//! 4 × 16 or 6 × 16 on 256-bit paths) and streams the weights in the order it reads them:
//! [`PackedMatrix`] stores each panel of 16 (or 8) output channels as groups of 4 (or 2)
//! consecutive fan-in codes per channel. Products with at least [`PARALLEL_MACS`]
//! multiply-adds are split by rows across rayon's threads (any split gives the same integers).
//!
//! ```
//! use quant_core::int8::{gemm_u8, requantize_u8, fixed_point_multiplier, PackedMatrix};
//! use quant_core::RoundingPolicy;
//!
//! // Two output channels over a fan-in of 3, centered weight codes w - z_w.
//! let w = PackedMatrix::new(&[1, -2, 3, 0, 5, -1], 2, 3)?;
//! // One row of activation codes with zero point 10.
//! let mut acc = [0i32; 2];
//! gemm_u8(&[12, 10, 11], 1, 10, &w, &[100, -7], &mut acc)?;
//! assert_eq!(acc, [100 + 2 + 3, -7 - 1]); // Σ (a - 10) · w + bias
//! // Into u8 codes with zero point 128: 105 · 0.25 = 26.25 → 26, -8 · 0.25 = -2.
//! let m = fixed_point_multiplier(0.25)?;
//! let mut codes = [0u8; 2];
//! requantize_u8(&acc, 2, &[m, m], 128, 0, 255, RoundingPolicy::HalfEven, &mut codes)?;
//! assert_eq!(codes, [154, 126]);
//! # Ok::<(), quant_core::QuantError>(())
//! ```

mod attention;
mod code_map;
mod depthwise;
mod gemm;
mod nhwc;
pub mod nonlinear;
mod requant;
pub(crate) mod widths;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

use crate::error::check_len;

pub use attention::{attention_context_u8, attention_scores_u8, AttentionShape};
pub use code_map::{CodeMap, SumMap};
pub use depthwise::DepthwiseFilter;
pub use gemm::{gemm_u8, PackedMatrix, PARALLEL_MACS};
pub use nhwc::{conv_u8, im2col_u8, max_pool_i32, max_pool_u8, Window};
pub use requant::{fixed_point_multiplier, requantize_u8, rounding_shift, Requantizer, MAX_SHIFT};

/// The sums `x + y + offset` of two tensors of `u8` codes, as `i32` (a residual add of two
/// tensors on one grid: `offset = -2 · zero_point`), vectorized for the widest path this CPU
/// runs. The sums wrap modulo 2^32 as `i32::wrapping_add` where `offset` is within 510 of an
/// end of `i32`.
///
/// ```
/// let sums = quant_core::int8::add_u8(&[0, 10, 255], &[7, 10, 255], -2 * 8)?;
/// assert_eq!(sums, [-9, 4, 494]);
/// # Ok::<(), quant_core::QuantError>(())
/// ```
///
/// # Errors
/// `y` not as long as `x`.
pub fn add_u8(x: &[u8], y: &[u8], offset: i32) -> crate::Result<Vec<i32>> {
    check_len("add: second input", x.len(), y.len())?;
    widths::compiled_for_each_width! {
        fn add_by_width<>(x: &[u8], y: &[u8], offset: i32) -> Vec<i32> => add_codes;
    }
    // Collected (not written into a zeroed buffer): one pass over the output.
    #[inline(always)]
    fn add_codes(x: &[u8], y: &[u8], offset: i32) -> Vec<i32> {
        x.iter()
            .zip(y)
            .map(|(p, q)| (*p as i32 + *q as i32).wrapping_add(offset))
            .collect()
    }
    Ok(add_by_width(Isa::detected(), x, y, offset))
}

/// The widest path [`Isa::detected`] may pick, as an [`Isa`]'s discriminant; `u8::MAX`: no
/// limit.
static WIDEST_PATH: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(u8::MAX);

/// The instruction-set paths of the integer kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Scalar Rust on any CPU: the reference every other path matches bit for bit.
    Portable,
    /// x86-64 AVX2 (256-bit registers).
    Avx2,
    /// x86-64 AVX-512 F + BW (512-bit registers, no VNNI).
    Avx512Bw,
    /// x86-64 AVX-VNNI: `vpdpbusd` on 256-bit registers (CPUs without AVX-512, such as Alder
    /// Lake, and Zen 5).
    AvxVnni,
    /// x86-64 AVX-512 VNNI: `vpdpbusd` on 512-bit registers (Ice Lake and later Xeons, Zen 4).
    Avx512Vnni,
}

impl Isa {
    /// Every path, from the reference to the widest.
    pub const ALL: [Isa; 5] = [
        Isa::Portable,
        Isa::Avx2,
        Isa::Avx512Bw,
        Isa::AvxVnni,
        Isa::Avx512Vnni,
    ];

    /// Whether this CPU can run the path (checked at run time).
    pub fn is_available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx512 = || has!("avx512f") && has!("avx512bw");
            match self {
                Isa::Portable => true,
                Isa::Avx2 => has!("avx2"),
                Isa::Avx512Bw => avx512(),
                Isa::AvxVnni => has!("avx2") && has!("avxvnni"),
                Isa::Avx512Vnni => avx512() && has!("avx512vnni"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Isa::Portable
        }
    }

    /// The paths this CPU can run, from the reference to the widest.
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_available()).collect()
    }

    /// The fastest path this CPU can run, within [`Isa::limit_to`]'s limit if one was set:
    /// VNNI on 512 bits, then on 256 bits, then AVX-512, AVX2, and the portable code. Every
    /// kernel prepared after this takes its path from here.
    pub fn detected() -> Isa {
        let widest = Isa::limit();
        Isa::ALL
            .into_iter()
            .rev()
            .find(|i| i.is_available() && widest.is_none_or(|w| *i <= w))
            .unwrap_or(Isa::Portable)
    }

    /// From now on, this process's [`Isa::detected`] picks no path after `widest` in
    /// [`Isa::ALL`]: `Isa::limit_to(Isa::Avx2)` runs every kernel prepared afterwards (the
    /// integer runtime's, and the fake-quantization kernels of training) as on a CPU with
    /// AVX2 and nothing newer, `Isa::Portable` as on any x86-64. For measuring what an older
    /// CPU's paths cost on a newer one (`quant eval --max-isa`, `bench_models --max-isa`);
    /// every path gives the same bits, so results do not change. Kernels prepared before the
    /// call keep their path.
    ///
    /// ```
    /// use quant_core::int8::{Isa, PackedMatrix};
    /// Isa::limit_to(Isa::Avx2);
    /// assert_eq!(Isa::limit(), Some(Isa::Avx2));
    /// assert!(Isa::detected() <= Isa::Avx2);
    /// assert!(PackedMatrix::new(&[1, -2, 3, 4], 2, 2)?.isa() <= Isa::Avx2);
    /// Isa::limit_to(Isa::Portable);
    /// assert_eq!(Isa::detected(), Isa::Portable);
    /// # Ok::<(), quant_core::QuantError>(())
    /// ```
    pub fn limit_to(widest: Isa) {
        WIDEST_PATH.store(widest as u8, std::sync::atomic::Ordering::Relaxed);
    }

    /// The limit [`Isa::limit_to`] set, if any.
    pub fn limit() -> Option<Isa> {
        let widest = WIDEST_PATH.load(std::sync::atomic::Ordering::Relaxed);
        Isa::ALL.into_iter().find(|i| *i as u8 == widest)
    }

    /// The path of this [name](Isa::name).
    ///
    /// # Errors
    /// A name that is none of [`Isa::ALL`]'s; the message lists them.
    ///
    /// ```
    /// use quant_core::int8::Isa;
    /// assert_eq!(Isa::from_name("avx2")?, Isa::Avx2);
    /// assert!(Isa::from_name("avx3").unwrap_err().to_string().contains("avx512vnni"));
    /// # Ok::<(), quant_core::QuantError>(())
    /// ```
    pub fn from_name(name: &str) -> crate::Result<Isa> {
        Isa::ALL
            .into_iter()
            .find(|i| i.name() == name)
            .ok_or_else(|| crate::QuantError::InvalidValue {
                what: "int8 instruction set".into(),
                value: name.into(),
                expected: format!("one of {}", Isa::ALL.map(|i| i.name()).join(", ")),
            })
    }

    /// The name used in messages and benchmarks (`portable`, `avx2`, `avx512bw`, `avxvnni`,
    /// `avx512vnni`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512Bw => "avx512bw",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512Vnni => "avx512vnni",
        }
    }

    /// `Ok(self)` when this CPU can run the path, else an error that says which paths it can.
    fn check_available(self) -> crate::Result<Isa> {
        if self.is_available() {
            return Ok(self);
        }
        Err(crate::QuantError::InvalidValue {
            what: "int8 instruction set".into(),
            value: self.name().into(),
            expected: format!(
                "one this CPU supports: {}",
                Isa::available()
                    .iter()
                    .map(|i| i.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `a · b` for buffer sizes, or an error naming `what` when it overflows.
fn checked_size(what: &str, a: usize, b: usize) -> crate::Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| crate::QuantError::InvalidValue {
            what: what.into(),
            value: format!("{a} x {b}"),
            expected: "a size that fits in memory".into(),
        })
}
