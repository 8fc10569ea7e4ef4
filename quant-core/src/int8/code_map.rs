//! [`CodeMap`]: an elementwise map of `u8` codes onto `u8` codes, by table.

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
