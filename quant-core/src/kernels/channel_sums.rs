//! Per-channel sums over a batch of feature maps, in one fixed order: each channel's values
//! image by image, each plane in order, added one at a time to a sum that starts at zero (the
//! order in which dfdx's reductions over batch, height and width add them).
//!
//! Each channel's sum is a chain of dependent additions, so its order decides its bits and
//! cannot change; what can run side by side is the chains of different channels. The portable
//! path runs eight channels' chains as scalars; with AVX (detected at run time) eight planes'
//! next eight values are loaded as rows, transposed, and added as eight vectors of one value
//! per channel, each lane one channel's chain in its order: the same sums bit for bit.

/// Eight channels: one vector's lanes.
pub const GROUP: usize = 8;

/// Where the channels lie in a batch: `images` images of `channels` planes of `plane` values
/// each, row-major.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planes {
    /// Images in the batch.
    pub images: usize,
    /// Channels (planes) per image.
    pub channels: usize,
    /// Values per plane.
    pub plane: usize,
}

/// `sums[j] = Σ value(first + j, i)` over the flat indices `i` of channel `first + j`'s
/// values in order (image by image, each plane in order), each sum a chain of additions from
/// `0.0`, for the channels `first..first + sums.len()` (at most [`GROUP`]).
///
/// `values8(c, i)` must be `[value(c, i), value(c, i + 1), ..., value(c, i + 7)]` (what lets
/// the vector path read eight values of a plane at once).
///
/// # Panics
/// When `sums` holds more than [`GROUP`] channels or `first + sums.len()` exceeds the channels.
#[inline(always)]
pub fn sum_group(
    planes: Planes,
    first: usize,
    sums: &mut [f32],
    value: impl Fn(usize, usize) -> f32,
    values8: impl Fn(usize, usize) -> [f32; 8],
) {
    assert!(
        sums.len() <= GROUP && first + sums.len() <= planes.channels,
        "sum_group: channels {first}..{} of {}",
        first + sums.len(),
        planes.channels
    );
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX; the channels were checked above.
        unsafe { sum_group_avx(planes, first, sums, value, values8) };
        return;
    }
    let _ = &values8;
    sum_group_portable(planes, first, sums, value);
}

/// [`sum_group`] with scalar chains: the reference. Not public API (quant-core's tests).
#[doc(hidden)]
#[inline(always)]
pub fn sum_group_portable(
    planes: Planes,
    first: usize,
    sums: &mut [f32],
    value: impl Fn(usize, usize) -> f32,
) {
    let lanes = sums.len();
    let mut acc = [0.0f32; GROUP];
    for b in 0..planes.images {
        let base = (b * planes.channels + first) * planes.plane;
        for k in 0..planes.plane {
            for (j, acc) in acc[..lanes].iter_mut().enumerate() {
                *acc += value(first + j, base + j * planes.plane + k);
            }
        }
    }
    sums.copy_from_slice(&acc[..lanes]);
}

/// [`sum_group`] eight values of each plane at a time: the group's eight rows transposed
/// into eight vectors (vector `t` holds each channel's value `k + t`) and added in order of
/// `t`; a plane's last values (fewer than eight) one vector at a time. Lanes past the group's
/// channels add zeros and are dropped.
///
/// # Safety
/// The CPU has AVX; `first + sums.len() <= planes.channels`, `sums.len() <= GROUP`.
#[doc(hidden)]
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
pub unsafe fn sum_group_avx(
    planes: Planes,
    first: usize,
    sums: &mut [f32],
    value: impl Fn(usize, usize) -> f32,
    values8: impl Fn(usize, usize) -> [f32; 8],
) {
    use std::arch::x86_64::*;
    let lanes = sums.len();
    let plane = planes.plane;
    // SAFETY: AVX (the caller's); loads and stores go through arrays of eight.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for b in 0..planes.images {
            let base = (b * planes.channels + first) * plane;
            let mut k = 0;
            while k + 8 <= plane {
                let rows: [__m256; 8] = std::array::from_fn(|j| {
                    if j < lanes {
                        _mm256_loadu_ps(values8(first + j, base + j * plane + k).as_ptr())
                    } else {
                        _mm256_setzero_ps()
                    }
                });
                for column in transpose(rows) {
                    acc = _mm256_add_ps(acc, column);
                }
                k += 8;
            }
            for k in k..plane {
                let column: [f32; 8] = std::array::from_fn(|j| {
                    if j < lanes {
                        value(first + j, base + j * plane + k)
                    } else {
                        0.0
                    }
                });
                acc = _mm256_add_ps(acc, _mm256_loadu_ps(column.as_ptr()));
            }
        }
        let mut out = [0.0f32; GROUP];
        _mm256_storeu_ps(out.as_mut_ptr(), acc);
        sums.copy_from_slice(&out[..lanes]);
    }
}

/// The 8x8 transpose: output `t` holds lane `t` of every row, in row order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
fn transpose(r: [std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    // Pairs of rows interleaved, then pairs of pairs, then the 128-bit halves.
    let t = [
        _mm256_unpacklo_ps(r[0], r[1]),
        _mm256_unpackhi_ps(r[0], r[1]),
        _mm256_unpacklo_ps(r[2], r[3]),
        _mm256_unpackhi_ps(r[2], r[3]),
        _mm256_unpacklo_ps(r[4], r[5]),
        _mm256_unpackhi_ps(r[4], r[5]),
        _mm256_unpacklo_ps(r[6], r[7]),
        _mm256_unpackhi_ps(r[6], r[7]),
    ];
    let u = [
        _mm256_shuffle_ps::<0x44>(t[0], t[2]),
        _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
        _mm256_shuffle_ps::<0x44>(t[1], t[3]),
        _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
        _mm256_shuffle_ps::<0x44>(t[4], t[6]),
        _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
        _mm256_shuffle_ps::<0x44>(t[5], t[7]),
        _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
    ];
    [
        _mm256_permute2f128_ps::<0x20>(u[0], u[4]),
        _mm256_permute2f128_ps::<0x20>(u[1], u[5]),
        _mm256_permute2f128_ps::<0x20>(u[2], u[6]),
        _mm256_permute2f128_ps::<0x20>(u[3], u[7]),
        _mm256_permute2f128_ps::<0x31>(u[0], u[4]),
        _mm256_permute2f128_ps::<0x31>(u[1], u[5]),
        _mm256_permute2f128_ps::<0x31>(u[2], u[6]),
        _mm256_permute2f128_ps::<0x31>(u[3], u[7]),
    ]
}
