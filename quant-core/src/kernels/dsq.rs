//! DSQ, differentiable soft quantization (Gong et al. 2019): the hard forward on the Uniform
//! grid of a learned range, and the exact derivative of the soft surrogate. The backward is a
//! scalar loop: its per-channel constants (range, sharpness) are not an affine grid's, and it
//! is not on a hot path.

use super::fake_quant::fake_quantize_affine_into;
use super::params::check_len;
use crate::error::Result;
use crate::quantizer::ChannelLayout;
use crate::vocab::RoundingPolicy;

/// Bounds of DSQ's sharpness `α`: it is clamped into this range before use (where it is
/// clamped, its gradient is 0).
pub const DSQ_ALPHA_RANGE: (f32, f32) = (1e-3, 0.999);

/// DSQ's per-channel scale and zero point for the range `[lower, upper]`: the Uniform
/// parameters ([`crate::grid::uniform_qparams`]), so 0 is on the grid.
pub fn dsq_qparams(lower: f32, upper: f32, grid: crate::grid::IntegerGrid) -> Result<(f32, i32)> {
    crate::grid::uniform_qparams(lower, upper, grid)
}

/// DSQ forward: affine fake quantization with [`dsq_qparams`] per channel.
///
/// # Errors
/// Non-finite range ends, or lengths that do not match the layout.
#[allow(clippy::too_many_arguments)]
pub fn dsq_forward_into(
    x: &[f32],
    y: &mut [f32],
    layout: ChannelLayout,
    lower: &[f32],
    upper: &[f32],
    grid: crate::grid::IntegerGrid,
    rounding: RoundingPolicy,
) -> Result<()> {
    check_len("lower", layout.channels, lower.len())?;
    check_len("upper", layout.channels, upper.len())?;
    let mut scales = Vec::with_capacity(layout.channels);
    let mut zps = Vec::with_capacity(layout.channels);
    for (l, u) in lower.iter().zip(upper) {
        let (s, z) = dsq_qparams(*l, *u, grid)?;
        scales.push(s);
        zps.push(z);
    }
    fake_quantize_affine_into(
        x,
        y,
        layout,
        &scales,
        &zps,
        grid.quant_min(),
        grid.quant_max(),
        rounding,
    )
}

/// DSQ backward: the exact derivative of the soft surrogate, added into `dx`, `dalpha`,
/// `dlower`, `dupper` (one value per channel each).
///
/// With `(Δ, z)` from [`dsq_qparams`], `lo = quant_min - z`, `N = quant_max - quant_min` and
/// `p = x/Δ - lo` (the position on the grid), inside `0 ≤ p ≤ N`:
/// `i = min(floor(p), N-1)`, `r = p - i - 1/2`, `a = ln(2/α - 1)`,
/// `φ = tanh(a·r) / (1-α)`, and the surrogate is `Q = Δ·(lo + i + (φ+1)/2)`: the hard forward
/// value is its limit `sign(φ)`. Outside, `Q` is the nearest end, `Δ·lo` or `Δ·(lo + N)`.
/// `z` and `i` are held constant; `Δ = (max(u,0) - min(l,0)) / N` carries the gradients of
/// the range ends.
///
/// Called after a successful [`dsq_forward_into`] with the same arguments, it cannot fail;
/// buffers that do not match the layout (which that forward pass rejects) are left untouched.
#[allow(clippy::too_many_arguments)]
pub fn dsq_backward_into(
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    layout: ChannelLayout,
    alpha: &[f32],
    lower: &[f32],
    upper: &[f32],
    grid: crate::grid::IntegerGrid,
    dalpha: &mut [f32],
    dlower: &mut [f32],
    dupper: &mut [f32],
) {
    let channels = layout.channels;
    // Buffers that disagree with the layout (the forward pass, which checks them, has failed
    // already) are left alone: this function cannot report an error.
    let per_channel = [alpha.len(), lower.len(), upper.len()];
    let grads = [dalpha.len(), dlower.len(), dupper.len()];
    if layout.numel() != x.len()
        || dy.len() != x.len()
        || dx.len() != x.len()
        || per_channel.iter().chain(&grads).any(|n| *n < channels)
    {
        return;
    }
    let n_levels = (grid.quant_max() - grid.quant_min()) as f32;
    let mut sums = vec![(0f64, 0f64); channels]; // (dΔ, dα) per channel
    let mut params = Vec::with_capacity(channels);
    for c in 0..channels {
        let (l, u) = (
            lower.get(c).copied().unwrap_or(0.0),
            upper.get(c).copied().unwrap_or(0.0),
        );
        let (delta, z) = dsq_qparams(l, u, grid).unwrap_or((crate::grid::MIN_SCALE, 0));
        let raw_alpha = alpha.get(c).copied().unwrap_or(0.2);
        let a_clamped = raw_alpha.clamp(DSQ_ALPHA_RANGE.0, DSQ_ALPHA_RANGE.1);
        params.push((
            delta,
            (grid.quant_min() - z) as f32,
            a_clamped,
            a_clamped == raw_alpha,
        ));
    }
    for (i, ((g, xi), dyi)) in dx.iter_mut().zip(x).zip(dy).enumerate() {
        let c = layout.channel_of(i);
        let (delta, lo, al, _) = params[c];
        let p = *xi / delta - lo;
        if p.is_nan() {
            continue;
        }
        if p < 0.0 {
            sums[c].0 += (*dyi * lo) as f64;
            continue;
        }
        if p > n_levels {
            sums[c].0 += (*dyi * (lo + n_levels)) as f64;
            continue;
        }
        let idx = p.floor().min(n_levels - 1.0);
        let r = p - idx - 0.5;
        let a = (2.0 / al - 1.0).ln();
        let t = (a * r).tanh();
        let k = 1.0 / (1.0 - al);
        let phi = t * k;
        let dphi_dr = a * (1.0 - t * t) * k;
        *g += *dyi * 0.5 * dphi_dr;
        let dq_ddelta = lo + idx + 0.5 * (phi + 1.0) - 0.5 * dphi_dr * *xi / delta;
        sums[c].0 += (*dyi * dq_ddelta) as f64;
        let da_dalpha = -2.0 / (al * (2.0 - al));
        let dphi_dalpha = (1.0 - t * t) * r * da_dalpha * k + t * k * k;
        sums[c].1 += (*dyi * 0.5 * delta * dphi_dalpha) as f64;
    }
    for c in 0..channels {
        let (l, u) = (
            lower.get(c).copied().unwrap_or(0.0),
            upper.get(c).copied().unwrap_or(0.0),
        );
        let (lo_end, hi_end) = (l.min(u), u.max(l));
        let ddelta = sums[c].0 as f32;
        // Δ = (max(hi, 0) - min(lo, 0)) / N; the floor at MIN_SCALE stops the gradient.
        let live = ((hi_end.max(0.0) - lo_end.min(0.0)) / n_levels) > crate::grid::MIN_SCALE;
        if live {
            if u >= l {
                dupper[c] += if u > 0.0 { ddelta / n_levels } else { 0.0 };
                dlower[c] += if l < 0.0 { -ddelta / n_levels } else { 0.0 };
            } else {
                dlower[c] += if l > 0.0 { ddelta / n_levels } else { 0.0 };
                dupper[c] += if u < 0.0 { -ddelta / n_levels } else { 0.0 };
            }
        }
        if params[c].3 {
            dalpha[c] += sums[c].1 as f32;
        }
    }
}
