//! Integer-only inference of an exported graph.
//!
//! The float input is quantized once, by the graph's first quantize node. From there on every
//! value is integers: activation codes of at most 8 bits, stored as `u8` (a signed grid offset
//! by 128), or `i32` accumulators. A layer with weights multiplies codes by centered weight
//! codes `w - z_w` into `i32` accumulators holding the int32 bias, at scale
//! `s_input · s_weight[o]`; the next quantize node requantizes them into its grid with a
//! fixed-point multiplier, `q = round(acc · m / 2^shift) + z` clamped to the grid, where
//! `m / 2^shift` is the ratio of the scales to 31 bits and the rounding is the quantizer's
//! policy (ties to even by default), carried out exactly in integer arithmetic. ReLU clamps
//! codes or accumulators at the real value 0; max pooling is monotone, so it runs on codes or
//! accumulators alike; average pooling sums centered codes into an accumulator at scale
//! `s / (kernel height · kernel width)`. A graph that ends in accumulators returns `acc as f32 · (s_input · s_weight[o])`
//! as logits, one `f32` multiplication each.
//!
//! Transformers run on integers too. A sequence `[tokens, features]` is rows of features (a
//! ViT's patch convolution writes NHWC maps, which are already its tokens, so `ImageTokens`
//! only adds the position embedding, rounded once to the accumulators' scale). Both attention
//! matrix products multiply centered codes into `i32` (`Q·Kᵀ` at `s_q · s_k / √d`, probabilities
//! times `V` at `s_p · s_v`). The ops without an exact integer form run the fixed-point kernels
//! of [`quant_core::int8::nonlinear`] on integers only: softmax on the score accumulators
//! ([`SOFTMAX_BITS`](quant_core::int8::nonlinear::SOFTMAX_BITS)-bit output, requantized by the `probs` quantizer), GELU and LayerNorm on
//! the codes of their input quantizer (their `i32` outputs at the kernels' scales are
//! requantized by the next quantizer). The fake-quantized model runs the same kernels on the
//! same codes (`quant_core::dfdx_ops::int_softmax` and the others), so the two agree as they do
//! for the MLP. The mean of the tokens sums them in `i64` and rounds to the accumulators' step.
//! Where a per-tensor requantization reads a function of one code of a grid of at most 16
//! codes (a GELU read by nothing else, or codes) or of the sum of two (a residual add read
//! only by such requantizations), the two are one table of the input codes, computed once by
//! the kernels themselves ([`quant_core::int8::CodeMap`], [`quant_core::int8::SumMap`]): the
//! same codes, one lookup per value, and the GELU or the add does not run.
//!
//! Feature maps are stored channels-last (NHWC) so that a convolution's im2col rows and its
//! output rows are contiguous; flattened maps keep that order and the next layer's weight
//! columns are permuted once to match, so results are those of the graph's NCHW semantics.
//! Large batches run in chunks of samples, so the working memory of a batch stays within the
//! [`Budget`] whatever the model.
//!
//! Each op's preparation (how its output is held, what it refuses) and kernel live in its own
//! file under `graph/ops/`, beside its shape rule, float reference and ONNX form; this module
//! holds what all ops share: the value representations, the budget, the batch loop, the
//! buffers and the GEMM kernel of the layers with weights (Linear, Conv2d).

pub(crate) mod prepare;
pub(crate) use prepare::{Conv, Nonlinear, Quantize, Weighted};
pub(crate) mod run;

use quant_core::{QuantError, RoundingPolicy};

use crate::graph::Graph;
use crate::GraphError;

/// Widest grid, in bits, the integer runtime runs (activations and weights).
pub const MAX_BITS: u32 = 8;

/// How far the integer model's logits may lie from the fake-quantized model's, relative to the
/// largest |logit| of the batch: `|int - fq| <= LOGIT_TOLERANCE · max|fq|`.
///
/// Every intermediate code is computed exactly in integers here, while the fake-quantized model
/// sums `f32` products; the two pick the same code except where a value lies within `f32`
/// rounding (about `1e-6` relative) of a rounding boundary, and then only the final
/// dequantization (`acc · s_input · s_weight`, one `f32` product against an `f32` sum) differs.
/// On random MLPs and CNNs (tests/integration/properties.rs) the largest difference seen is about `2e-7` of
/// the range; the bound leaves a margin of 50. Where a value does fall on such a boundary, the
/// two codes differ by one level and the logits by that level's contribution: the pipeline
/// reports how often the predictions agree (`integer_agreement`).
///
/// This holds for the five round-to-nearest policies. With `Floor` or `Ceil` the integer model
/// is still exact, but the fake-quantized one is not: a sum that is exactly on a level (most
/// often exactly zero, when products cancel, which is common at low bit widths) comes out of
/// the `f32` sum a hair above or below it, and a directed rounding moves it one level, so the
/// two models disagree far more often than at the rare near-ties above.
pub const LOGIT_TOLERANCE: f32 = 1e-5;

/// Most values one sample may hold in any one value, or in a convolution's patches (64 Mi):
/// [`IntegerModel::new`] refuses larger models.
pub const MAX_SAMPLE_ELEMENTS: usize = 1 << 26;
/// Most multiply-adds one sample may take (about 16 times a ResNet-50):
/// [`IntegerModel::new`] refuses costlier models.
pub const MAX_SAMPLE_MACS: u64 = 1 << 36;
/// The default [`Budget::working_bytes`]: 256 MiB.
pub const MAX_BATCH_BYTES: usize = 256 << 20;
/// The default [`Budget::multiply_adds`]: 2^42, about a minute on two cores.
pub const MAX_CALL_MACS: u64 = 1 << 42;

/// What running a model may take, decided before it runs (the integer runtime here, ONNX
/// through tract in the facade).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Working memory a batch may take at once, on all threads together: larger batches run
    /// in chunks of samples, and a model one sample of which needs more (its values alive at
    /// once, freed after their last reader, and a convolution's patches) is refused.
    pub working_bytes: usize,
    /// Most multiply-adds one call may take, all samples together (every op counts at least
    /// one per value it writes). A larger batch is refused before anything runs.
    pub multiply_adds: u64,
}

impl Default for Budget {
    /// [`MAX_BATCH_BYTES`] and [`MAX_CALL_MACS`].
    fn default() -> Budget {
        Budget {
            working_bytes: MAX_BATCH_BYTES,
            multiply_adds: MAX_CALL_MACS,
        }
    }
}

/// An integer grid as the runtime stores it: codes `q + offset` in `u8`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StoredGrid {
    pub scale: f64,
    /// The zero point, stored (`z + offset`).
    pub zero: i32,
    /// The grid's bounds, stored.
    pub lo: i32,
    pub hi: i32,
    pub rounding: RoundingPolicy,
}

/// How one value is held at run time.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Rep {
    /// Float (the graph input).
    Float,
    /// `u8` codes on a grid.
    Codes(StoredGrid),
    /// `i32` accumulators with a scale per channel (the last stored axis), or one for all, and
    /// a bound on their magnitude.
    Acc { scales: Vec<f64>, bound: i64 },
}

/// The per-sample layout of a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Rows of features: `[.., features]` (one row for `[features]`).
    Flat { features: usize },
    /// Feature maps `[c, h, w]`, stored `[h, w, c]`.
    Maps { c: usize, h: usize, w: usize },
    /// Flattened maps `[c·h·w]`, stored in `[h, w, c]` order.
    FlatMaps { c: usize, h: usize, w: usize },
}

/// An exported graph, prepared for integer inference.
#[derive(Debug, Clone)]
pub struct IntegerModel {
    graph: Graph,
    /// Per value (0: the input, `i + 1`: node `i`): representation, layout, elements per sample.
    reps: Vec<Rep>,
    layouts: Vec<Layout>,
    numels: Vec<usize>,
    /// Per node: the values it reads.
    inputs: Vec<Vec<usize>>,
    /// Per node: what was prepared for it.
    steps: Vec<prepare::Step>,
    /// The value returned.
    output: usize,
    /// Values each node's run frees after reading them.
    frees: Vec<Vec<usize>>,
    macs: u64,
    /// Working bytes per sample (values alive at once, patches).
    sample_bytes: usize,
    budget: Budget,
}

impl IntegerModel {
    /// Prepares a graph for integer inference: checks it ([`Graph::check`]), decides how each
    /// value is held, packs weights, computes requantization multipliers, and bounds the cost
    /// and memory of a sample.
    ///
    /// # Errors
    /// [`GraphError::Unsupported`] naming the node: an op the runtime does not run (on float
    /// values, or an op without an integer form), weights or activations wider than
    /// [`MAX_BITS`], accumulators that could overflow `i32`, scales too far apart to requantize,
    /// logits that could overflow `f32`, a sample larger than [`MAX_SAMPLE_ELEMENTS`] or costlier
    /// than [`MAX_SAMPLE_MACS`].
    pub fn new(graph: &Graph) -> Result<IntegerModel, GraphError> {
        IntegerModel::with_budget(graph, Budget::default())
    }

    /// [`IntegerModel::new`] under `budget` instead of the default.
    ///
    /// # Errors
    /// As [`IntegerModel::new`]; also a sample that needs more than `budget.working_bytes`.
    pub fn with_budget(graph: &Graph, budget: Budget) -> Result<IntegerModel, GraphError> {
        prepare::prepare(graph, budget)
    }

    /// The budget [`IntegerModel::forward`] runs under.
    pub fn budget(&self) -> Budget {
        self.budget
    }

    /// Bytes of working memory one sample takes (its values and a convolution's patches).
    pub fn working_bytes_per_sample(&self) -> usize {
        self.sample_bytes
    }

    /// How many samples [`IntegerModel::forward`] runs at once: as many as fit the budget's
    /// working memory, at least one.
    pub fn samples_per_chunk(&self) -> usize {
        (self.budget.working_bytes / self.sample_bytes.max(1)).max(1)
    }

    /// Multiply-adds (and pooling comparisons) one sample takes, at most [`MAX_SAMPLE_MACS`].
    pub fn macs_per_sample(&self) -> u64 {
        self.macs
    }

    /// Shape of one input sample.
    pub fn input_shape(&self) -> &[usize] {
        &self.graph.input.shape
    }

    /// Input values per sample.
    pub fn input_features(&self) -> usize {
        self.numels[0]
    }

    /// Output values (logits) per sample.
    pub fn output_features(&self) -> usize {
        self.numels[self.output]
    }

    /// The graph this model runs.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Runs a batch (`x` holds whole samples of [`input_shape`](Self::input_shape), row-major)
    /// and returns `n × output_features` logits, in chunks within the budget's working memory.
    ///
    /// # Errors
    /// `x` is not a whole number of samples, or holds NaN; the batch would take more than the
    /// budget's multiply-adds (checked before anything runs).
    pub fn forward(&self, x: &[f32]) -> Result<Vec<f32>, QuantError> {
        run::forward(self, x)
    }

    /// The predicted class of each sample (argmax of the logits; the first on ties).
    ///
    /// # Errors
    /// See [`IntegerModel::forward`].
    pub fn predict(&self, x: &[f32]) -> Result<Vec<usize>, QuantError> {
        let logits = self.forward(x)?;
        Ok(argmax_rows(&logits, self.output_features()))
    }
}

/// Index of the largest value in each row of `cols` values (the first on ties).
pub fn argmax_rows(values: &[f32], cols: usize) -> Vec<usize> {
    values
        .chunks(cols.max(1))
        .map(|row| {
            row.iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, v)| {
                    if *v > bv {
                        (i, *v)
                    } else {
                        (bi, bv)
                    }
                })
                .0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use quant_core::int8::{fixed_point_multiplier, rounding_shift};

    #[test]
    fn fixed_point_multipliers_are_accurate() {
        for m in [0.5, 0.75, 1.0, 3.0e-4, 0.123456789, 1234.5, 1e-12] {
            let (q, shift) = fixed_point_multiplier(m).unwrap();
            let back = q as f64 / 2f64.powi(shift as i32);
            assert!(
                ((back - m) / m).abs() < 1e-9 || m < 1e-10,
                "{m}: {q} >> {shift} = {back}"
            );
        }
        assert!(fixed_point_multiplier(0.0).is_err());
        assert!(fixed_point_multiplier(f64::NAN).is_err());
        assert!(fixed_point_multiplier(1e12).is_err());
    }

    #[test]
    fn rounding_shift_follows_each_policy_on_ties() {
        // 5/2 = 2.5, -5/2 = -2.5, 7/4 = 1.75, -7/4 = -1.75
        let cases = [
            (RoundingPolicy::HalfEven, [2, -2, 2, -2]),
            (RoundingPolicy::HalfUp, [3, -2, 2, -2]),
            (RoundingPolicy::HalfDown, [2, -3, 2, -2]),
            (RoundingPolicy::HalfAwayFromZero, [3, -3, 2, -2]),
            (RoundingPolicy::HalfTowardZero, [2, -2, 2, -2]),
            (RoundingPolicy::Floor, [2, -3, 1, -2]),
            (RoundingPolicy::Ceil, [3, -2, 2, -1]),
        ];
        for (policy, want) in cases {
            let got = [
                rounding_shift(5, 1, policy),
                rounding_shift(-5, 1, policy),
                rounding_shift(7, 2, policy),
                rounding_shift(-7, 2, policy),
            ];
            assert_eq!(got, want, "{policy:?}");
            // Agrees with the float rounding of the kernels.
            for (n, s) in [
                (5i64, 1u32),
                (-5, 1),
                (7, 2),
                (-7, 2),
                (13, 3),
                (-13, 3),
                (12, 3),
                (-12, 3),
            ] {
                let v = n as f32 / (1 << s) as f32;
                assert_eq!(
                    rounding_shift(n, s, policy) as f32,
                    policy.round(v),
                    "{policy:?} {n}>>{s}"
                );
            }
        }
    }
}
