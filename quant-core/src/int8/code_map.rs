//! [`CodeMap`] and [`SumMap`]: elementwise maps of `u8` codes, and of sums of two, onto `u8`
//! codes, by table.

use std::ops::RangeInclusive;

use super::Isa;
use crate::error::check_len;
use crate::{QuantError, Result};

/// An elementwise map of stored `u8` codes onto `u8` codes, given by its value at each code of
/// an input range; a code outside the range maps as the nearest end of it.
///
/// Where an op's output depends on one code alone and a per-tensor requantization follows,
/// the two together are a function of the input code: at most 256 values, computed once by
/// the kernels themselves, then one table lookup per value instead of an `i32` value written,
/// read and requantized. The integer runtime composes a GELU and the requantization after it
/// this way, and a per-tensor requantization of codes.
///
/// Inputs of at most 16 codes (4-bit grids) run as a byte shuffle (`vpshufb`) on AVX2 and
/// AVX-512, 32 or 64 codes at a time; wider ones, and [`Isa::Portable`], read the table one
/// code at a time. Every path gives the table's values.
///
/// ```
/// use quant_core::int8::CodeMap;
/// // Codes 3..=5 onto 10, 20, 30; codes below 3 map as 3, above 5 as 5.
/// let map = CodeMap::new(3..=5, &[10, 20, 30])?;
/// let mut out = [0u8; 5];
/// map.run(&[0, 3, 4, 5, 255], &mut out)?;
/// assert_eq!(out, [10, 10, 20, 30, 30]);
/// # Ok::<(), quant_core::QuantError>(())
/// ```
#[derive(Debug, Clone)]
pub struct CodeMap {
    /// The output of every byte (those outside the input range as the nearest end).
    table: Box<[u8; 256]>,
    inputs: RangeInclusive<u8>,
    isa: Isa,
}

/// The widest input range the byte shuffle holds.
const SHUFFLE_CODES: usize = 16;

impl CodeMap {
    /// The most input codes (of a [`SumMap`], codes of each input) the vector paths take: 16,
    /// every 4-bit grid. Wider maps read their table one value at a time, which is slower than
    /// a vectorized requantization.
    pub const SHUFFLE_CODES: usize = SHUFFLE_CODES;

    /// The map of code `inputs.start() + i` onto `outputs[i]`.
    ///
    /// # Errors
    /// An empty input range, or `outputs` not one value per input code.
    pub fn new(inputs: RangeInclusive<u8>, outputs: &[u8]) -> Result<CodeMap> {
        let (lo, hi) = (*inputs.start(), *inputs.end());
        if lo > hi {
            return Err(QuantError::InvalidRange {
                quant_min: lo as i32,
                quant_max: hi as i32,
                reason: "the input codes of a code map need min <= max",
            });
        }
        check_len(
            "code map outputs (one per input code)",
            (hi - lo) as usize + 1,
            outputs.len(),
        )?;
        let mut table = Box::new([0u8; 256]);
        for (code, out) in table.iter_mut().enumerate() {
            *out = outputs[(code as u8).clamp(lo, hi) as usize - lo as usize];
        }
        Ok(CodeMap {
            table,
            inputs,
            isa: Isa::detected(),
        })
    }

    /// The codes it maps; others map as the nearest end.
    pub fn inputs(&self) -> RangeInclusive<u8> {
        self.inputs.clone()
    }

    /// The output of one code.
    pub fn get(&self, code: u8) -> u8 {
        self.table[code as usize]
    }

    /// The same map on the path `isa` (tests and benchmarks use it to force a path; every
    /// path gives the same codes).
    ///
    /// # Errors
    /// A path this CPU cannot run.
    pub fn with_isa(mut self, isa: Isa) -> Result<CodeMap> {
        self.isa = isa.check_available()?;
        Ok(self)
    }

    /// The path it runs on.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Maps every code of `x` into `out`.
    ///
    /// # Errors
    /// `out` not as long as `x`; nothing is written then.
    pub fn run(&self, x: &[u8], out: &mut [u8]) -> Result<()> {
        check_len("code map output", x.len(), out.len())?;
        let (lo, hi) = (*self.inputs.start(), *self.inputs.end());
        let narrow = ((hi - lo) as usize) < SHUFFLE_CODES;
        let done = match self.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `new`/`with_isa` checked that this CPU runs AVX-512 F + BW; `narrow`:
            // `hi - lo < 16`.
            Isa::Avx512Bw | Isa::Avx512Vnni if narrow => unsafe {
                x86::shuffle_avx512(self.shuffle_table(), [lo, hi], x, out)
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, for AVX2.
            Isa::Avx2 | Isa::AvxVnni if narrow => unsafe {
                x86::shuffle_avx2(self.shuffle_table(), [lo, hi], x, out)
            },
            _ => 0,
        };
        for (o, q) in out[done..].iter_mut().zip(&x[done..]) {
            *o = self.table[*q as usize];
        }
        Ok(())
    }

    /// The outputs of the 16 codes from the input range's start (past its end, the end's).
    fn shuffle_table(&self) -> [u8; SHUFFLE_CODES] {
        let lo = *self.inputs.start() as usize;
        std::array::from_fn(|i| self.table[(lo + i).min(255)])
    }
}

/// An elementwise map of the sums of two `u8` codes of one grid onto `u8` codes, given by its
/// value at each sum; each code is first clamped into the grid.
///
/// A residual add of two code tensors on one grid (`x + y - 2z` at the grid's scale) and a
/// per-tensor requantization after it are together a function of `x + y`: the integer runtime
/// composes them into one of these, read once per value instead of an `i32` sum written, read
/// and requantized.
///
/// Grids of at most 16 codes (sums in 31 values) run as two byte shuffles (`vpshufb`) on AVX2
/// and AVX-512, 32 or 64 codes at a time; wider ones, and [`Isa::Portable`], read the table one
/// sum at a time. Every path gives the table's values.
///
/// ```
/// use quant_core::int8::SumMap;
/// // Codes 0..=2, so sums 0..=4: onto 0, 0, 1, 1, 2 (half the sum, ties down).
/// let map = SumMap::new(0..=2, &[0, 0, 1, 1, 2])?;
/// let mut out = [0u8; 3];
/// map.run(&[0, 1, 2], &[1, 2, 9], &mut out)?;
/// assert_eq!(out, [0, 1, 2]); // 9 is clamped to 2
/// # Ok::<(), quant_core::QuantError>(())
/// ```
#[derive(Debug, Clone)]
pub struct SumMap {
    /// The output of each sum of clamped codes, less `2 · lo`.
    table: Vec<u8>,
    codes: RangeInclusive<u8>,
    isa: Isa,
}

impl SumMap {
    /// The map of the sum `2 · codes.start() + k` onto `outputs[k]`.
    ///
    /// # Errors
    /// An empty code range, or `outputs` not one value per sum (`2 · (hi - lo) + 1`).
    pub fn new(codes: RangeInclusive<u8>, outputs: &[u8]) -> Result<SumMap> {
        let (lo, hi) = (*codes.start(), *codes.end());
        if lo > hi {
            return Err(QuantError::InvalidRange {
                quant_min: lo as i32,
                quant_max: hi as i32,
                reason: "the input codes of a sum map need min <= max",
            });
        }
        check_len(
            "sum map outputs (one per sum of two codes)",
            2 * (hi - lo) as usize + 1,
            outputs.len(),
        )?;
        Ok(SumMap {
            table: outputs.to_vec(),
            codes,
            isa: Isa::detected(),
        })
    }

    /// The codes each input is clamped into.
    pub fn codes(&self) -> RangeInclusive<u8> {
        self.codes.clone()
    }

    /// The same map on the path `isa` (every path gives the same codes).
    ///
    /// # Errors
    /// A path this CPU cannot run.
    pub fn with_isa(mut self, isa: Isa) -> Result<SumMap> {
        self.isa = isa.check_available()?;
        Ok(self)
    }

    /// The path it runs on.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Maps the sum of each code of `x` and the one beside it in `y` into `out`.
    ///
    /// # Errors
    /// `y` or `out` not as long as `x`; nothing is written then.
    pub fn run(&self, x: &[u8], y: &[u8], out: &mut [u8]) -> Result<()> {
        check_len("sum map: second input", x.len(), y.len())?;
        check_len("sum map output", x.len(), out.len())?;
        let (lo, hi) = (*self.codes.start(), *self.codes.end());
        let narrow = ((hi - lo) as usize) < SHUFFLE_CODES;
        let done = match self.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `new`/`with_isa` checked that this CPU runs AVX-512 F + BW; `narrow`:
            // `hi - lo < 16`.
            Isa::Avx512Bw | Isa::Avx512Vnni if narrow => unsafe {
                x86::sum_shuffle_avx512(self.shuffle_tables(), [lo, hi], x, y, out)
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, for AVX2.
            Isa::Avx2 | Isa::AvxVnni if narrow => unsafe {
                x86::sum_shuffle_avx2(self.shuffle_tables(), [lo, hi], x, y, out)
            },
            _ => 0,
        };
        for ((o, p), q) in out[done..].iter_mut().zip(&x[done..]).zip(&y[done..]) {
            let sum = (p.clamp(&lo, &hi) - lo) as usize + (q.clamp(&lo, &hi) - lo) as usize;
            *o = self.table[sum];
        }
        Ok(())
    }

    /// The outputs of sums `0..16` and `16..32` above `2 · lo` (past the last, the last's).
    fn shuffle_tables(&self) -> [[u8; SHUFFLE_CODES]; 2] {
        let last = self.table.len() - 1;
        std::array::from_fn(|half| {
            std::array::from_fn(|i| self.table[(half * SHUFFLE_CODES + i).min(last)])
        })
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// The byte operations of one register width the maps need. Each is an `unsafe fn` whose
    /// callers guarantee the width's instruction set (AVX2 for `__m256i`, AVX-512 F + BW for
    /// `__m512i`); the `#[target_feature]` entries below inline them.
    trait Bytes: Copy {
        /// Bytes per register.
        const LANES: usize;
        /// A 16-byte table in every 128-bit lane.
        unsafe fn table(t: &[u8; 16]) -> Self;
        /// Every byte `v`.
        unsafe fn splat(v: u8) -> Self;
        /// `LANES` bytes from `p`, which points to that many readable bytes.
        unsafe fn load(p: *const u8) -> Self;
        /// Stores every byte at `p`, which points to `LANES` writable bytes.
        unsafe fn store(p: *mut u8, v: Self);
        /// `clamp(v, lo, hi) - lo`, unsigned.
        unsafe fn unit(v: Self, lo: Self, hi: Self) -> Self;
        /// Wrapping byte sums.
        unsafe fn add(a: Self, b: Self) -> Self;
        /// `vpshufb`: each byte below 128 picks the byte of its low four bits in its lane.
        unsafe fn shuffle(table: Self, index: Self) -> Self;
        /// `if v > 15 { upper } else { lower }` per byte, for `v` below 128.
        unsafe fn above_15(v: Self, lower: Self, upper: Self) -> Self;
    }

    impl Bytes for __m256i {
        const LANES: usize = 32;
        #[inline(always)]
        unsafe fn table(t: &[u8; 16]) -> Self {
            // SAFETY: `t` holds 16 bytes; the caller guarantees AVX2.
            unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr() as *const __m128i)) }
        }
        #[inline(always)]
        unsafe fn splat(v: u8) -> Self {
            // SAFETY: the caller guarantees AVX2.
            unsafe { _mm256_set1_epi8(v as i8) }
        }
        #[inline(always)]
        unsafe fn load(p: *const u8) -> Self {
            // SAFETY: the caller guarantees AVX2 and 32 readable bytes at `p`.
            unsafe { _mm256_loadu_si256(p as *const __m256i) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut u8, v: Self) {
            // SAFETY: the caller guarantees AVX2 and 32 writable bytes at `p`.
            unsafe { _mm256_storeu_si256(p as *mut __m256i, v) }
        }
        #[inline(always)]
        unsafe fn unit(v: Self, lo: Self, hi: Self) -> Self {
            // SAFETY: the caller guarantees AVX2.
            unsafe { _mm256_sub_epi8(_mm256_min_epu8(_mm256_max_epu8(v, lo), hi), lo) }
        }
        #[inline(always)]
        unsafe fn add(a: Self, b: Self) -> Self {
            // SAFETY: the caller guarantees AVX2.
            unsafe { _mm256_add_epi8(a, b) }
        }
        #[inline(always)]
        unsafe fn shuffle(table: Self, index: Self) -> Self {
            // SAFETY: the caller guarantees AVX2.
            unsafe { _mm256_shuffle_epi8(table, index) }
        }
        #[inline(always)]
        unsafe fn above_15(v: Self, lower: Self, upper: Self) -> Self {
            // SAFETY: the caller guarantees AVX2.
            unsafe {
                let upper_half = _mm256_cmpgt_epi8(v, _mm256_set1_epi8(15));
                _mm256_blendv_epi8(lower, upper, upper_half)
            }
        }
    }

    impl Bytes for __m512i {
        const LANES: usize = 64;
        #[inline(always)]
        unsafe fn table(t: &[u8; 16]) -> Self {
            // SAFETY: `t` holds 16 bytes; the caller guarantees AVX-512 F.
            unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(t.as_ptr() as *const __m128i)) }
        }
        #[inline(always)]
        unsafe fn splat(v: u8) -> Self {
            // SAFETY: the caller guarantees AVX-512 F.
            unsafe { _mm512_set1_epi8(v as i8) }
        }
        #[inline(always)]
        unsafe fn load(p: *const u8) -> Self {
            // SAFETY: the caller guarantees AVX-512 F and 64 readable bytes at `p`.
            unsafe { _mm512_loadu_si512(p as *const __m512i) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut u8, v: Self) {
            // SAFETY: the caller guarantees AVX-512 F and 64 writable bytes at `p`.
            unsafe { _mm512_storeu_si512(p as *mut __m512i, v) }
        }
        #[inline(always)]
        unsafe fn unit(v: Self, lo: Self, hi: Self) -> Self {
            // SAFETY: the caller guarantees AVX-512 BW.
            unsafe { _mm512_sub_epi8(_mm512_min_epu8(_mm512_max_epu8(v, lo), hi), lo) }
        }
        #[inline(always)]
        unsafe fn add(a: Self, b: Self) -> Self {
            // SAFETY: the caller guarantees AVX-512 BW.
            unsafe { _mm512_add_epi8(a, b) }
        }
        #[inline(always)]
        unsafe fn shuffle(table: Self, index: Self) -> Self {
            // SAFETY: the caller guarantees AVX-512 BW.
            unsafe { _mm512_shuffle_epi8(table, index) }
        }
        #[inline(always)]
        unsafe fn above_15(v: Self, lower: Self, upper: Self) -> Self {
            // SAFETY: the caller guarantees AVX-512 BW.
            unsafe {
                let upper_half = _mm512_cmpgt_epu8_mask(v, _mm512_set1_epi8(15));
                _mm512_mask_blend_epi8(upper_half, lower, upper)
            }
        }
    }

    /// `out = table[clamp(x, lo, hi) - lo]`, a register at a time; returns how many it did.
    ///
    /// # Safety
    /// The CPU runs `R`'s instruction set; `hi - lo < 16`.
    #[inline(always)]
    unsafe fn codes<R: Bytes>(
        table: [u8; 16],
        [lo, hi]: [u8; 2],
        x: &[u8],
        out: &mut [u8],
    ) -> usize {
        let n = x.len().min(out.len());
        let whole = n - n % R::LANES;
        // SAFETY: the caller guarantees the instruction set.
        let (table, lo, hi) = unsafe { (R::table(&table), R::splat(lo), R::splat(hi)) };
        let mut o = 0;
        while o < whole {
            // SAFETY: `o + LANES <= whole`, within `x` and `out`; the instruction set as above.
            // Clamped and less `lo`: an index in 0..16, which the shuffle reads.
            unsafe {
                let index = R::unit(R::load(x.as_ptr().add(o)), lo, hi);
                R::store(out.as_mut_ptr().add(o), R::shuffle(table, index));
            }
            o += R::LANES;
        }
        whole
    }

    /// `out = table[clamp(x) - lo + clamp(y) - lo]` for sums in `0..31`, from the table's two
    /// halves, a register at a time; returns how many it did.
    ///
    /// # Safety
    /// The CPU runs `R`'s instruction set; `hi - lo < 16`.
    #[inline(always)]
    unsafe fn sums<R: Bytes>(
        [low, high]: [[u8; 16]; 2],
        [lo, hi]: [u8; 2],
        x: &[u8],
        y: &[u8],
        out: &mut [u8],
    ) -> usize {
        let n = x.len().min(y.len()).min(out.len());
        let whole = n - n % R::LANES;
        // SAFETY: the caller guarantees the instruction set.
        let (low, high, lo, hi) =
            unsafe { (R::table(&low), R::table(&high), R::splat(lo), R::splat(hi)) };
        let mut o = 0;
        while o < whole {
            // SAFETY: `o + LANES <= whole`, within `x`, `y` and `out`; the instruction set as
            // above. The sum is in 0..31: the shuffles read its low four bits, the compare
            // picks the half.
            unsafe {
                let p = R::unit(R::load(x.as_ptr().add(o)), lo, hi);
                let q = R::unit(R::load(y.as_ptr().add(o)), lo, hi);
                let sum = R::add(p, q);
                let mapped = R::above_15(sum, R::shuffle(low, sum), R::shuffle(high, sum));
                R::store(out.as_mut_ptr().add(o), mapped);
            }
            o += R::LANES;
        }
        whole
    }

    /// [`codes`] on AVX2.
    ///
    /// # Safety
    /// The CPU runs AVX2; `hi - lo < 16`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn shuffle_avx2(t: [u8; 16], r: [u8; 2], x: &[u8], out: &mut [u8]) -> usize {
        // SAFETY: as the caller guarantees.
        unsafe { codes::<__m256i>(t, r, x, out) }
    }

    /// [`codes`] on AVX-512.
    ///
    /// # Safety
    /// The CPU runs AVX-512 F and BW; `hi - lo < 16`.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn shuffle_avx512(
        t: [u8; 16],
        r: [u8; 2],
        x: &[u8],
        out: &mut [u8],
    ) -> usize {
        // SAFETY: as the caller guarantees.
        unsafe { codes::<__m512i>(t, r, x, out) }
    }

    /// [`sums`] on AVX2.
    ///
    /// # Safety
    /// The CPU runs AVX2; `hi - lo < 16`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn sum_shuffle_avx2(
        t: [[u8; 16]; 2],
        r: [u8; 2],
        x: &[u8],
        y: &[u8],
        out: &mut [u8],
    ) -> usize {
        // SAFETY: as the caller guarantees.
        unsafe { sums::<__m256i>(t, r, x, y, out) }
    }

    /// [`sums`] on AVX-512.
    ///
    /// # Safety
    /// The CPU runs AVX-512 F and BW; `hi - lo < 16`.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn sum_shuffle_avx512(
        t: [[u8; 16]; 2],
        r: [u8; 2],
        x: &[u8],
        y: &[u8],
        out: &mut [u8],
    ) -> usize {
        // SAFETY: as the caller guarantees.
        unsafe { sums::<__m512i>(t, r, x, y, out) }
    }
}
