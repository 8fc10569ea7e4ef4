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
            // SAFETY: `new`/`with_isa` checked that this CPU runs AVX-512 F + BW.
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
            // SAFETY: `new`/`with_isa` checked that this CPU runs AVX-512 F + BW.
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

    /// `out = table[clamp(x, lo, hi) - lo]`, 32 codes at a time; returns how many it did.
    ///
    /// # Safety
    /// The CPU runs AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn shuffle_avx2(
        table: [u8; 16],
        [lo, hi]: [u8; 2],
        x: &[u8],
        out: &mut [u8],
    ) -> usize {
        let n = x.len().min(out.len());
        let whole = n - n % 32;
        // SAFETY: `table` holds 16 bytes.
        let table = _mm256_broadcastsi128_si256(unsafe {
            _mm_loadu_si128(table.as_ptr() as *const __m128i)
        });
        let (lo, hi) = (_mm256_set1_epi8(lo as i8), _mm256_set1_epi8(hi as i8));
        let mut o = 0;
        while o < whole {
            // SAFETY: `o + 32 <= whole <= x.len()`: the 32 bytes from `o` lie in `x`.
            let v = unsafe { _mm256_loadu_si256(x.as_ptr().add(o) as *const __m256i) };
            // Clamped and less `lo`: an index in 0..16, which the shuffle reads in each lane.
            let index = _mm256_sub_epi8(_mm256_min_epu8(_mm256_max_epu8(v, lo), hi), lo);
            // SAFETY: `o + 32 <= whole <= out.len()`.
            unsafe {
                _mm256_storeu_si256(
                    out.as_mut_ptr().add(o) as *mut __m256i,
                    _mm256_shuffle_epi8(table, index),
                )
            };
            o += 32;
        }
        whole
    }

    /// `out = table[clamp(x) - lo + clamp(y) - lo]` for sums in `0..31`, 32 codes at a time,
    /// from the table's halves; returns how many it did.
    ///
    /// # Safety
    /// The CPU runs AVX2; `hi - lo < 16`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn sum_shuffle_avx2(
        tables: [[u8; 16]; 2],
        [lo, hi]: [u8; 2],
        x: &[u8],
        y: &[u8],
        out: &mut [u8],
    ) -> usize {
        let n = x.len().min(y.len()).min(out.len());
        let whole = n - n % 32;
        let [low, high] = tables.map(|t| {
            // SAFETY: each half holds 16 bytes.
            let half = unsafe { _mm_loadu_si128(t.as_ptr() as *const __m128i) };
            _mm256_broadcastsi128_si256(half)
        });
        let (lo, hi) = (_mm256_set1_epi8(lo as i8), _mm256_set1_epi8(hi as i8));
        let fifteen = _mm256_set1_epi8(15);
        let mut o = 0;
        while o < whole {
            // SAFETY: `o + 32 <= whole`, within `x`, `y` and `out`.
            let (p, q) = unsafe {
                (
                    _mm256_loadu_si256(x.as_ptr().add(o) as *const __m256i),
                    _mm256_loadu_si256(y.as_ptr().add(o) as *const __m256i),
                )
            };
            let unit = |v| _mm256_sub_epi8(_mm256_min_epu8(_mm256_max_epu8(v, lo), hi), lo);
            // In 0..31: the shuffles read its low four bits, the compare picks the half.
            let sum = _mm256_add_epi8(unit(p), unit(q));
            let upper = _mm256_cmpgt_epi8(sum, fifteen);
            let mapped = _mm256_blendv_epi8(
                _mm256_shuffle_epi8(low, sum),
                _mm256_shuffle_epi8(high, sum),
                upper,
            );
            // SAFETY: as above.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(o) as *mut __m256i, mapped) };
            o += 32;
        }
        whole
    }

    /// As [`sum_shuffle_avx2`], 64 codes at a time.
    ///
    /// # Safety
    /// The CPU runs AVX-512 F and BW; `hi - lo < 16`.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn sum_shuffle_avx512(
        tables: [[u8; 16]; 2],
        [lo, hi]: [u8; 2],
        x: &[u8],
        y: &[u8],
        out: &mut [u8],
    ) -> usize {
        let n = x.len().min(y.len()).min(out.len());
        let whole = n - n % 64;
        let [low, high] = tables.map(|t| {
            // SAFETY: each half holds 16 bytes.
            let half = unsafe { _mm_loadu_si128(t.as_ptr() as *const __m128i) };
            _mm512_broadcast_i32x4(half)
        });
        let (lo, hi) = (_mm512_set1_epi8(lo as i8), _mm512_set1_epi8(hi as i8));
        let fifteen = _mm512_set1_epi8(15);
        let mut o = 0;
        while o < whole {
            // SAFETY: `o + 64 <= whole`, within `x`, `y` and `out`.
            let (p, q) = unsafe {
                (
                    _mm512_loadu_si512(x.as_ptr().add(o) as *const __m512i),
                    _mm512_loadu_si512(y.as_ptr().add(o) as *const __m512i),
                )
            };
            let unit = |v| _mm512_sub_epi8(_mm512_min_epu8(_mm512_max_epu8(v, lo), hi), lo);
            let sum = _mm512_add_epi8(unit(p), unit(q));
            let upper = _mm512_cmpgt_epu8_mask(sum, fifteen);
            let mapped = _mm512_mask_blend_epi8(
                upper,
                _mm512_shuffle_epi8(low, sum),
                _mm512_shuffle_epi8(high, sum),
            );
            // SAFETY: as above.
            unsafe { _mm512_storeu_si512(out.as_mut_ptr().add(o) as *mut __m512i, mapped) };
            o += 64;
        }
        whole
    }

    /// As [`shuffle_avx2`], 64 codes at a time.
    ///
    /// # Safety
    /// The CPU runs AVX-512 F and BW.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn shuffle_avx512(
        table: [u8; 16],
        [lo, hi]: [u8; 2],
        x: &[u8],
        out: &mut [u8],
    ) -> usize {
        let n = x.len().min(out.len());
        let whole = n - n % 64;
        // SAFETY: `table` holds 16 bytes.
        let table =
            _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(table.as_ptr() as *const __m128i) });
        let (lo, hi) = (_mm512_set1_epi8(lo as i8), _mm512_set1_epi8(hi as i8));
        let mut o = 0;
        while o < whole {
            // SAFETY: `o + 64 <= whole <= x.len()`: the 64 bytes from `o` lie in `x`.
            let v = unsafe { _mm512_loadu_si512(x.as_ptr().add(o) as *const __m512i) };
            let index = _mm512_sub_epi8(_mm512_min_epu8(_mm512_max_epu8(v, lo), hi), lo);
            // SAFETY: `o + 64 <= whole <= out.len()`.
            unsafe {
                _mm512_storeu_si512(
                    out.as_mut_ptr().add(o) as *mut __m512i,
                    _mm512_shuffle_epi8(table, index),
                )
            };
            o += 64;
        }
        whole
    }
}
