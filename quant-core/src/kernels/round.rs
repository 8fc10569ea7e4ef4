//! Rounding to an integer on the fast paths: the `1.5 * 2^23` trick and one zero-sized type per
//! [`RoundingPolicy`](crate::vocab::RoundingPolicy), so each kernel is compiled once per
//! policy without a branch per element.

/// `1.5 * 2^23`: adding and subtracting it rounds to the nearest integer, ties to even, for
/// any `|v| <= 2^22`.
pub(super) const MAGIC: f32 = 12_582_912.0;
/// The bit pattern of [`MAGIC`]: for an integer-valued `|v| < 2^22`, the bits of `v + MAGIC`
/// are `MAGIC_BITS + v`, an exact float-to-integer conversion that vectorises on SSE2.
const MAGIC_BITS: i32 = 0x4B40_0000;

#[inline(always)]
pub(super) fn rne(v: f32) -> f32 {
    (v + MAGIC) - MAGIC
}

/// `1.5 * 2^52`, [`MAGIC`] for `f64`.
const MAGIC_F64: f64 = 6_755_399_441_055_744.0;

/// `v.round_ties_even()` for any `f64`, without the library call baseline x86-64 makes for
/// it (no `roundsd` before SSE4.1): the add-and-subtract trick where it is exact
/// (`|v| ≤ 2^51`), the call beyond (where `v` is an integer or half-integer anyway).
/// (Only the dfdx ops and the tests call it.)
#[cfg(feature = "dfdx")]
#[inline(always)]
pub fn round_ties_even_f64(v: f64) -> f64 {
    if v.abs() <= (1u64 << 51) as f64 {
        round_small_f64(v)
    } else {
        v.round_ties_even()
    }
}

/// An integer-valued `f64` with `|v| <= 2^31` as `i32` (two's complement, so `2^31` itself
/// wraps: clamp first), exactly: the low 32 bits of `v + 1.5 · 2^52` are `v`'s. Vectorises
/// where `as i32` (a saturating conversion) does not.
#[inline(always)]
pub(crate) fn small_int_f64(v: f64) -> i32 {
    (v + MAGIC_F64).to_bits() as i32
}

/// `(v + 1.5 · 2^52) - 1.5 · 2^52`: `v` rounded to the nearest integer, ties to even, for
/// `|v| <= 2^51` (the caller bounds `v`; [`round_ties_even_f64`] for any `v`).
#[inline(always)]
pub(crate) fn round_small_f64(v: f64) -> f64 {
    (v + MAGIC_F64) - MAGIC_F64
}

/// An integer-valued `f32` with `|v| < 2^22` as `i32`, exactly: vectorises where `as i32` on
/// a float (a saturating conversion) does not.
#[inline(always)]
pub(super) fn small_int(v: f32) -> i32 {
    (v + MAGIC).to_bits() as i32 - MAGIC_BITS
}

#[inline(always)]
pub(super) fn clamp(v: f32, lo: f32, hi: f32) -> f32 {
    // Comparisons, not f32::max/min: they vectorise to compare + select (maxps/minps) and let
    // NaN through.
    let v = if v < lo { lo } else { v };
    if v > hi {
        hi
    } else {
        v
    }
}

/// Rounding to an integer, valid for `|v| <= 2^22` (and NaN, which it propagates).
pub(super) trait Round: Send + Sync + 'static {
    /// Round half to even (PyTorch's rounding), which has a hand-written AVX2 LSQ backward.
    const HALF_EVEN: bool = false;
    fn round(v: f32) -> f32;
}

macro_rules! rounding {
    ($name:ident, |$v:ident, $r:ident, $d:ident| $body:expr) => {
        rounding!($name, false, |$v, $r, $d| $body);
    };
    ($name:ident, $half_even:literal, |$v:ident, $r:ident, $d:ident| $body:expr) => {
        pub(super) struct $name;
        impl Round for $name {
            const HALF_EVEN: bool = $half_even;
            #[inline(always)]
            fn round($v: f32) -> f32 {
                let $r = rne($v);
                // Exact: |v - r| <= 0.5 and both are close (Sterbenz).
                let $d = $v - $r;
                $body
            }
        }
    };
}

rounding!(HalfEven, true, |v, r, d| {
    let _ = (v, d);
    r
});
rounding!(HalfAwayFromZero, |v, r, d| {
    r + if d == 0.5 && v > 0.0 { 1.0 } else { 0.0 } - if d == -0.5 && v < 0.0 { 1.0 } else { 0.0 }
});
rounding!(HalfUp, |v, r, d| {
    let _ = v;
    r + if d == 0.5 { 1.0 } else { 0.0 }
});
rounding!(HalfDown, |v, r, d| {
    let _ = v;
    r - if d == -0.5 { 1.0 } else { 0.0 }
});
rounding!(HalfTowardZero, |v, r, d| {
    r + if d == 0.5 && v < 0.0 { 1.0 } else { 0.0 } - if d == -0.5 && v > 0.0 { 1.0 } else { 0.0 }
});
rounding!(Floor, |v, r, d| {
    let _ = v;
    r - if d < 0.0 { 1.0 } else { 0.0 }
});
rounding!(Ceil, |v, r, d| {
    let _ = v;
    r + if d > 0.0 { 1.0 } else { 0.0 }
});

/// Evaluates `$body` with the type alias `$r` naming the zero-sized rounding type of `$policy`:
/// `with_rounding!(policy, R => drive(&FakeQuant::<R, _>::new(..), ..))`.
macro_rules! with_rounding {
    ($policy:expr, $r:ident => $body:expr) => {
        with_rounding!(@each $policy, $r => $body;
            HalfEven, HalfAwayFromZero, HalfUp, HalfDown, HalfTowardZero, Floor, Ceil)
    };
    // One arm per policy, each naming the rounding type of the same name.
    (@each $policy:expr, $r:ident => $body:expr; $($name:ident),*) => {{
        use $crate::kernels::round as r;
        match $policy {
            $(RoundingPolicy::$name => {
                type $r = r::$name;
                $body
            })*
        }
    }};
}
