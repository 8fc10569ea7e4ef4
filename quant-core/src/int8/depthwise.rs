//! Depthwise convolution on NHWC `u8` codes: every channel convolved with its own filter, the
//! taps accumulated from the input's pixels. Through im2col and [`super::gemm_u8`] each channel
//! would be a product with one output row, which leaves the matrix kernel nothing to reuse and
//! costs a copy of every tap; here a tap's channels are contiguous in the input and in the
//! filter, so the wide paths run across channels in the widest registers the CPU has, several
//! output pixels at once, over one centered and padded copy of the input (`Job::centered`).

use super::nhwc::{inside, padded_input, volume, window_span, Window};
use super::{check_len, checked_size, Isa};
use crate::error::{QuantError, Result};

/// The filters of a depthwise convolution (one input and one output channel per group), as
/// centered codes `w - z_w` with the accumulator bias of each channel.
#[derive(Debug, Clone)]
pub struct DepthwiseFilter {
    channels: usize,
    kernel: [usize; 2],
    /// `[ky][kx][c]`: a tap's channels contiguous, as the NHWC input's are.
    taps: Vec<i32>,
    bias: Vec<i32>,
    isa: Isa,
}

impl DepthwiseFilter {
    /// Filters from `centered` codes laid out `[c][kh][kw]` (PyTorch's `[c, 1, kh, kw]`) and
    /// one `i32` bias per channel, for the fastest path this CPU has.
    ///
    /// # Errors
    /// `centered.len() != c·kh·kw`, `bias.len() != c`, or a zero channel count or kernel.
    pub fn new(
        centered: &[i32],
        bias: &[i32],
        channels: usize,
        kernel: [usize; 2],
    ) -> Result<DepthwiseFilter> {
        DepthwiseFilter::with_isa(centered, bias, channels, kernel, Isa::detected())
    }

    /// Like [`DepthwiseFilter::new`], for the path `isa` (tests and benchmarks force one).
    ///
    /// # Errors
    /// See [`DepthwiseFilter::new`]; also a path this CPU cannot run.
    pub fn with_isa(
        centered: &[i32],
        bias: &[i32],
        channels: usize,
        kernel: [usize; 2],
        isa: Isa,
    ) -> Result<DepthwiseFilter> {
        let isa = isa.check_available()?;
        if channels == 0 || kernel[0] == 0 || kernel[1] == 0 {
            return Err(QuantError::InvalidValue {
                what: "depthwise filter".into(),
                value: format!("{channels} channels, kernel {kernel:?}"),
                expected: "at least one channel and a kernel of at least 1x1".into(),
            });
        }
        let per_channel = checked_size("depthwise kernel", kernel[0], kernel[1])?;
        check_len(
            "depthwise weights",
            checked_size("depthwise weights", channels, per_channel)?,
            centered.len(),
        )?;
        check_len("depthwise bias", channels, bias.len())?;
        let mut taps = vec![0i32; centered.len()];
        for (ch, filter) in centered.chunks_exact(per_channel).enumerate() {
            for (tap, w) in filter.iter().enumerate() {
                taps[tap * channels + ch] = *w;
            }
        }
        Ok(DepthwiseFilter {
            channels,
            kernel,
            taps,
            bias: bias.to_vec(),
            isa,
        })
    }

    /// The path this filter runs on.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Convolves one sample `[h, w, c]` of codes with zero point `input_zero` into `out`
    /// (`[oh, ow, c]` accumulators: bias + Σ (x − z_x)·(w − z_w), in wrapping `i32` arithmetic
    /// as [`super::gemm_u8`] does, so the result equals the im2col product's bit for bit).
    /// Padding is the real value 0 and adds nothing. Returns `[oh, ow]`.
    ///
    /// ```
    /// use quant_core::int8::{DepthwiseFilter, Window};
    /// // Two channels, 1x2 kernels: channel 0 takes x[left] + x[right], channel 1 their difference.
    /// let filter = DepthwiseFilter::new(&[1, 1, 1, -1], &[0, 100], 2, [1, 2])?;
    /// let window = Window { kernel: [1, 2], stride: [1, 1], padding: [0, 0] };
    /// let mut out = [0i32; 2];
    /// let [oh, ow] = filter.run(&[12, 20, 15, 30], [1, 2, 2], window, 10, &mut out)?;
    /// assert_eq!((oh, ow), (1, 1));
    /// assert_eq!(out, [(12 - 10) + (15 - 10), 100 + (20 - 10) - (30 - 10)]);
    /// # Ok::<(), quant_core::QuantError>(())
    /// ```
    ///
    /// # Errors
    /// `input.len() != h·w·c`, `c` other than the filter's channels, a window whose kernel is
    /// not the filter's or that does not fit, or `out` not `oh·ow·c` long. Nothing is written
    /// then.
    pub fn run(
        &self,
        input: &[u8],
        shape: [usize; 3],
        window: Window,
        input_zero: i32,
        out: &mut [i32],
    ) -> Result<[usize; 2]> {
        let c = shape[2];
        check_len("depthwise input channels", self.channels, c)?;
        if window.kernel != self.kernel {
            return Err(QuantError::InvalidValue {
                what: "depthwise window".into(),
                value: format!("kernel {:?}", window.kernel),
                expected: format!("the filter's kernel {:?}", self.kernel),
            });
        }
        let [oh, ow] = window.checked_output(input.len(), shape)?;
        check_len(
            "depthwise output",
            volume("depthwise output", [oh, ow, c])?,
            out.len(),
        )?;
        let job = Job {
            filter: self,
            input,
            shape,
            window,
            input_zero,
            output: [oh, ow],
        };
        // The wide paths read a centered, padded copy of the input (see `Job::centered`);
        // where that copy would be far larger than the input and output, the reference loop.
        let centered = match self.isa {
            Isa::Portable => None,
            _ => job.centered(),
        };
        match (self.isa, centered) {
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512Bw | Isa::Avx512Vnni, Some(centered)) => {
                // SAFETY: `with_isa` checked that this CPU has AVX-512 F and BW; the lengths
                // of `out`, the input (through `centered`) and the taps were checked above.
                unsafe { job.avx512(&centered, out) }
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2 | Isa::AvxVnni, Some(centered)) => {
                // SAFETY: `with_isa` checked that this CPU has AVX2; lengths as above.
                unsafe { job.avx2(&centered, out) }
            }
            _ => job.portable(out),
        }
        Ok([oh, ow])
    }
}

/// One checked call of [`DepthwiseFilter::run`].
struct Job<'a> {
    filter: &'a DepthwiseFilter,
    input: &'a [u8],
    shape: [usize; 3],
    window: Window,
    input_zero: i32,
    output: [usize; 2],
}

impl Job<'_> {
    /// The reference loop. The wide paths ([`Job::avx2`], [`Job::avx512`]) add the same
    /// terms in registers; wrapping `i32` sums give the same bits in any order.
    fn body(&self, out: &mut [i32]) {
        let [_, w, c] = self.shape;
        let [oh, ow] = self.output;
        let kw = self.window.kernel[1];
        let f = self.filter;
        for oy in 0..oh {
            let (y0, ky0, ny) = inside(oy, 0, &self.window, self.shape[0]);
            for ox in 0..ow {
                let (x0, kx0, nx) = inside(ox, 1, &self.window, w);
                let dst = &mut out[(oy * ow + ox) * c..][..c];
                dst.copy_from_slice(&f.bias);
                for dy in 0..ny {
                    for dx in 0..nx {
                        let src = &self.input[((y0 + dy) * w + x0 + dx) * c..][..c];
                        let tap = (ky0 + dy) * kw + kx0 + dx;
                        let wts = &f.taps[tap * c..][..c];
                        for ((d, x), wt) in dst.iter_mut().zip(src).zip(wts) {
                            *d = d.wrapping_add((*x as i32 - self.input_zero).wrapping_mul(*wt));
                        }
                    }
                }
            }
        }
    }

    fn portable(&self, out: &mut [i32]) {
        self.body(out)
    }

    /// The input as `x − z_x` (wrapping) over the windows' span (see
    /// [`window_span`]), the padding 0: every window then has all its taps, and a padded tap
    /// adds `0 · w`, nothing, as the reference loop's skipped taps do. `None` when the copy
    /// would be longer than four times the input and output together.
    fn centered(&self) -> Option<Vec<i32>> {
        let span = window_span(&self.window, self.output);
        let limit = self.output[0] * self.output[1] * self.shape[2] + self.input.len();
        let zero = self.input_zero;
        padded_input(
            self.input,
            self.shape,
            &self.window,
            span,
            0,
            limit.saturating_mul(4),
            |x| (x as i32).wrapping_sub(zero),
        )
    }

    /// The wide paths' loop on `L`'s registers over `centered` (see [`Job::centered`]): blocks
    /// of up to 8 output pixels of a row, each block's channels `L::LANES` at a time (the last
    /// masked), every tap's weights loaded once for the block and its sums kept in registers.
    /// Wrapping `i32` sums give [`Job::body`]'s bits in any order.
    ///
    /// # Safety
    /// The CPU runs `L`'s instructions; `centered` is [`Job::centered`]'s copy and `out` is
    /// `oh · ow · c` long (as [`DepthwiseFilter::run`] checks).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn blocks<L: Lanes>(&self, centered: &[i32], out: &mut [i32]) {
        let [oh, ow] = self.output;
        let cols = window_span(&self.window, self.output)[1];
        for oy in 0..oh {
            let mut ox = 0;
            while ox < ow {
                // SAFETY: the caller's guarantees; `ox + P <= ow` in each arm.
                unsafe {
                    ox += match ow - ox {
                        8.. => self.block::<L, 8>(centered, cols, out, oy, ox),
                        4.. => self.block::<L, 4>(centered, cols, out, oy, ox),
                        _ => self.block::<L, 1>(centered, cols, out, oy, ox),
                    };
                }
            }
        }
    }

    /// Output pixels `ox..ox + P` of row `oy` (see [`Job::blocks`]); returns `P`. `cols` is
    /// the copy's width in pixels (the span's second extent).
    ///
    /// # Safety
    /// As [`Job::blocks`], and `ox + P <= ow`, `oy < oh`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn block<L: Lanes, const P: usize>(
        &self,
        centered: &[i32],
        cols: usize,
        out: &mut [i32],
        oy: usize,
        ox: usize,
    ) -> usize {
        let c = self.shape[2];
        let [_, ow] = self.output;
        let [kh, kw] = self.window.kernel;
        let [sh, sw] = self.window.stride;
        let (x, taps, bias) = (
            centered.as_ptr(),
            self.filter.taps.as_ptr(),
            self.filter.bias.as_ptr(),
        );
        let dst = out[(oy * ow + ox) * c..][..P * c].as_mut_ptr();
        for c0 in (0..c).step_by(L::LANES) {
            // SAFETY: the CPU runs `L` (the caller's guarantee). Channels `c0..c0 + lanes`
            // are below `c`, and masked loads and stores touch no other lane. Tap `(ky, kx)`
            // of output `(oy, ox + p)` reads the copy's pixel `(oy·sh + ky, (ox + p)·sw + kx)`,
            // inside the span since `oy < oh`, `ox + p < ow`, `ky < kh`, `kx < kw`; weights
            // `ky·kw + kx < kh·kw` taps of `c`; output pixels `ox..ox + P` of row `oy` lie
            // inside `out`'s `oh·ow` pixels (sliced above).
            unsafe {
                let mask = L::mask(c - c0);
                let mut acc = [L::load(bias.add(c0), mask); P];
                for ky in 0..kh {
                    let line = x.add(((oy * sh + ky) * cols + ox * sw) * c + c0);
                    for kx in 0..kw {
                        let wt = L::load(taps.add((ky * kw + kx) * c + c0), mask);
                        for (p, acc) in acc.iter_mut().enumerate() {
                            let v = L::load(line.add((p * sw + kx) * c), mask);
                            *acc = L::mul_add(*acc, v, wt);
                        }
                    }
                }
                for (p, acc) in acc.into_iter().enumerate() {
                    L::store(dst.add(p * c + c0), mask, acc);
                }
            }
        }
        P
    }

    /// [`Job::blocks`] in AVX2 registers (8 lanes).
    ///
    /// # Safety
    /// The CPU supports AVX2 (the filter's [`Isa`], checked by [`DepthwiseFilter::with_isa`]
    /// with `is_x86_feature_detected!`); as [`Job::blocks`].
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn avx2(&self, centered: &[i32], out: &mut [i32]) {
        // SAFETY: the caller's guarantees.
        unsafe { self.blocks::<std::arch::x86_64::__m256i>(centered, out) }
    }

    /// [`Job::blocks`] in AVX-512 registers (16 lanes).
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and BW (the filter's [`Isa`], checked by
    /// [`DepthwiseFilter::with_isa`] with `is_x86_feature_detected!`); as [`Job::blocks`].
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn avx512(&self, centered: &[i32], out: &mut [i32]) {
        // SAFETY: the caller's guarantees.
        unsafe { self.blocks::<std::arch::x86_64::__m512i>(centered, out) }
    }
}

/// The register operations of [`Job::blocks`]: `LANES` `i32` lanes, loads and stores of the
/// first `lanes` of them.
#[cfg(target_arch = "x86_64")]
trait Lanes: Copy {
    const LANES: usize;
    type Mask: Copy;
    /// The first `min(lanes, LANES)` lanes.
    ///
    /// # Safety
    /// The CPU runs this register's instructions.
    unsafe fn mask(lanes: usize) -> Self::Mask;
    /// # Safety
    /// The CPU runs this register's instructions; the masked lanes from `p` are readable.
    unsafe fn load(p: *const i32, mask: Self::Mask) -> Self;
    /// # Safety
    /// The CPU runs this register's instructions; the masked lanes from `p` are writable.
    unsafe fn store(p: *mut i32, mask: Self::Mask, v: Self);
    /// `acc + x · w` in each lane, wrapping.
    ///
    /// # Safety
    /// The CPU runs this register's instructions.
    unsafe fn mul_add(acc: Self, x: Self, w: Self) -> Self;
}

#[cfg(target_arch = "x86_64")]
impl Lanes for std::arch::x86_64::__m256i {
    const LANES: usize = 8;
    type Mask = std::arch::x86_64::__m256i;
    #[inline(always)]
    unsafe fn mask(lanes: usize) -> Self::Mask {
        use std::arch::x86_64::*;
        let lanes = lanes.min(8) as i32;
        // SAFETY: AVX2 (the caller's guarantee); no memory is accessed.
        unsafe {
            _mm256_cmpgt_epi32(
                _mm256_set1_epi32(lanes),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            )
        }
    }
    #[inline(always)]
    unsafe fn load(p: *const i32, mask: Self::Mask) -> Self {
        // SAFETY: AVX2 and the masked lanes readable (the caller's guarantees); `vpmaskmovd`
        // does not touch the others.
        unsafe { std::arch::x86_64::_mm256_maskload_epi32(p, mask) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut i32, mask: Self::Mask, v: Self) {
        // SAFETY: as `load`, for writing.
        unsafe { std::arch::x86_64::_mm256_maskstore_epi32(p, mask, v) }
    }
    #[inline(always)]
    unsafe fn mul_add(acc: Self, x: Self, w: Self) -> Self {
        use std::arch::x86_64::*;
        // SAFETY: AVX2 (the caller's guarantee); no memory is accessed.
        unsafe { _mm256_add_epi32(acc, _mm256_mullo_epi32(x, w)) }
    }
}

#[cfg(target_arch = "x86_64")]
impl Lanes for std::arch::x86_64::__m512i {
    const LANES: usize = 16;
    type Mask = std::arch::x86_64::__mmask16;
    #[inline(always)]
    unsafe fn mask(lanes: usize) -> Self::Mask {
        (u32::MAX >> (32 - lanes.min(16))) as u16
    }
    #[inline(always)]
    unsafe fn load(p: *const i32, mask: Self::Mask) -> Self {
        // SAFETY: AVX-512 F and the masked lanes readable (the caller's guarantees); masked-off
        // lanes are not accessed.
        unsafe { std::arch::x86_64::_mm512_maskz_loadu_epi32(mask, p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut i32, mask: Self::Mask, v: Self) {
        // SAFETY: as `load`, for writing.
        unsafe { std::arch::x86_64::_mm512_mask_storeu_epi32(p, mask, v) }
    }
    #[inline(always)]
    unsafe fn mul_add(acc: Self, x: Self, w: Self) -> Self {
        use std::arch::x86_64::*;
        // SAFETY: AVX-512 F (the caller's guarantee); no memory is accessed.
        unsafe { _mm512_add_epi32(acc, _mm512_mullo_epi32(x, w)) }
    }
}
