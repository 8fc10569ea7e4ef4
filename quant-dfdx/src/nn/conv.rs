//! 2-D convolution: the [`conv2d`] op (im2col + GEMM over chunks of the batch, with a
//! hand-written backward) and the [`Conv2d`] module.

use dfdx::prelude::*;
use dfdx::tensor::CpuError;
use quant_core::Result;
use rand::distributions::uniform::SampleUniform;
use rayon::prelude::*;

use super::tape::{accumulate, read, record};
use super::window::Window;
use super::FeatureMaps;

/// Target size, in floats, of one chunk's patch matrix (128 KiB): big enough for the GEMM to
/// run efficiently, small enough to stay in the L2 cache between im2col, GEMM and col2im.
/// Materialising the whole batch's patch matrix (and its gradient) instead made the backward
/// pass of a 16-to-32-channel layer three times slower, from memory traffic alone.
const CHUNK_FLOATS: usize = 1 << 15;

/// 2-D convolution of a batch of images, with bias: PyTorch's `conv2d` (square kernel, equal
/// stride and zero padding on both axes, no dilation, one group).
///
/// `x` is `(batch, C, height, width)`, `weight` is `(O, C, K, K)`, `bias` is `(O,)`. The output
/// is `(batch, O, oh, ow)` with `oh = (height + 2 * padding - K) / stride + 1` (floor) and the
/// same for `ow`.
///
/// All three tensors carry the same tape type. Callers usually pass module parameters with
/// `.retaped::<T>()`; a weight produced by another op (a fake-quantizer, say) may carry its
/// own tape, which is merged, so the weight's gradient flows back through that op. Inputs
/// need not be contiguous.
///
/// # Errors
///
/// [`QuantError::InvalidValue`](quant_core::QuantError::InvalidValue) when `K` or `stride` is
/// 0, or when the padded input is smaller than the kernel; the message names the argument and
/// the valid range.
///
/// # Implementation
///
/// The whole op is one node on the tape. The batch is cut into chunks of whole images sized so
/// that a chunk's patch matrix stays in cache; for each chunk (in parallel, with rayon) the
/// input is unfolded into a patch matrix with one row per kernel tap `(c, kh, kw)` and one
/// column per output pixel (im2col), and the `(O, C * K * K)` weight matrix multiplies it
/// with dfdx's matmul (gemm). The backward pass unfolds the chunk again (cheaper than keeping
/// the patch matrix alive between the passes), computes the weight gradient
/// `dy · patchesᵀ` and the patch gradient `Wᵀ · dy`, folds the latter back onto the input
/// (col2im, a scatter-add), and sums `dy` for the bias. Partial weight gradients are added
/// in chunk order, so results do not depend on the number of threads.
///
/// ```
/// use dfdx::prelude::*;
/// use quant_dfdx::nn::conv2d;
///
/// let dev = Cpu::default();
/// let x: Tensor<Rank4<2, 3, 8, 8>, f32, _> = dev.sample_normal();
/// let w: Tensor<Rank4<4, 3, 3, 3>, f32, _> = dev.sample_normal();
/// let b: Tensor<Rank1<4>, f32, _> = dev.zeros();
/// let grads = w.alloc_grads();
/// let y = conv2d(x.trace(grads), w.retaped(), b.retaped(), 2, 1)?;
/// assert_eq!(y.shape().2, 4); // (8 + 2 - 3) / 2 + 1
/// let grads = y.square().mean().backward();
/// assert_eq!(grads.get(&w).shape(), w.shape());
/// # Ok::<(), quant_core::QuantError>(())
/// ```
pub fn conv2d<B, const C: usize, H, W, const O: usize, const K: usize, T>(
    x: Tensor<(B, Const<C>, H, W), f32, Cpu, T>,
    weight: Tensor<Rank4<O, C, K, K>, f32, Cpu, T>,
    bias: Tensor<Rank1<O>, f32, Cpu, T>,
    stride: usize,
    padding: usize,
) -> Result<FeatureMaps<B, O, T>>
where
    B: Dim,
    H: Dim,
    W: Dim,
    T: Tape<f32, Cpu> + Merge<T>,
{
    conv2d_grouped(x, weight, bias, stride, padding, 1)
}

/// [`conv2d`] with `groups` channel groups, PyTorch's `conv2d(..., groups=groups)`: the input
/// channels and the output channels are cut into `groups` equal groups, and output channel
/// `o` of group `g` sees only the `CG = C / groups` input channels of group `g`. `weight` is
/// `(O, CG, K, K)`; `groups = C` with `CG = 1` is a depthwise convolution.
///
/// Each group runs the path of [`conv2d`] (im2col over its channels, one GEMM, col2im in the
/// backward pass), so one group computes exactly what [`conv2d`] computes.
///
/// ```
/// use dfdx::prelude::*;
/// use quant_dfdx::nn::conv2d_grouped;
///
/// let dev = Cpu::default();
/// let x: Tensor<Rank4<2, 4, 6, 6>, f32, _> = dev.sample_normal();
/// // Depthwise: one 3x3 filter per channel.
/// let w: Tensor<Rank4<4, 1, 3, 3>, f32, _> = dev.sample_normal();
/// let b: Tensor<Rank1<4>, f32, _> = dev.zeros();
/// let y = conv2d_grouped(x, w, b, 1, 1, 4)?;
/// assert_eq!(y.shape().2, 6);
/// # Ok::<(), quant_core::QuantError>(())
/// ```
///
/// # Errors
/// As [`conv2d`]; also `groups` of 0, or one that does not divide both channel counts into
/// groups of `CG` input channels.
pub fn conv2d_grouped<B, const C: usize, H, W, const O: usize, const CG: usize, const K: usize, T>(
    x: Tensor<(B, Const<C>, H, W), f32, Cpu, T>,
    weight: Tensor<Rank4<O, CG, K, K>, f32, Cpu, T>,
    bias: Tensor<Rank1<O>, f32, Cpu, T>,
    stride: usize,
    padding: usize,
    groups: usize,
) -> Result<FeatureMaps<B, O, T>>
where
    B: Dim,
    H: Dim,
    W: Dim,
    T: Tape<f32, Cpu> + Merge<T>,
{
    if groups == 0 || CG.checked_mul(groups) != Some(C) || !O.is_multiple_of(groups) {
        return Err(super::window::invalid(
            "conv2d",
            "groups",
            groups,
            format!(
                "groups must divide the {C} input channels into groups of {CG} (the weight's second dimension) and the {O} output channels evenly"
            ),
        ));
    }
    let (batch, _, h, w) = *x.shape();
    let win = Window::new(
        "conv2d",
        [batch.size(), C, h.size(), w.size()],
        K,
        stride,
        padding,
    )?;
    // Gradient buffers follow physical storage: work on contiguous tensors only.
    let (x, x_tape) = x.try_contiguous()?.split_tape();
    let (weight, w_tape) = weight.try_contiguous()?.split_tape();
    let (bias, b_tape) = bias.try_contiguous()?.split_tape();
    let mut tape = x_tape.merge(w_tape).merge(b_tape);
    let dev = x.device().clone();

    let geo = Geometry::new(win, C, O, groups);
    let x_data = read(&x);
    let bias_data = read(&bias);
    let w_data = read(&weight);
    // One `(O / groups, CG * K * K)` weight matrix per group.
    let w_mats: Vec<Tensor<(usize, usize), f32, Cpu>> = w_data
        .chunks_exact((geo.out_per_group * geo.taps).max(1))
        .map(|m| dev.try_tensor_from_vec(m.to_vec(), (geo.out_per_group, geo.taps)))
        .collect::<std::result::Result<_, _>>()?;

    let mut y = vec![0.0f32; win.batch * geo.out_image];
    if geo.trivial() {
        // No tap reads the input (no input, or no taps): every output is its bias.
        if geo.ohw > 0 {
            for (i, dst) in y.chunks_exact_mut(geo.ohw).enumerate() {
                dst.fill(bias_data[i % O]);
            }
        }
    } else {
        y.par_chunks_mut(geo.images_per_chunk * geo.out_image)
            .zip(x_data.par_chunks(geo.images_per_chunk * geo.in_image))
            .try_for_each(|(y_chunk, x_chunk)| -> std::result::Result<(), CpuError> {
                let cols = x_chunk.len() / geo.in_image * geo.ohw;
                for (g, w_mat) in w_mats.iter().enumerate() {
                    let patches =
                        dev.try_tensor_from_vec(im2col(x_chunk, &geo, g), (geo.taps, cols))?;
                    // (O/G, taps) x (taps, cols): row o holds channel g·O/G + o of every image.
                    let prod = read(&w_mat.clone().try_matmul(patches)?);
                    for (i, dst) in y_chunk.chunks_exact_mut(geo.ohw).enumerate() {
                        let (image, o) = (i / O, i % O);
                        if o / geo.out_per_group != g {
                            continue;
                        }
                        let row = o % geo.out_per_group;
                        let src = &prod[row * cols + image * geo.ohw..][..geo.ohw];
                        let b = bias_data[o];
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d = s + b;
                        }
                    }
                }
                Ok(())
            })?;
    }
    let out = dev.try_tensor_from_vec(y, (batch, Const::<O>, win.oh, win.ow))?;

    let (x_ghost, w_ghost, b_ghost) = (x.ghost(), weight.ghost(), bias.ghost());
    record(&out, &mut tape, move |dy, grads| {
        let mut db = vec![0.0f32; O];
        if geo.ohw > 0 {
            for (i, chunk) in dy.chunks_exact(geo.ohw).enumerate() {
                db[i % O] += chunk.iter().sum::<f32>();
            }
        }
        accumulate(grads.get_or_alloc_mut(&b_ghost)?, &db)?;
        if geo.trivial() {
            // Nothing flows, but the gradients must exist for whoever reads them.
            grads.try_alloc_for(&x_ghost)?;
            grads.try_alloc_for(&w_ghost)?;
            return Ok(());
        }
        let dev = dev.clone();
        let dx = grads.get_or_alloc_mut(&x_ghost)?;
        if dx.len() != x_data.len() || dy.len() != geo.win.batch * geo.out_image {
            return Err(CpuError::WrongNumElements);
        }
        let per_chunk = geo.images_per_chunk;
        let og = geo.out_per_group;
        let partial_dw = dx
            .par_chunks_mut(per_chunk * geo.in_image)
            .zip(dy.par_chunks(per_chunk * geo.out_image))
            .zip(x_data.par_chunks(per_chunk * geo.in_image))
            .map(
                |((dx_chunk, dy_chunk), x_chunk)| -> std::result::Result<Vec<f32>, CpuError> {
                    let cols = x_chunk.len() / geo.in_image * geo.ohw;
                    let mut dw = Vec::with_capacity(O * geo.taps);
                    for (g, w_mat) in w_mats.iter().enumerate() {
                        let patches =
                            dev.try_tensor_from_vec(im2col(x_chunk, &geo, g), (geo.taps, cols))?;
                        // The group's dy as the (O/G, cols) matrix the forward GEMM produced.
                        let mut dy_mat = vec![0.0f32; og * cols];
                        for (i, src) in dy_chunk.chunks_exact(geo.ohw).enumerate() {
                            let (image, o) = (i / O, i % O);
                            if o / og == g {
                                dy_mat[(o % og) * cols + image * geo.ohw..][..geo.ohw]
                                    .copy_from_slice(src);
                            }
                        }
                        let dy_mat = dev.try_tensor_from_vec(dy_mat, (og, cols))?;
                        // (O/G, cols) x (cols, taps) and (taps, O/G) x (O/G, cols).
                        dw.extend_from_slice(&read(
                            &dy_mat
                                .clone()
                                .try_matmul(patches.try_permute::<_, Axes2<1, 0>>()?)?,
                        ));
                        let d_patches = read(
                            &w_mat
                                .clone()
                                .try_permute::<_, Axes2<1, 0>>()?
                                .try_matmul(dy_mat)?,
                        );
                        col2im(&d_patches, dx_chunk, &geo, g);
                    }
                    Ok(dw)
                },
            )
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let mut dw = vec![0.0f32; O * geo.taps];
        for part in &partial_dw {
            for (a, b) in dw.iter_mut().zip(part) {
                *a += *b;
            }
        }
        accumulate(grads.get_or_alloc_mut(&w_ghost)?, &dw)
    });
    Ok(out.put_tape(tape))
}

/// Sizes derived once from the window and the channel counts.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    win: Window,
    /// Input channels of one group.
    channels_per_group: usize,
    /// Output channels of one group.
    out_per_group: usize,
    /// `C / groups * K * K`: the length of one patch (of one group).
    taps: usize,
    /// `oh * ow`.
    ohw: usize,
    /// Floats per input image, `C * h * w`.
    in_image: usize,
    /// Floats per output image, `O * oh * ow`.
    out_image: usize,
    /// Whole images per chunk (at least 1).
    images_per_chunk: usize,
}

impl Geometry {
    fn new(win: Window, channels: usize, out_channels: usize, groups: usize) -> Geometry {
        let channels_per_group = channels / groups.max(1);
        let taps = channels_per_group * win.k * win.k;
        let ohw = win.out_plane();
        // As many chunks as the size target asks for, then spread the images evenly over them
        // (64 images that fit 56 per chunk make two chunks of 32, which two threads share).
        let max_images = (CHUNK_FLOATS / (ohw * taps).max(1)).max(1);
        let chunks = win.batch.div_ceil(max_images).max(1);
        Geometry {
            win,
            channels_per_group,
            out_per_group: out_channels / groups.max(1),
            taps,
            ohw,
            in_image: channels * win.in_plane(),
            out_image: out_channels * ohw,
            images_per_chunk: win.batch.div_ceil(chunks).max(1),
        }
    }

    /// True when no output reads any input (an empty batch, image or kernel, or no output
    /// channels): the GEMMs would be empty.
    fn trivial(&self) -> bool {
        self.taps == 0 || self.in_image == 0 || self.out_image == 0 || self.win.batch == 0
    }
}

/// Unfolds group `g` of whole images (`(n, C, h, w)`, contiguous) into the
/// `(C/G * K * K, n * oh * ow)` patch matrix: row `(c, kh, kw)`, column `(image, oy, ox)` holds
/// `x[image, g·C/G + c, oy*s + kh - p, ox*s + kw - p]`, or 0 where that lies in the padding.
///
/// This layout (one row per kernel tap) makes the copies long runs along image rows, which
/// matters for the few-channel layers that open a network; a row per output pixel would copy
/// `K` floats at a time.
fn im2col(x: &[f32], geo: &Geometry, group: usize) -> Vec<f32> {
    let win = &geo.win;
    let images = x.len() / geo.in_image;
    let cols = images * geo.ohw;
    let mut patches = vec![0.0f32; geo.taps * cols];
    for (r, row) in patches.chunks_exact_mut(cols.max(1)).enumerate() {
        for_each_run(r, group, images, geo, |image, oy, (ox0, ox1), src_start| {
            let src = &x[image * geo.in_image + src_start..];
            let dst = &mut row[image * geo.ohw + oy * win.ow..][ox0..ox1];
            if win.stride == 1 {
                dst.copy_from_slice(&src[..ox1 - ox0]);
            } else {
                for (d, s) in dst.iter_mut().zip(src.iter().step_by(win.stride)) {
                    *d = *s;
                }
            }
        });
    }
    patches
}

/// The adjoint of [`im2col`]: adds every entry of the patch gradient into the input position
/// it was read from, for the same whole images.
fn col2im(d_patches: &[f32], dx: &mut [f32], geo: &Geometry, group: usize) {
    let win = &geo.win;
    let images = dx.len() / geo.in_image;
    let cols = images * geo.ohw;
    for (r, row) in d_patches.chunks_exact(cols.max(1)).enumerate() {
        for_each_run(r, group, images, geo, |image, oy, (ox0, ox1), dst_start| {
            let dst = &mut dx[image * geo.in_image + dst_start..];
            let src = &row[image * geo.ohw + oy * win.ow..][ox0..ox1];
            if win.stride == 1 {
                for (d, s) in dst[..ox1 - ox0].iter_mut().zip(src) {
                    *d += *s;
                }
            } else {
                for (d, s) in dst.iter_mut().step_by(win.stride).zip(src) {
                    *d += *s;
                }
            }
        });
    }
}

/// Calls `f(image, oy, (ox0, ox1), start)` for every run of patch-matrix row `r` (a kernel tap
/// `(c, kh, kw)` of group `group`) that reads the input, in each of `images` images: output row
/// `oy`, output columns `ox0..ox1`, reading input positions `start, start + stride, ...` of the
/// image.
fn for_each_run(
    r: usize,
    group: usize,
    images: usize,
    geo: &Geometry,
    mut f: impl FnMut(usize, usize, (usize, usize), usize),
) {
    let win = &geo.win;
    let k = win.k;
    let (c, kh, kw) = (
        group * geo.channels_per_group + r / (k * k),
        (r / k) % k,
        r % k,
    );
    let (oy0, oy1) = win.output_span(kh, win.h, win.oh);
    let (ox0, ox1) = win.output_span(kw, win.w, win.ow);
    if ox0 == ox1 {
        return;
    }
    for image in 0..images {
        for oy in oy0..oy1 {
            let iy = oy * win.stride + kh - win.pad;
            let ix = ox0 * win.stride + kw - win.pad;
            f(image, oy, (ox0, ox1), c * win.in_plane() + iy * win.w + ix);
        }
    }
}

/// The builder of [`Conv2d`], for `dev.build_module::<builder::Conv2d<..>, f32>()`.
pub mod builder {
    /// Builds a [`Conv2d`](super::Conv2d) with `C_IN` input channels, `C_OUT` output
    /// channels, a `K x K` kernel, stride `STRIDE`, zero padding `PAD`, and `GROUPS` channel
    /// groups of `C_GROUP = C_IN / GROUPS` input channels each.
    #[derive(Debug, Copy, Clone, Eq, PartialEq)]
    pub struct Conv2d<
        const C_IN: usize,
        const C_OUT: usize,
        const K: usize,
        const STRIDE: usize = 1,
        const PAD: usize = 0,
        const GROUPS: usize = 1,
        const C_GROUP: usize = C_IN,
    >;

    /// Builds a depthwise [`Conv2d`](super::Conv2d): one `K x K` filter per channel.
    pub type DepthwiseConv2d<
        const C: usize,
        const K: usize,
        const STRIDE: usize = 1,
        const PAD: usize = 0,
    > = Conv2d<C, C, K, STRIDE, PAD, C, 1>;
}

impl_for_conv! {
    [E, D] BuildOnDevice<D, E> for builder::Conv2d<C_IN, C_OUT, K, S, P, G, CG>
    where
        E: Dtype,
        D: Device<E>,
        Conv2d<C_IN, C_OUT, K, S, P, G, CG, E, D>: BuildModule<D, E>,
    {
        type Built = Conv2d<C_IN, C_OUT, K, S, P, G, CG, E, D>;
        fn try_build_on_device(device: &D) -> std::result::Result<Self::Built, D::Err> {
            Self::Built::try_build(device)
        }
    }
}

/// A 2-D convolution layer with bias, PyTorch's `nn.Conv2d(C_IN, C_OUT, K, stride=STRIDE,
/// padding=PAD, groups=GROUPS)`; the stable-Rust counterpart of dfdx's nightly-only `Conv2D`.
///
/// Acts on batches of images `(batch, C_IN, height, width)` with any batch and image size and
/// any tape, giving `(batch, C_OUT, oh, ow)` with `usize` spatial dimensions (see [`conv2d`]
/// and [`conv2d_grouped`]). With `GROUPS` groups, the weight is `(C_OUT, C_GROUP, K, K)` where
/// `C_GROUP = C_IN / GROUPS` must be spelled out (stable Rust cannot compute it in a type);
/// a mismatch is a compile error when the layer is built or run. [`DepthwiseConv2d`] names the
/// depthwise case. Parameters are initialised as PyTorch does: uniform in
/// `±1/sqrt(C_GROUP * K * K)`, for the weight and the bias alike.
///
/// # Errors
///
/// dfdx tuples of modules require one error type, and dfdx's own layers use
/// [`CpuError`], so this module's `Error` is `CpuError` too: an input smaller than the kernel,
/// or `K == 0` / `STRIDE == 0`, is reported as `CpuError::WrongNumElements`. Call [`conv2d`]
/// directly for an error that says what was wrong.
///
/// ```
/// use dfdx::prelude::*;
/// use quant_dfdx::nn::builders;
///
/// let dev = Cpu::default();
/// let conv = dev.build_module::<builders::Conv2d<1, 8, 3, 1, 1>, f32>();
/// let x: Tensor<Rank4<2, 1, 8, 8>, f32, _> = dev.sample_normal();
/// let y = conv.forward(x);
/// assert_eq!(*y.shape(), (Const::<2>, Const::<8>, 8, 8));
/// // Depthwise: 8 channels, one 3x3 filter each.
/// let dw = dev.build_module::<builders::DepthwiseConv2d<8, 3, 1, 1>, f32>();
/// assert_eq!(dw.weight.shape().1, Const::<1>);
/// assert_eq!(*dw.forward(y).shape(), (Const::<2>, Const::<8>, 8, 8));
/// ```
#[derive(Debug, Clone)]
pub struct Conv2d<
    const C_IN: usize,
    const C_OUT: usize,
    const K: usize,
    const STRIDE: usize = 1,
    const PAD: usize = 0,
    const GROUPS: usize = 1,
    const C_GROUP: usize = C_IN,
    E: Dtype = f32,
    D: Storage<E> = Cpu,
> {
    /// The kernels, `(C_OUT, C_GROUP, K, K)`.
    pub weight: Tensor<Rank4<C_OUT, C_GROUP, K, K>, E, D>,
    /// One bias per output channel.
    pub bias: Tensor<Rank1<C_OUT>, E, D>,
}

/// A depthwise convolution: `C` channels, one `K x K` filter each.
pub type DepthwiseConv2d<
    const C: usize,
    const K: usize,
    const STRIDE: usize = 1,
    const PAD: usize = 0,
    E = f32,
    D = Cpu,
> = Conv2d<C, C, K, STRIDE, PAD, C, 1, E, D>;

/// Compile-time check of a grouped convolution's channel counts.
pub(crate) struct Groups<const I: usize, const O: usize, const G: usize, const CG: usize>;

impl<const I: usize, const O: usize, const G: usize, const CG: usize> Groups<I, O, G, CG> {
    /// Evaluated wherever such a convolution is built or run.
    pub(crate) const VALID: () = assert!(
        G > 0 && CG * G == I && O.is_multiple_of(G),
        "a grouped Conv2d needs C_GROUP * GROUPS == C_IN and GROUPS dividing C_OUT"
    );
}

impl_for_conv! {
    [E: Dtype, D: Storage<E>] NonMutableModule for Conv2d<C_IN, C_OUT, K, S, P, G, CG, E, D> {}
}

impl_for_conv! {
    [E, D] TensorCollection<E, D> for Conv2d<C_IN, C_OUT, K, S, P, G, CG, E, D>
    where
        E: Dtype + SampleUniform,
        D: Device<E>,
    {
        type To<E2: Dtype, D2: Device<E2>> = Conv2d<C_IN, C_OUT, K, S, P, G, CG, E2, D2>;

        fn iter_tensors<V: ModuleVisitor<Self, E, D>>(
            visitor: &mut V,
        ) -> std::result::Result<Option<Self::To<V::E2, V::D2>>, V::Err> {
            let () = Groups::<C_IN, C_OUT, G, CG>::VALID;
            visitor.visit_fields(
                (
                    Self::tensor(
                        "weight",
                        |s| &s.weight,
                        |s| &mut s.weight,
                        TensorOptions::reset_with(|t| {
                            t.try_fill_with_distr(init_distribution::<E>(CG * K * K))
                        }),
                    ),
                    Self::tensor(
                        "bias",
                        |s| &s.bias,
                        |s| &mut s.bias,
                        TensorOptions::reset_with(|t| {
                            t.try_fill_with_distr(init_distribution::<E>(CG * K * K))
                        }),
                    ),
                ),
                |(weight, bias)| Conv2d { weight, bias },
            )
        }
    }
}

/// PyTorch's default for conv weights and biases: uniform in `±1/sqrt(fan_in)`.
fn init_distribution<E: Dtype + SampleUniform>(fan_in: usize) -> rand::distributions::Uniform<E> {
    let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
    let zero = E::default();
    // Every float dtype represents the bound; the fallback keeps the range non-empty (which
    // `Uniform::new` requires) for integer dtypes, which a convolution never uses.
    let b = match E::from_f64(bound) {
        Some(b) if b > zero => b,
        _ => E::ONE,
    };
    rand::distributions::Uniform::new(zero - b, b)
}

impl_for_conv! {
    [B: Dim, H: Dim, W: Dim, T: Tape<f32, Cpu> + Merge<T>]
    Module<Tensor<(B, Const<C_IN>, H, W), f32, Cpu, T>>
    for Conv2d<C_IN, C_OUT, K, S, P, G, CG, f32, Cpu>
    {
        type Output = FeatureMaps<B, C_OUT, T>;
        type Error = CpuError;

        fn try_forward(
            &self,
            x: Tensor<(B, Const<C_IN>, H, W), f32, Cpu, T>,
        ) -> std::result::Result<Self::Output, CpuError> {
            let () = Groups::<C_IN, C_OUT, G, CG>::VALID;
            let (weight, bias) = (self.weight.retaped::<T>(), self.bias.retaped::<T>());
            conv2d_grouped(x, weight, bias, S, P, G).map_err(super::to_cpu_error)
        }
    }
}
