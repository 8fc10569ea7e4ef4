//! Batch normalisation over image channels with the numbers of dfdx's `BatchNorm2D`, in a few
//! passes over the batch: the layer and its ops.
//!
//! In training mode dfdx builds `BatchNorm2D` from eleven tensor ops (the channel means by a
//! sum over batch, height and width and a scaling, a broadcast subtraction, a square, a second
//! mean, `+ ε`, a square root, `γ/σ`, the broadcast product and the broadcast `β`), each a pass
//! through a strided index with its own backward pass and gradient buffer: about half of a CNN's
//! float training step. Here the statistics take two passes over the batch, the output one,
//! and the backward pass a few plain ones; every value comes from the same `f32` operations in
//! the same order as dfdx's ops (sums over batch, then height and width, in order; `x·x`;
//! `(x - μ)·(γ/σ) + β`) and the gradients are added in the order dfdx's backward ops add them,
//! so outputs, running statistics and gradients are dfdx's to the bit.

use dfdx::prelude::*;
use dfdx::shapes::Dtype;
use dfdx::tensor::CpuError;
use dfdx::tensor_ops::Device;
use quant_core::dfdx_ops::{custom_op, read_contiguous, ParamInput, Scratch};
use quant_core::kernels::channel_sums;
use quant_core::QuantError;
use rayon::prelude::*;
use std::sync::{Arc, OnceLock};

/// Least number of values for which a pass runs in parallel (rayon): below it, waking the
/// pool's threads costs more than the pass.
const PARALLEL_VALUES: usize = 1 << 15;

pub mod builder {
    /// Builds a [`BatchNorm2d`](super::BatchNorm2d) over `C` channels.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct BatchNorm2d<const C: usize>;
}

impl<const C: usize, E: Dtype, D: Device<E>> BuildOnDevice<D, E> for builder::BatchNorm2d<C>
where
    BatchNorm2d<C, E, D>: BuildModule<D, E>,
{
    type Built = BatchNorm2d<C, E, D>;
    fn try_build_on_device(device: &D) -> Result<Self::Built, D::Err> {
        Self::Built::try_build(device)
    }
}

/// Batch normalisation of `(batch, C, height, width)` images (or one `(C, height, width)`
/// image): dfdx's `BatchNorm2D` bit for bit, in training mode (`forward_mut` on a traced input:
/// batch statistics, running statistics updated, gradients of the input, `scale` and `bias`)
/// and in inference mode (`forward`: the running statistics), in a few passes over the batch
/// instead of eleven ops; a CNN's float training step takes about 0.6x the time with it. A
/// drop-in for it: the same fields under the same names (safetensors files load either way);
/// it converts as the same float layer, and [`fold_batchnorm`](crate::fold::fold_batchnorm)
/// folds it.
///
/// ```
/// use dfdx::prelude::*;
/// use quant_dfdx::nn::builders;
///
/// let dev = Cpu::default();
/// let mut ours = dev.build_module::<builders::BatchNorm2d<3>, f32>();
/// let mut dfdx = dev.build_module::<BatchNorm2D<3>, f32>();
/// let x: Tensor<Rank4<2, 3, 4, 4>, f32, _> = dev.sample_normal();
/// let a = ours.forward_mut(x.clone().traced(ours.alloc_grads()));
/// let b = dfdx.forward_mut(x.traced(dfdx.alloc_grads()));
/// assert_eq!(a.as_vec(), b.as_vec());
/// assert_eq!(ours.running_var.as_vec(), dfdx.running_var.as_vec());
/// ```
#[derive(Debug, Clone)]
pub struct BatchNorm2d<const C: usize, E: Dtype = f32, D: Storage<E> = Cpu> {
    /// `γ`, one per channel (initialised to ones).
    pub scale: Tensor<Rank1<C>, E, D>,
    /// `β`, one per channel (initialised to zeros).
    pub bias: Tensor<Rank1<C>, E, D>,
    /// The running mean inference uses (initialised to zeros).
    pub running_mean: Tensor<Rank1<C>, E, D>,
    /// The running (unbiased) variance inference uses (initialised to ones).
    pub running_var: Tensor<Rank1<C>, E, D>,
    /// `ε`, added to the variance (default `1e-5`).
    pub epsilon: f64,
    /// The weight of a batch's statistics in the running ones (default 0.1).
    pub momentum: f64,
}

impl<const C: usize, E: Dtype, D: Device<E>> TensorCollection<E, D> for BatchNorm2d<C, E, D> {
    type To<E2: Dtype, D2: Device<E2>> = BatchNorm2d<C, E2, D2>;

    fn iter_tensors<V: ModuleVisitor<Self, E, D>>(
        visitor: &mut V,
    ) -> Result<Option<Self::To<V::E2, V::D2>>, V::Err> {
        visitor.visit_fields(
            (
                Self::tensor(
                    "scale",
                    |s| &s.scale,
                    |s| &mut s.scale,
                    TensorOptions::reset_to_ones(),
                ),
                Self::tensor(
                    "bias",
                    |s| &s.bias,
                    |s| &mut s.bias,
                    TensorOptions::reset_to_zeros(),
                ),
                Self::tensor(
                    "running_mean",
                    |s| &s.running_mean,
                    |s| &mut s.running_mean,
                    TensorOptions::detached(|t| t.try_fill_with_zeros()),
                ),
                Self::tensor(
                    "running_var",
                    |s| &s.running_var,
                    |s| &mut s.running_var,
                    TensorOptions::detached(|t| t.try_fill_with_ones()),
                ),
                Self::scalar(
                    "epsilon",
                    |s| &s.epsilon,
                    |s| &mut s.epsilon,
                    ScalarOptions::from_default(1e-5),
                ),
                Self::scalar(
                    "momentum",
                    |s| &s.momentum,
                    |s| &mut s.momentum,
                    ScalarOptions::from_default(0.1),
                ),
            ),
            |(scale, bias, running_mean, running_var, epsilon, momentum)| BatchNorm2d {
                scale,
                bias,
                running_mean,
                running_var,
                epsilon,
                momentum,
            },
        )
    }
}

impl<const C: usize, S: Shape> Module<Tensor<S, f32, Cpu, NoneTape>> for BatchNorm2d<C, f32, Cpu> {
    type Output = Tensor<S, f32, Cpu, NoneTape>;
    type Error = CpuError;

    fn try_forward(&self, x: Tensor<S, f32, Cpu, NoneTape>) -> Result<Self::Output, CpuError> {
        batch_norm2d_inference(x, self).map_err(super::to_cpu_error)
    }
}

impl<const C: usize, S: Shape> ModuleMut<Tensor<S, f32, Cpu, OwnedTape<f32, Cpu>>>
    for BatchNorm2d<C, f32, Cpu>
{
    type Output = Tensor<S, f32, Cpu, OwnedTape<f32, Cpu>>;
    type Error = CpuError;

    fn try_forward_mut(
        &mut self,
        x: Tensor<S, f32, Cpu, OwnedTape<f32, Cpu>>,
    ) -> Result<Self::Output, CpuError> {
        batch_norm2d_training(x, self).map_err(super::to_cpu_error)
    }
}

/// Where the channels lie in an image batch: `outer` images of `C` channels of `inner`
/// values each.
#[derive(Debug, Clone, Copy)]
struct Planes {
    outer: usize,
    channels: usize,
    inner: usize,
}

impl Planes {
    /// The planes of a `(batch, C, height, width)` or `(C, height, width)` shape.
    fn of<S: Shape>(shape: &S, channels: usize) -> quant_core::Result<Planes> {
        let dims = shape.concrete();
        let dims = dims.as_ref();
        let (outer, c, inner) = match dims {
            [b, c, h, w] => (*b, *c, h * w),
            [c, h, w] => (1, *c, h * w),
            _ => {
                return Err(QuantError::LengthMismatch {
                    what: "BatchNorm2d input's rank (batch, channels, height, width)".into(),
                    expected: 4,
                    actual: dims.len(),
                })
            }
        };
        if c != channels {
            return Err(QuantError::LengthMismatch {
                what: "BatchNorm2d input's channels".into(),
                expected: channels,
                actual: c,
            });
        }
        Ok(Planes {
            outer,
            channels,
            inner,
        })
    }

    /// dfdx's `1/n` for a mean over batch, height and width (taken in f64, rounded to f32).
    fn inv(self) -> f32 {
        (1.0 / (self.outer * self.inner) as f64) as f32
    }

    /// Whether a pass over the batch is worth running in parallel.
    fn parallel(self) -> bool {
        self.outer * self.channels * self.inner >= PARALLEL_VALUES
            && rayon::current_num_threads() > 1
    }

    /// `Σ value(c, i)` over the values `i` of each channel `c`, in dfdx's order (image by
    /// image, each plane in order). Each channel's sum is a chain of dependent additions, so
    /// eight channels' chains run side by side (quant-core's `channel_sums`: one vector lane
    /// each, the order within each chain unchanged), and groups of channels run in parallel:
    /// the same bits on any number of threads. `values8(c, i)` is `value` at `i..i + 8`.
    #[inline(always)]
    fn sum_channels(
        self,
        value: impl Fn(usize, usize) -> f32 + Sync,
        values8: impl Fn(usize, usize) -> [f32; 8] + Sync,
    ) -> Vec<f32> {
        let mut sums = vec![0.0f32; self.channels];
        let planes = channel_sums::Planes {
            images: self.outer,
            channels: self.channels,
            plane: self.inner,
        };
        let group = |(g, sums): (usize, &mut [f32])| {
            channel_sums::sum_group(planes, g * channel_sums::GROUP, sums, &value, &values8)
        };
        if self.parallel() {
            sums.par_chunks_mut(channel_sums::GROUP)
                .enumerate()
                .for_each(group);
        } else {
            sums.chunks_mut(channel_sums::GROUP)
                .enumerate()
                .for_each(group);
        }
        sums
    }

    /// Runs `pass(b, parts)` for each image `b`, where `parts` are that image's values in each
    /// of `buffers` (laid out as the batch): in parallel over images when worth it. For
    /// element-wise passes, whose results do not depend on the order.
    fn each_image<const K: usize>(
        self,
        buffers: [&mut [f32]; K],
        pass: impl Fn(usize, [&mut [f32]; K]) + Sync + Send,
    ) {
        let image = (self.channels * self.inner).max(1);
        let mut per_image: Vec<[&mut [f32]; K]> = (0..self.outer)
            .map(|_| [(); K].map(|_| &mut [][..]))
            .collect();
        let mut rest = buffers;
        for slot in per_image.iter_mut() {
            for k in 0..K {
                let taken = std::mem::take(&mut rest[k]);
                let (head, tail) = taken.split_at_mut(image.min(taken.len()));
                slot[k] = head;
                rest[k] = tail;
            }
        }
        if self.parallel() {
            per_image
                .into_par_iter()
                .enumerate()
                .for_each(|(b, parts)| pass(b, parts));
        } else {
            per_image
                .into_iter()
                .enumerate()
                .for_each(|(b, parts)| pass(b, parts));
        }
    }

    /// Each channel's batch mean and (biased) variance: dfdx's sum over batch, then height and
    /// width, in order, times `1/n`; the same over `(x - μ)·(x - μ)`.
    fn stats(self, x: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let inv = self.inv();
        let means: Vec<f32> = self
            .sum_channels(|_, i| x[i], |_, i| eight(x, i))
            .iter()
            .map(|s| *s * inv)
            .collect();
        let vars = self
            .sum_channels(
                |c, i| {
                    let centered = x[i] - means[c];
                    centered * centered
                },
                |c, i| {
                    eight(x, i).map(|x| {
                        let centered = x - means[c];
                        centered * centered
                    })
                },
            )
            .iter()
            .map(|s| *s * inv)
            .collect();
        (means, vars)
    }

    /// `y = (x - mean)·factor + shift` per channel: dfdx's subtraction, product and sum.
    fn affine(self, x: &[f32], mean: &[f32], factor: &[f32], shift: &[f32], y: &mut [f32]) {
        let inner = self.inner;
        self.each_image([y], |b, [y]| {
            let x = &x[b * self.channels * inner..];
            for c in 0..self.channels {
                let (mean, factor, shift) = (mean[c], factor[c], shift[c]);
                let r = c * inner..(c + 1) * inner;
                for (x, y) in x[r.clone()].iter().zip(&mut y[r]) {
                    *y = (*x - mean) * factor + shift;
                }
            }
        });
    }
}

/// `values[i..i + 8]`.
#[inline(always)]
fn eight(values: &[f32], i: usize) -> [f32; 8] {
    let values = &values[i..i + 8];
    std::array::from_fn(|t| values[t])
}

/// `sqrt(var + ε)` per channel, then `γ/σ`: dfdx's `+ ε`, `sqrt` and division.
fn std_and_factor(var: &[f32], scale: &[f32], epsilon: f32) -> (Vec<f32>, Vec<f32>) {
    let std: Vec<f32> = var.iter().map(|v| (*v + epsilon).sqrt()).collect();
    let factor = scale.iter().zip(&std).map(|(g, s)| *g / *s).collect();
    (std, factor)
}

/// [`BatchNorm2d`] in inference mode: the running statistics, no gradients.
///
/// # Errors
/// `x` is not `(batch, C, height, width)` or `(C, height, width)` (`LengthMismatch`).
pub fn batch_norm2d_inference<const C: usize, S: Shape>(
    x: Tensor<S, f32, Cpu, NoneTape>,
    bn: &BatchNorm2d<C, f32, Cpu>,
) -> quant_core::Result<Tensor<S, f32, Cpu, NoneTape>> {
    let planes = Planes::of(x.shape(), C)?;
    let mean = read_contiguous(&bn.running_mean);
    let var = read_contiguous(&bn.running_var);
    let (_, factor) = std_and_factor(&var, &read_contiguous(&bn.scale), bn.epsilon as f32);
    let shift = read_contiguous(&bn.bias);
    custom_op(
        x,
        Vec::new(),
        Box::new(move |x, _, y| {
            planes.affine(x, &mean, &factor, &shift, y);
            Ok(())
        }),
        // A `NoneTape` records no backward pass.
        Box::new(|_, _, _, _, _| {}),
    )
}

/// [`BatchNorm2d`] in training mode: normalises with the batch's statistics, updates the
/// running ones (`running = running·(1 - momentum) + batch·momentum`, the variance's batch
/// term unbiased, `·n/(n-1)`), and records the backward pass (gradients of `x`, `scale` and
/// `bias`).
///
/// # Errors
/// `x` is not `(batch, C, height, width)` or `(C, height, width)` (`LengthMismatch`).
pub fn batch_norm2d_training<const C: usize, S: Shape>(
    x: Tensor<S, f32, Cpu, OwnedTape<f32, Cpu>>,
    bn: &mut BatchNorm2d<C, f32, Cpu>,
) -> quant_core::Result<Tensor<S, f32, Cpu, OwnedTape<f32, Cpu>>> {
    let planes = Planes::of(x.shape(), C)?;
    let epsilon = bn.epsilon as f32;
    let params = vec![
        ParamInput::new(&bn.scale, true),
        ParamInput::new(&bn.bias, true),
    ];
    // The batch's statistics, computed once by the forward pass and read by the backward one.
    let batch_stats: Arc<OnceLock<(Vec<f32>, Vec<f32>)>> = Arc::default();
    let stats_for_backward = Arc::clone(&batch_stats);
    let y = custom_op(
        x,
        params,
        Box::new(|x, p, y| {
            let (mean, var) = planes.stats(x);
            let (_, factor) = std_and_factor(&var, p[0], epsilon);
            planes.affine(x, &mean, &factor, p[1], y);
            // Set once, here: the cell is new.
            let _ = batch_stats.set((mean, var));
            Ok(())
        }),
        Box::new(move |x, p, dy, dx, dp| {
            if let [dscale, dbias] = dp {
                let stats = stats_for_backward.get_or_init(|| planes.stats(x));
                let stats = (stats.0.as_slice(), stats.1.as_slice());
                backward(planes, epsilon, (x, stats), p[0], dy, dx, dscale, dbias);
            }
        }),
    )?;
    if let Some((mean, var)) = batch_stats.get() {
        let n = (planes.outer * planes.inner) as f64;
        let keep = (1.0 - bn.momentum) as f32;
        let mean_weight = bn.momentum as f32;
        let var_weight = (bn.momentum * n / (n - 1.0)) as f32;
        let axpy = |running: &mut Tensor<Rank1<C>, f32, Cpu>, batch: &[f32], weight: f32| {
            let updated: Vec<f32> = read_contiguous(running)
                .iter()
                .zip(batch)
                .map(|(r, b)| *r * keep + *b * weight)
                .collect();
            running.copy_from(&updated);
        };
        axpy(&mut bn.running_mean, mean, mean_weight);
        axpy(&mut bn.running_var, var, var_weight);
    }
    Ok(y)
}

/// dfdx's backward ops in their order (the last op's first), each intermediate gradient
/// starting at zero as dfdx allocates it (hence the `0.0 +`, which turns `-0.0` into `0.0` as
/// dfdx's `+=` does); the per-channel sums run over the batch in dfdx's order (image by
/// image, each plane in order), as its broadcast backward passes add them. `x` comes with
/// the batch's mean and variance that the forward pass computed from it.
#[allow(clippy::too_many_arguments)]
fn backward(
    planes: Planes,
    epsilon: f32,
    (x, (mean, var)): (&[f32], (&[f32], &[f32])),
    scale: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    dscale: &mut [f32],
    dbias: &mut [f32],
) {
    let channels = planes.channels;
    let inv = planes.inv();
    let (std, factor) = std_and_factor(var, scale, epsilon);
    let (image, inner) = (channels * planes.inner, planes.inner);
    // `+ β`, then `· (γ/σ)`: the centered values' gradient and the factor's. (Every value is
    // written before it is read: a pooled buffer, not zeroed.)
    let mut d_centered = Scratch::with_len(x.len());
    planes.each_image([&mut d_centered], |b, [d_centered]| {
        let dy = &dy[b * image..];
        for (c, factor) in factor.iter().enumerate() {
            let r = c * inner..(c + 1) * inner;
            for (d, dy) in d_centered[r.clone()].iter_mut().zip(&dy[r]) {
                *d = 0.0 + *factor * (0.0 + *dy);
            }
        }
    });
    for (d, s) in dbias
        .iter_mut()
        .zip(planes.sum_channels(|_, i| dy[i], |_, i| eight(dy, i)))
    {
        *d += s;
    }
    let d_factor = planes.sum_channels(
        |c, i| (x[i] - mean[c]) * (0.0 + dy[i]),
        |c, i| {
            let (x, dy) = (eight(x, i), eight(dy, i));
            std::array::from_fn(|t| (x[t] - mean[c]) * (0.0 + dy[t]))
        },
    );
    // `γ/σ`, sqrt, `+ ε`, `· (1/n)`: per channel.
    let mut d_squares = vec![0.0f32; channels];
    for c in 0..channels {
        dscale[c] += std[c].recip() * d_factor[c];
        let d_std = 0.0 + -scale[c] / (std[c] * std[c]) * d_factor[c];
        let d_var_eps = 0.0 + (std[c] + std[c]).recip() * d_std;
        let d_var = 0.0 + d_var_eps;
        d_squares[c] = 0.0 + inv * d_var;
    }
    // The square, then `x - μ` for both sides.
    planes.each_image([&mut d_centered, &mut *dx], |b, [d_centered, dx]| {
        let x = &x[b * image..];
        for c in 0..channels {
            let (mean, d_square) = (mean[c], d_squares[c]);
            let r = c * inner..(c + 1) * inner;
            let values = x[r.clone()].iter().zip(&mut d_centered[r.clone()]);
            for ((x, d), dx) in values.zip(&mut dx[r]) {
                let centered = *x - mean;
                *d += (centered + centered) * (0.0 + d_square);
                *dx += *d;
            }
        }
    });
    let d_centered: &[f32] = &d_centered;
    let d_mean = planes.sum_channels(
        |_, i| -d_centered[i],
        |_, i| eight(d_centered, i).map(|d| -d),
    );
    // The mean's sum.
    planes.each_image([dx], |_, [dx]| {
        for c in 0..channels {
            let d_sum = 0.0 + inv * d_mean[c];
            for dx in &mut dx[c * inner..(c + 1) * inner] {
                *dx += d_sum;
            }
        }
    });
}
