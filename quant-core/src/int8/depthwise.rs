//! Depthwise convolution on NHWC `u8` codes: every channel convolved with its own filter, the
//! taps accumulated straight from the input. Through im2col and [`super::gemm_u8`] each channel
//! would be a product with one output row, which leaves the matrix kernel nothing to reuse and
//! costs a copy of every tap; here a tap's channels are contiguous in the input and in the
//! filter, so the inner loop runs across channels in the widest registers the CPU has.

use super::nhwc::{inside, volume, Window};
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
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bw | Isa::Avx512Vnni => {
                // SAFETY: `with_isa` checked that this CPU has AVX-512 F and BW.
                unsafe { job.avx512(out) }
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::AvxVnni => {
                // SAFETY: `with_isa` checked that this CPU has AVX2.
                unsafe { job.avx2(out) }
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
    /// The reference loop. The wide paths compile this same code with wider instructions
    /// enabled: integer sums in the same order, so every path gives the same bits.
    #[inline(always)]
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

    /// [`Job::body`] compiled for AVX2.
    ///
    /// # Safety
    /// The CPU supports AVX2 (the filter's [`Isa`], checked by [`DepthwiseFilter::with_isa`]
    /// with `is_x86_feature_detected!`).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn avx2(&self, out: &mut [i32]) {
        self.body(out)
    }

    /// [`Job::body`] compiled for AVX-512 F and BW.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and BW (the filter's [`Isa`], checked by
    /// [`DepthwiseFilter::with_isa`] with `is_x86_feature_detected!`).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn avx512(&self, out: &mut [i32]) {
        self.body(out)
    }
}
