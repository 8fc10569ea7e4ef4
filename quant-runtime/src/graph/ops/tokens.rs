//! A vision transformer's token ops: `ImageTokens` (feature maps as patch tokens plus a
//! position embedding) and `MeanTokens` (the mean over the tokens).

use serde::{Deserialize, Serialize};

use super::expect_axes;
use super::{maps, OpRules};
use crate::export::onnx::writer::{float_values, int_attr, ints_attr, OnnxNode, Writer};
use crate::graph::eval::{float_values as float_parameter, EvalNode};
use crate::graph::params::check_parameter;
use crate::graph::Axes;
use crate::graph::{ParamValues, Parameter};
use crate::integer::prepare::{reach, unsupported, within_i32, PrepareNode, Prepared};
use crate::integer::run::{Buf, RunNode};
use crate::integer::{Layout, Rep};
use crate::GraphError;

/// Most bits by which an ImageTokens node refines its accumulators' scale.
const MAX_POSITION_SHIFT: u32 = 24;

/// `[channels, height, width]` maps as `[height · width, channels]` tokens (token
/// `y · width + x` holds the channels at `(y, x)`), plus a learned position embedding
/// `[tokens, channels]`: a vision transformer's patch tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageTokens {
    /// One vector per token.
    pub position: Parameter,
}

/// The mean of `[tokens, features]` over the tokens, giving `[features]`.
pub(crate) struct MeanTokens;

impl OpRules for ImageTokens {
    fn name(&self) -> &'static str {
        "ImageTokens"
    }

    fn shape(&self, inputs: &[&[usize]], values: bool) -> Result<Vec<usize>, String> {
        let (c, h, w) = maps(inputs, "ImageTokens")?;
        let tokens = h * w;
        if values {
            check_parameter(
                &self.position,
                "position",
                tokens * c,
                tokens * c,
                &["float"],
            )?;
        }
        Ok(vec![tokens, c])
    }

    fn axes(&self, inputs: &[Axes]) -> Result<Axes, String> {
        expect_axes(self.name(), inputs, 0, Axes::Maps)?;
        Ok(Axes::Tokens)
    }

    fn evaluate(&self, node: &EvalNode<'_>) -> quant_core::Result<Vec<f32>> {
        let p = float_parameter("ImageTokens", node.name, &self.position)?;
        let in_shape = node.shapes[0];
        let (c, hw) = (in_shape[0], in_shape[1] * in_shape[2]);
        let xs = node.inputs[0];
        let mut y = Vec::with_capacity(xs.len());
        for sample in xs.chunks_exact(c * hw) {
            for t in 0..hw {
                y.extend((0..c).map(|ch| sample[ch * hw + t] + p[t * c + ch]));
            }
        }
        Ok(y)
    }

    fn prepare(&self, node: &mut PrepareNode<'_>) -> Result<Prepared, GraphError> {
        let name = node.name;
        let Layout::Maps { c, h, w } = node.layout(0) else {
            return Err(unsupported(name, "its input is not feature maps"));
        };
        let ParamValues::Float(p) = &self.position.values else {
            return Err(unsupported(name, "its position embedding is not float"));
        };
        let (scales, bound) = match node.rep(0) {
            Rep::Codes(g) => (vec![g.scale], reach(g)),
            Rep::Acc { scales, bound } => (scales.clone(), *bound),
            Rep::Float => unreachable!("float inputs are refused before any op prepares"),
        };
        // The embedding joins the accumulators at their scale (per channel), refined by
        // 2^shift first: at 4 bits that scale (s_in · s_w) is coarse next to a position
        // embedding, which would otherwise be rounded by up to half of it.
        let (shift, at_scale, bound) = (0..=MAX_POSITION_SHIFT)
            .rev()
            .find_map(|shift| {
                let finer = 2f64.powi(shift as i32);
                let at_scale: Option<Vec<i64>> = p
                    .iter()
                    .enumerate()
                    .map(|(k, v)| {
                        let s = scales[if scales.len() == 1 { 0 } else { k % c }];
                        let q = (*v as f64 * finer / s).round();
                        (q.abs() <= f64::from(i32::MAX)).then_some(q as i64)
                    })
                    .collect();
                let at_scale = at_scale?;
                let largest = at_scale.iter().map(|q| q.abs()).max().unwrap_or(0);
                let total = bound.checked_mul(1 << shift)?.checked_add(largest)?;
                (total <= i64::from(i32::MAX)).then_some((shift, at_scale, total))
            })
            .ok_or_else(|| {
                unsupported(
                    name,
                    "tokens plus positions could overflow an i32 accumulator at the accumulators' scale",
                )
            })?;
        let finer = 2f64.powi(shift as i32);
        let scales = scales.iter().map(|s| s / finer).collect();
        let at_scale: Vec<i32> = at_scale.into_iter().map(|q| q as i32).collect();
        debug_assert_eq!(at_scale.len(), h * w * c);
        node.step.position = at_scale;
        node.step.position_shift = shift;
        node.cost = node.numel(0) as u64;
        Ok((Rep::Acc { scales, bound }, Layout::Flat { features: c }))
    }

    fn run(&self, node: &mut RunNode<'_>) -> quant_core::Result<Buf> {
        let zero = match node.rep(0) {
            Rep::Codes(g) => Some(g.zero),
            _ => None,
        };
        let mut y = match (node.take(0), zero) {
            (Buf::I32(v), _) => v,
            (Buf::U8(v), Some(z)) => v.iter().map(|q| *q as i32 - z).collect(),
            _ => return Err(node.internal()),
        };
        // NHWC maps are already [tokens, channels]; prepare bounds the result in i32.
        let (pos, shift) = (&node.step.position, node.step.position_shift);
        for sample in y.chunks_mut(pos.len().max(1)) {
            sample
                .iter_mut()
                .zip(pos)
                .for_each(|(v, p)| *v = (*v << shift) + p);
        }
        Ok(Buf::I32(y))
    }

    /// The feature maps `[N, C, H, W]` as `H·W` tokens of `C` channels (row-major positions),
    /// plus the position embedding.
    fn write_onnx<'g>(&self, w: &mut Writer<'g>, node: &OnnxNode<'g>) -> Result<(), GraphError> {
        let n = node.node;
        let in_shape = node.shapes[0];
        let (c, tokens) = (in_shape[0], in_shape[1] * in_shape[2]);
        let p = float_values(n, &self.position)?;
        let planes = w.reshape(n, node.inputs[0].clone(), &[c, tokens], "planes");
        let t = w.transpose(n, planes, &[0, 2, 1], "tokens");
        let p = w.floats(&format!("{}.position", n.name), &[tokens, c], p);
        w.op("Add", &n.name, &[t, p], node.out.clone(), Vec::new());
        Ok(())
    }

    fn parameters(&self, output: &[usize]) -> Vec<(&Parameter, Vec<usize>)> {
        vec![(&self.position, output.to_vec())]
    }

    fn parameters_mut(&mut self, output: &[usize]) -> Vec<(&mut Parameter, Option<Vec<usize>>)> {
        vec![(&mut self.position, Some(output.to_vec()))]
    }
}

impl OpRules for MeanTokens {
    fn name(&self) -> &'static str {
        "MeanTokens"
    }

    fn shape(&self, inputs: &[&[usize]], _values: bool) -> Result<Vec<usize>, String> {
        match inputs {
            [[_, c]] => Ok(vec![*c]),
            [other] => Err(format!(
                "MeanTokens needs [tokens, features]; it receives {other:?}"
            )),
            _ => Err(format!(
                "MeanTokens takes one input; it has {}",
                inputs.len()
            )),
        }
    }

    fn axes(&self, inputs: &[Axes]) -> Result<Axes, String> {
        expect_axes(self.name(), inputs, 0, Axes::Tokens)?;
        Ok(Axes::Features)
    }

    fn evaluate(&self, node: &EvalNode<'_>) -> quant_core::Result<Vec<f32>> {
        let (tokens, c) = (node.shapes[0][0], node.shapes[0][1]);
        let mut y = Vec::with_capacity(node.samples * c);
        for sample in node.inputs[0].chunks_exact(tokens * c) {
            y.extend(
                (0..c)
                    .map(|ch| (0..tokens).map(|t| sample[t * c + ch]).sum::<f32>() / tokens as f32),
            );
        }
        Ok(y)
    }

    fn prepare(&self, node: &mut PrepareNode<'_>) -> Result<Prepared, GraphError> {
        let Layout::Flat { features: c } = node.layout(0) else {
            return Err(unsupported(node.name, "its input is not tokens"));
        };
        let tokens = node.numel(0) / c.max(1);
        node.cost = node.numel(0) as u64;
        let rep = match node.rep(0) {
            // The sum of centered codes; the scale carries the division.
            Rep::Codes(g) => Rep::Acc {
                scales: vec![g.scale / tokens as f64],
                bound: reach(g).saturating_mul(tokens as i64),
            },
            // The mean, rounded to the accumulators' own step (their sum may not fit i32).
            Rep::Acc { scales, bound } => Rep::Acc {
                scales: scales.clone(),
                bound: *bound,
            },
            Rep::Float => unreachable!("float inputs are refused before any op prepares"),
        };
        if let Rep::Acc { bound, .. } = &rep {
            within_i32(node.name, *bound, "a sum")?;
        }
        Ok((rep, Layout::Flat { features: c }))
    }

    fn run(&self, node: &mut RunNode<'_>) -> quant_core::Result<Buf> {
        let Layout::Flat { features: c } = node.layout(0) else {
            return Err(node.internal());
        };
        let tokens = node.numel(0) / c.max(1);
        match (node.input(0), node.rep(0)) {
            // Prepare bounds the sum of centered codes within i32.
            (Some(Buf::U8(v)), Rep::Codes(g)) => Ok(Buf::I32(
                token_sums(v, c, tokens, |q| i64::from(*q) - i64::from(g.zero))
                    .into_iter()
                    .map(|s| s as i32)
                    .collect(),
            )),
            // The mean, rounded to nearest (ties to even) at the accumulators' scale.
            (Some(Buf::I32(v)), _) => Ok(Buf::I32(
                token_sums(v, c, tokens, |q| i64::from(*q))
                    .into_iter()
                    .map(|s| rounded_div(s, tokens as i64))
                    .collect(),
            )),
            _ => Err(node.internal()),
        }
    }

    /// `[N, T, C]` → `[N, C]`.
    fn write_onnx<'g>(&self, w: &mut Writer<'g>, node: &OnnxNode<'g>) -> Result<(), GraphError> {
        let attrs = vec![ints_attr("axes", &[1]), int_attr("keepdims", 0)];
        let x = node.inputs[0].clone();
        w.op("ReduceMean", &node.node.name, &[x], node.out.clone(), attrs);
        Ok(())
    }
}

/// Per sample, the sum over `tokens` rows of each of `c` features, in `i64` (`2^31` tokens of
/// `i32` values fit).
fn token_sums<T>(x: &[T], c: usize, tokens: usize, value: impl Fn(&T) -> i64) -> Vec<i64> {
    // One pass into one buffer, so that the compiler vectorizes the row loop.
    let (c, sample) = (c.max(1), (c * tokens).max(1));
    let mut sums = vec![0i64; x.len() / sample * c];
    for (sample, sums) in x.chunks_exact(sample).zip(sums.chunks_exact_mut(c)) {
        for row in sample.chunks_exact(c) {
            sums.iter_mut().zip(row).for_each(|(s, q)| *s += value(q));
        }
    }
    sums
}

/// `a / b` rounded to nearest, ties to even, for `b > 0` (a mean of `i32` values fits).
fn rounded_div(a: i64, b: i64) -> i32 {
    const EXACT: u64 = 1 << 53;
    let (q, r) = if a.unsigned_abs() < EXACT && b.unsigned_abs() < EXACT {
        // Both exact in `f64`, so the rounded quotient is at least the exact floor (rounding
        // is monotone and integers are exact) and at most one above it; the remainder's sign
        // settles it. A division in `f64` is several times faster than one in `i64` (this
        // runs once per feature of every sample).
        let q = (a as f64 / b as f64).floor() as i64;
        match a - q * b {
            r if r < 0 => (q - 1, r + b),
            r => (q, r),
        }
    } else {
        (a.div_euclid(b), a.rem_euclid(b))
    };
    let up = match (2 * r).cmp(&b) {
        std::cmp::Ordering::Greater => true,
        std::cmp::Ordering::Equal => q % 2 != 0,
        std::cmp::Ordering::Less => false,
    };
    (q + i64::from(up)) as i32
}

#[cfg(test)]
mod tests {
    use super::rounded_div;

    /// The mean's rounding against the exact quotient in `i128`: ties, neighbours of ties and
    /// of multiples, negative sums, quotients that `f64` rounds up onto an integer (just
    /// below 2^33 over 2^20), and sums beyond `f64`'s integers.
    #[test]
    fn rounded_division_is_to_nearest_ties_to_even() {
        let reference = |a: i64, b: i64| -> i64 {
            let (a, b) = (a as i128, b as i128);
            let (q, r) = (a.div_euclid(b), a.rem_euclid(b));
            (q + i128::from(2 * r > b || (2 * r == b && q % 2 != 0))) as i64
        };
        let divisors = [1i64, 2, 3, 7, 16, 17, 196, 197, 1 << 20];
        let quotients = [-5i64, -2, -1, 0, 1, 2, 3, 1 << 30, -(1 << 30), 1 << 33];
        let mut sums = vec![0, 1, -1, i64::from(i32::MAX), i64::from(i32::MIN)];
        for (b, q) in divisors.iter().flat_map(|b| quotients.map(|q| (*b, q))) {
            for r in [-1, 0, 1, b / 2 - 1, b / 2, b / 2 + 1, b - 1, b] {
                sums.push(q * b + r);
            }
        }
        for (b, a) in divisors.iter().flat_map(|b| sums.iter().map(|a| (*b, *a))) {
            // Modulo 2^32, as the function's `as i32`.
            assert_eq!(rounded_div(a, b), reference(a, b) as i32, "{a} / {b}");
        }
        // Beyond 2^53: the exact division.
        for a in [(1i64 << 53) + 3, -(1i64 << 53) - 5, (1 << 60) + 1] {
            let b = 1 << 31;
            assert_eq!(rounded_div(a, b), reference(a, b) as i32, "{a} / {b}");
        }
    }
}
