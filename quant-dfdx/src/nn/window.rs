//! Sliding-window geometry shared by convolution and pooling: validation of kernel, stride and
//! padding against the input, output sizes, and for each kernel offset the output positions
//! whose tap lies inside the input (so the inner loops never test bounds per element).

use quant_core::{QuantError, Result};

/// A rejected argument, phrased as `op: what = value is invalid: expected`.
pub(crate) fn invalid(
    op: &str,
    what: &str,
    value: impl std::fmt::Display,
    expected: String,
) -> QuantError {
    QuantError::InvalidValue {
        what: format!("{op}: {what}"),
        value: value.to_string(),
        expected,
    }
}

/// `a * b`, or a typed error naming what overflowed (only absurd shapes get there).
pub(crate) fn checked_mul(op: &str, what: &str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b).ok_or_else(|| {
        invalid(
            op,
            what,
            format!("{a} * {b}"),
            format!("{what} must fit in usize ({})", usize::MAX),
        )
    })
}

/// The validated geometry of a square window sliding over a batch of `(channels, h, w)` planes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub batch: usize,
    pub channels: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub stride: usize,
    pub pad: usize,
    pub oh: usize,
    pub ow: usize,
}

impl Window {
    /// Checks `kernel`, `stride` and `padding` against an input of `h x w` and computes the
    /// output size `(h + 2 * padding - kernel) / stride + 1` (floor, as PyTorch without
    /// `ceil_mode`).
    /// `dims` is the input's `[batch, channels, height, width]`.
    pub fn new(
        op: &str,
        dims: [usize; 4],
        kernel: usize,
        stride: usize,
        padding: usize,
    ) -> Result<Window> {
        let [batch, channels, h, w] = dims;
        if kernel == 0 {
            return Err(invalid(
                op,
                "kernel size",
                0,
                "the kernel size must be at least 1".into(),
            ));
        }
        if stride == 0 {
            return Err(invalid(
                op,
                "stride",
                0,
                "the stride must be at least 1".into(),
            ));
        }
        let out_len = |name: &str, len: usize| -> Result<usize> {
            let padded = padding
                .checked_mul(2)
                .and_then(|p2| len.checked_add(p2))
                .ok_or_else(|| {
                    invalid(
                        op,
                        "padding",
                        padding,
                        format!("{name} + 2 * padding must fit in usize"),
                    )
                })?;
            if padded < kernel {
                return Err(invalid(
                    op,
                    &format!("input {name}"),
                    len,
                    format!(
                        "the input is smaller than the kernel: {name} + 2 * padding = {len} + 2 * {padding} = {padded} \
                         must be at least the kernel size {kernel}"
                    ),
                ));
            }
            Ok((padded - kernel) / stride + 1)
        };
        let oh = out_len("height", h)?;
        let ow = out_len("width", w)?;
        let win = Window {
            batch,
            channels,
            h,
            w,
            k: kernel,
            stride,
            pad: padding,
            oh,
            ow,
        };
        // Every buffer the ops allocate is at most one of these sizes times a small factor;
        // checking them once here keeps the kernels free of overflow checks.
        let planes = checked_mul(op, "batch * channels", batch, channels)?;
        checked_mul(
            op,
            "input size",
            planes,
            checked_mul(op, "input size", h, w)?,
        )?;
        let taps = checked_mul(op, "kernel taps", kernel, kernel)?;
        let ohw = checked_mul(op, "output size", oh, ow)?;
        checked_mul(op, "output size", planes, ohw)?;
        checked_mul(
            op,
            "im2col size",
            checked_mul(op, "im2col size", planes, taps)?,
            ohw,
        )?;
        Ok(win)
    }

    /// `h * w`.
    pub fn in_plane(&self) -> usize {
        self.h * self.w
    }

    /// `oh * ow`.
    pub fn out_plane(&self) -> usize {
        self.oh * self.ow
    }

    /// The output positions `lo..hi` (within
    /// `0..out_len`) whose tap at kernel offset `offset` lies inside an input axis of length
    /// `len`. They read consecutive input positions `stride` apart, from
    /// `lo * stride + offset - pad`.
    #[inline]
    pub fn output_span(&self, offset: usize, len: usize, out_len: usize) -> (usize, usize) {
        // o * stride + offset >= pad  <=>  o >= ceil((pad - offset) / stride)
        let lo = self.pad.saturating_sub(offset).div_ceil(self.stride);
        // o * stride + offset - pad <= len - 1  <=>  o <= (len - 1 + pad - offset) / stride
        let hi = match (len + self.pad).checked_sub(offset + 1) {
            Some(top) => (top / self.stride + 1).min(out_len),
            None => 0,
        };
        (lo.min(hi), hi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_span_matches_brute_force() {
        for in_len in 1..7 {
            for k in 1..5 {
                for pad in 0..3 {
                    for stride in 1..4 {
                        let Ok(win) = Window::new("t", [1, 1, in_len, in_len], k, stride, pad)
                        else {
                            continue;
                        };
                        for off in 0..k {
                            let (lo, hi) = win.output_span(off, in_len, win.oh);
                            for o in 0..win.oh {
                                let tap = (o * stride + off) as isize - pad as isize;
                                let inside = tap >= 0 && tap < in_len as isize;
                                assert_eq!(
                                    inside,
                                    (lo..hi).contains(&o),
                                    "in {in_len} k {k} p {pad} s {stride} off {off} o {o}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
