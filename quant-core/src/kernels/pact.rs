//! PACT (Choi et al. 2018): activations clipped to a learned `[0, α]`, then quantized.

use super::driver::{
    drive, reduce_blocks, ElementKernel, Expanded, Streams, Walk, BLOCK, CHUNK, LANES,
};
use super::fake_quant::fake_quantize_affine_into;
use super::params::Affine;
use crate::error::{QuantError, Result};
use crate::grid::IntegerGrid;
use crate::quantizer::ChannelLayout;
use crate::vocab::RoundingPolicy;

/// PACT's effective clip value: `alpha`, floored so the scale `alpha / quant_max` stays at
/// least [`crate::grid::MIN_SCALE`].
pub fn pact_alpha(alpha: f32, grid: IntegerGrid) -> f32 {
    alpha.max(crate::grid::MIN_SCALE * grid.quant_max() as f32)
}

/// PACT forward: `fake_quant(clamp(x, 0, α))` with `scale = α / quant_max`, zero point 0, on an
/// unsigned grid. (Clamping `x * (1/scale)` to `[0, quant_max]` is the same clamp.)
///
/// # Errors
/// A NaN or infinite `alpha`, or a signed grid.
pub fn pact_forward_into(
    x: &[f32],
    y: &mut [f32],
    layout: ChannelLayout,
    alpha: f32,
    grid: IntegerGrid,
    rounding: RoundingPolicy,
) -> Result<()> {
    if !alpha.is_finite() {
        return Err(QuantError::NonFinite {
            what: "alpha".into(),
            value: alpha as f64,
        });
    }
    if grid.signed() {
        return Err(QuantError::InvalidValue {
            what: "grid.signed".into(),
            value: "true".into(),
            expected: "an unsigned grid: PACT clips activations to [0, alpha]".into(),
        });
    }
    let scale = pact_alpha(alpha, grid) / grid.quant_max() as f32;
    fake_quantize_affine_into(
        x,
        y,
        ChannelLayout::per_tensor(layout.numel()),
        &[scale],
        &[0],
        grid.quant_min(),
        grid.quant_max(),
        rounding,
    )
}

/// PACT's backward over a span: adds into `dx`, returns `Σ dy·[x ≥ α]`.
#[inline(always)]
fn pact_span(x: &[f32], dy: &[f32], dx: &mut [f32], alpha: f32) -> f64 {
    #[inline(always)]
    fn terms(x: f32, dy: f32, alpha: f32) -> (f32, f32) {
        let inside = x >= 0.0 && x < alpha;
        (
            if inside { dy } else { 0.0 },
            if x >= alpha { dy } else { 0.0 },
        )
    }
    let n = x.len().min(dy.len()).min(dx.len());
    let (x, dy, dx) = (&x[..n], &dy[..n], &mut dx[..n]);
    // As in LSQ: element-wise terms into a stack buffer, then f32 lanes and f64 blocks.
    let mut wide = [0f64; LANES];
    let mut dalpha = 0f64;
    let mut ta = [0f32; CHUNK];
    for (x, dy, g) in (x, dy, dx).chunks(CHUNK) {
        let m = x.len().min(dy.len()).min(g.len()).min(CHUNK);
        let (x, dy, g, ta) = (&x[..m], &dy[..m], &mut g[..m], &mut ta[..m]);
        for i in 0..m {
            let (d, a) = terms(x[i], dy[i], alpha);
            g[i] += d;
            ta[i] = a;
        }
        let whole = m - m % BLOCK;
        reduce_blocks(&ta[..whole], &mut wide);
        dalpha += ta[whole..].iter().map(|a| *a as f64).sum::<f64>();
    }
    dalpha + wide.iter().sum::<f64>()
}

/// PACT's backward as a kernel of the element driver (per tensor: it carries its one constant,
/// the effective `α`).
struct PactBackward {
    alpha: f32,
}

impl ElementKernel<(&[f32], &[f32], &mut [f32])> for PactBackward {
    type Sums = f64;
    #[inline(always)]
    fn span(&self, (x, dy, dx): (&[f32], &[f32], &mut [f32]), _: &Affine) -> f64 {
        pact_span(x, dy, dx, self.alpha)
    }
    #[inline(always)]
    fn periods(&self, (x, dy, dx): (&[f32], &[f32], &mut [f32]), _: &Expanded, sums: &mut [f64]) {
        // Unused (PACT walks a whole tensor), and correct all the same: one α for every channel.
        if let Some(s) = sums.first_mut() {
            *s += pact_span(x, dy, dx, self.alpha);
        }
    }
}

/// PACT backward: adds `dy·[0 ≤ x < α]` into `dx` and returns `dα = Σ dy·[x ≥ α]`. Extra
/// elements of the longer buffers, if the lengths differ, are left alone.
pub fn pact_backward_into(
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    alpha: f32,
    grid: IntegerGrid,
) -> f32 {
    let alpha = pact_alpha(alpha, grid);
    let n = x.len().min(dy.len()).min(dx.len());
    let (x, dy, dx) = (&x[..n], &dy[..n], &mut dx[..n]);
    if n == 0 {
        return 0.0;
    }
    let sums = drive(
        &PactBackward { alpha },
        (x, dy, dx),
        &Walk::Tensor(Affine::default()),
        1,
    );
    sums[0] as f32
}
