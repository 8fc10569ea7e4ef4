//! The x86-64 micro-kernels of [`super::gemm_u8`].
//!
//! One generic tile ([`tile`]) keeps `R` rows × `B` panels of output channels in registers and
//! walks the fan-in one group (4 `u8 × i8` or 2 `i16 × i16` products per `i32` lane) at a
//! time: load `B` weight vectors, then for each row broadcast its group of activations and
//! add the dot products. [`Register`] says how one register width does each step, [`Simd`]
//! how one instruction set forms the dot products; the generic code is inlined into one
//! `#[target_feature]` entry per instruction set and weight form, so every intrinsic compiles
//! to its instruction in place. Without VNNI, where the activations' largest code and the
//! weights' largest magnitude allow it, the `vpmaddubsw` pair sums are added in `i16` lanes
//! and widened once per chunk of groups ([`Quads16`]).

use std::arch::x86_64::*;
use std::marker::PhantomData;

use super::gemm::{Form, PackedMatrix};
use super::Isa;

/// The operations of one register width, the same for every dot-product form.
///
/// Every method runs intrinsics of the width's instruction set, AVX2 for `__m256i` and
/// AVX-512 F + BW for `__m512i`, from code that need not enable it itself (the
/// `#[target_feature]` entries below inline them): each is an `unsafe fn` whose callers
/// guarantee that the CPU runs that instruction set.
trait Register: Copy {
    /// `i32` lanes per register: output channels per panel.
    const LANES: usize;
    /// Every lane 0.
    ///
    /// # Safety
    /// The CPU runs this width's instruction set (checked with `is_x86_feature_detected!`).
    unsafe fn zero() -> Self;
    /// Every lane set to one group of activations.
    ///
    /// # Safety
    /// The CPU runs this width's instruction set (checked with `is_x86_feature_detected!`).
    unsafe fn splat(x: i32) -> Self;
    /// One group of weights for every lane (`4 · LANES` bytes).
    ///
    /// # Safety
    /// The CPU runs this width's instruction set, and `p` points to `4 · LANES` readable
    /// bytes (any alignment).
    unsafe fn load(p: *const u8) -> Self;
    /// `LANES` values from `p`.
    ///
    /// # Safety
    /// The CPU runs this width's instruction set, and `p` points to `LANES` readable `i32`s
    /// (any alignment).
    unsafe fn load_i32(p: *const i32) -> Self;
    /// Lane-wise wrapping `i32` sums.
    ///
    /// # Safety
    /// The CPU runs this width's instruction set (checked with `is_x86_feature_detected!`).
    unsafe fn add(a: Self, b: Self) -> Self;
    /// Lane-wise wrapping `i16` sums.
    ///
    /// # Safety
    /// The CPU runs this width's instruction set (checked with `is_x86_feature_detected!`).
    unsafe fn add_i16(a: Self, b: Self) -> Self;
    /// Stores every lane at `p`.
    ///
    /// # Safety
    /// The CPU runs this width's instruction set, and `p` points to `LANES` writable `i32`s
    /// (any alignment).
    unsafe fn store(p: *mut i32, v: Self);
    /// Stores the first `count` (< `LANES`) lanes.
    ///
    /// # Safety
    /// The CPU runs this width's instruction set, and `p` points to `count.min(LANES)`
    /// writable `i32`s (any alignment); nothing past them is touched.
    unsafe fn store_first(p: *mut i32, v: Self, count: usize);
    /// `vpmaddubsw`: `u8 × i8` products, adjacent pairs summed into `i16` (saturating).
    ///
    /// # Safety
    /// The CPU runs this width's instruction set (checked with `is_x86_feature_detected!`).
    unsafe fn maddubs(a: Self, w: Self) -> Self;
    /// `vpmaddwd`: `i16 × i16` products, adjacent pairs summed into `i32`.
    ///
    /// # Safety
    /// The CPU runs this width's instruction set (checked with `is_x86_feature_detected!`).
    unsafe fn madd(a: Self, w: Self) -> Self;
    /// Every `i16` lane 1.
    ///
    /// # Safety
    /// The CPU runs this width's instruction set (checked with `is_x86_feature_detected!`).
    unsafe fn ones_i16() -> Self;
}

/// Implements [`Register`] for one width: the two widths differ only in their intrinsics (and
/// in how they store a partial register). `$features` names the width's instruction set for
/// the `# Safety` sections.
macro_rules! register {
    (
        $v:ty, features: $features:literal, lanes: $lanes:literal, zero: $zero:ident,
        splat: $splat:ident, loadu: $loadu:ident, add: $add:ident, add_i16: $add_i16:ident,
        storeu: $storeu:ident,
        maddubs: $maddubs:ident, madd: $madd:ident, set1_i16: $set1_i16:ident,
        store_first: |$p:ident, $x:ident, $count:ident| $store_first:expr
    ) => {
        impl Register for $v {
            const LANES: usize = $lanes;
            /// # Safety
            #[doc = concat!("The CPU runs ", $features, " (checked with")]
            /// `is_x86_feature_detected!`).
            #[inline(always)]
            unsafe fn zero() -> $v {
                // SAFETY: the caller guarantees that the CPU runs this width's instruction
                // set, the only requirement of the intrinsic.
                unsafe { $zero() }
            }
            /// # Safety
            #[doc = concat!("The CPU runs ", $features, " (checked with")]
            /// `is_x86_feature_detected!`).
            #[inline(always)]
            unsafe fn splat(x: i32) -> $v {
                // SAFETY: the caller guarantees that the CPU runs this width's instruction
                // set, the only requirement of the intrinsic.
                unsafe { $splat(x) }
            }
            /// # Safety
            #[doc = concat!("The CPU runs ", $features, ", and `p` points to")]
            /// `4 · LANES` readable bytes (any alignment).
            #[inline(always)]
            unsafe fn load(p: *const u8) -> $v {
                // SAFETY: the caller guarantees the instruction set and that `p` points to
                // `4 · LANES` readable bytes, one register; `loadu` takes any alignment.
                unsafe { $loadu(p as *const $v) }
            }
            /// # Safety
            #[doc = concat!("The CPU runs ", $features, ", and `p` points to")]
            /// `LANES` readable `i32`s (any alignment).
            #[inline(always)]
            unsafe fn load_i32(p: *const i32) -> $v {
                // SAFETY: the caller guarantees the instruction set and that `p` points to
                // `LANES` readable `i32`s, one register; `loadu` takes any alignment.
                unsafe { $loadu(p as *const $v) }
            }
            /// # Safety
            #[doc = concat!("The CPU runs ", $features, " (checked with")]
            /// `is_x86_feature_detected!`).
            #[inline(always)]
            unsafe fn add(a: $v, b: $v) -> $v {
                // SAFETY: the caller guarantees that the CPU runs this width's instruction
                // set, the only requirement of the intrinsic.
                unsafe { $add(a, b) }
            }
            /// # Safety
            #[doc = concat!("The CPU runs ", $features, " (checked with")]
            /// `is_x86_feature_detected!`).
            #[inline(always)]
            unsafe fn add_i16(a: $v, b: $v) -> $v {
                // SAFETY: the caller guarantees that the CPU runs this width's instruction
                // set, the only requirement of the intrinsic.
                unsafe { $add_i16(a, b) }
            }
            /// # Safety
            #[doc = concat!("The CPU runs ", $features, ", and `p` points to")]
            /// `LANES` writable `i32`s (any alignment).
            #[inline(always)]
            unsafe fn store(p: *mut i32, v: $v) {
                // SAFETY: the caller guarantees the instruction set and that `p` points to
                // `LANES` writable `i32`s, one register; `storeu` takes any alignment.
                unsafe { $storeu(p as *mut $v, v) }
            }
            /// # Safety
            #[doc = concat!("The CPU runs ", $features, ", and `p` points to")]
            /// `count.min(LANES)` writable `i32`s (any alignment).
            #[inline(always)]
            unsafe fn store_first($p: *mut i32, $x: $v, $count: usize) {
                // SAFETY: the caller guarantees the instruction set and that `p` points to
                // `count.min(LANES)` writable `i32`s; the store writes no more than those
                // (a copy of `count.min(LANES)` lanes, or a store masked to them).
                unsafe { $store_first }
            }
            /// # Safety
            #[doc = concat!("The CPU runs ", $features, " (checked with")]
            /// `is_x86_feature_detected!`).
            #[inline(always)]
            unsafe fn maddubs(a: $v, w: $v) -> $v {
                // SAFETY: the caller guarantees that the CPU runs this width's instruction
                // set, the only requirement of the intrinsic.
                unsafe { $maddubs(a, w) }
            }
            /// # Safety
            #[doc = concat!("The CPU runs ", $features, " (checked with")]
            /// `is_x86_feature_detected!`).
            #[inline(always)]
            unsafe fn madd(a: $v, w: $v) -> $v {
                // SAFETY: the caller guarantees that the CPU runs this width's instruction
                // set, the only requirement of the intrinsic.
                unsafe { $madd(a, w) }
            }
            /// # Safety
            #[doc = concat!("The CPU runs ", $features, " (checked with")]
            /// `is_x86_feature_detected!`).
            #[inline(always)]
            unsafe fn ones_i16() -> $v {
                // SAFETY: the caller guarantees that the CPU runs this width's instruction
                // set, the only requirement of the intrinsic.
                unsafe { $set1_i16(1) }
            }
        }
    };
}

register!(
    __m256i,
    features: "AVX2",
    lanes: 8,
    zero: _mm256_setzero_si256,
    splat: _mm256_set1_epi32,
    loadu: _mm256_loadu_si256,
    add: _mm256_add_epi32,
    add_i16: _mm256_add_epi16,
    storeu: _mm256_storeu_si256,
    maddubs: _mm256_maddubs_epi16,
    madd: _mm256_madd_epi16,
    set1_i16: _mm256_set1_epi16,
    store_first: |p, v, count| {
        let mut lanes = [0i32; 8];
        _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, v);
        std::ptr::copy_nonoverlapping(lanes.as_ptr(), p, count.min(8));
    }
);
register!(
    __m512i,
    features: "AVX-512 F and BW",
    lanes: 16,
    zero: _mm512_setzero_si512,
    splat: _mm512_set1_epi32,
    loadu: _mm512_loadu_si512,
    add: _mm512_add_epi32,
    add_i16: _mm512_add_epi16,
    storeu: _mm512_storeu_si512,
    maddubs: _mm512_maddubs_epi16,
    madd: _mm512_madd_epi16,
    set1_i16: _mm512_set1_epi16,
    store_first: |p, v, count| {
        let mask = ((1u32 << count.min(16)) - 1) as __mmask16;
        _mm512_mask_storeu_epi32(p, mask, v)
    }
);

/// One vector instruction set with one dot-product form.
trait Simd {
    type V: Register;
    /// `i32` lanes per register: output channels per panel.
    const LANES: usize = <Self::V as Register>::LANES;
    /// `acc` plus, in each lane, the dot product of the activations' and the weights' group.
    ///
    /// # Safety
    /// The CPU runs this instruction set (the implementing type's doc names it; checked with
    /// `is_x86_feature_detected!`).
    unsafe fn dot(acc: Self::V, a: Self::V, w: Self::V) -> Self::V;
    /// Whether `dot` sums into narrower lanes that [`Simd::widen`] turns into `i32` sums, at
    /// most [`Tile::chunk`] groups at a time.
    const WIDENS: bool = false;
    /// The `i32` sums of what `dot` summed (the identity where it sums `i32`s).
    ///
    /// # Safety
    /// As [`Simd::dot`].
    #[inline(always)]
    unsafe fn widen(acc: Self::V) -> Self::V {
        acc
    }
}

/// AVX2 or AVX-512 BW, weights within ±64: `vpmaddubsw` (exact: `2 · 255 · 64 < 2^15`), then
/// `vpmaddwd` by ones into `i32`.
struct Quads<V>(PhantomData<V>);

impl<V: Register> Simd for Quads<V> {
    type V = V;
    /// # Safety
    /// The CPU runs `V`'s instruction set: AVX2 for `__m256i`, AVX-512 F and BW for
    /// `__m512i`.
    #[inline(always)]
    unsafe fn dot(acc: V, a: V, w: V) -> V {
        // SAFETY: the caller guarantees `V`'s instruction set, all that these `Register`
        // operations (no memory access) require.
        unsafe { V::add(acc, V::madd(V::maddubs(a, w), V::ones_i16())) }
    }
}

/// [`Quads`] with the pair sums of `vpmaddubsw` added in `i16` lanes, one instruction per
/// group where `Quads` takes three, and widened into `i32` by one `vpmaddwd` per
/// [`Tile::chunk`] groups: exact where a chunk's sums cannot leave `i16` (see
/// [`i16_chunk`]), which narrow grids allow (4-bit codes and weights: over 150 groups).
struct Quads16<V>(PhantomData<V>);

impl<V: Register> Simd for Quads16<V> {
    type V = V;
    const WIDENS: bool = true;
    /// # Safety
    /// The CPU runs `V`'s instruction set: AVX2 for `__m256i`, AVX-512 F and BW for
    /// `__m512i`.
    #[inline(always)]
    unsafe fn dot(acc: V, a: V, w: V) -> V {
        // SAFETY: the caller guarantees `V`'s instruction set, all that these `Register`
        // operations (no memory access) require.
        unsafe { V::add_i16(acc, V::maddubs(a, w)) }
    }
    /// # Safety
    /// As [`Simd::dot`].
    #[inline(always)]
    unsafe fn widen(acc: V) -> V {
        // SAFETY: the caller guarantees `V`'s instruction set, all that these `Register`
        // operations (no memory access) require.
        unsafe { V::madd(acc, V::ones_i16()) }
    }
}

/// AVX2 or AVX-512 BW, `i16` weights and activations: `vpmaddwd`.
struct Pairs<V>(PhantomData<V>);

impl<V: Register> Simd for Pairs<V> {
    type V = V;
    /// # Safety
    /// The CPU runs `V`'s instruction set: AVX2 for `__m256i`, AVX-512 F and BW for
    /// `__m512i`.
    #[inline(always)]
    unsafe fn dot(acc: V, a: V, w: V) -> V {
        // SAFETY: the caller guarantees `V`'s instruction set, all that these `Register`
        // operations (no memory access) require.
        unsafe { V::add(acc, V::madd(a, w)) }
    }
}

/// Dot-product forms of one instruction (`acc` plus the dot products, in one).
macro_rules! fused {
    ($($(#[$doc:meta])* $name:ident: $v:ty = $dot:ident;)*) => {$(
        $(#[$doc])*
        struct $name;
        impl Simd for $name {
            type V = $v;
            /// # Safety
            #[doc = concat!("The CPU runs the instruction set of `", stringify!($dot), "`")]
            /// (see the type's doc).
            #[inline(always)]
            unsafe fn dot(acc: $v, a: $v, w: $v) -> $v {
                // SAFETY: the caller guarantees the intrinsic's instruction set, its only
                // requirement (it takes no pointers).
                unsafe { $dot(acc, a, w) }
            }
        }
    )*};
}

fused! {
    /// AVX-VNNI, `i8` weights: `vpdpbusd`.
    AvxVnniQuads: __m256i = _mm256_dpbusd_avx_epi32;
    /// AVX-VNNI, `i16` weights and activations: `vpdpwssd`.
    AvxVnniPairs: __m256i = _mm256_dpwssd_avx_epi32;
    /// AVX-512 VNNI, `i8` weights: `vpdpbusd`.
    Vnni512Quads: __m512i = _mm512_dpbusd_epi32;
    /// AVX-512 VNNI, `i16` weights and activations: `vpdpwssd`.
    Vnni512Pairs: __m512i = _mm512_dpwssd_epi32;
}

/// Where the rows of a tile's activations start, in bytes from [`Tile::a`].
#[derive(Clone, Copy)]
enum RowStarts {
    /// Row `r` at `r · stride`.
    Strided(usize),
    /// Row `r` at `table[r]` (a convolution's windows read where they lie, see
    /// [`run_windows`]).
    Table(*const u32),
}

/// Where one tile reads and writes.
struct Tile {
    /// The activations: row `r` starts at `a` plus its [`RowStarts`] entry and holds
    /// `segments` runs of `run` groups (4 bytes each, read unaligned), `segment_stride` bytes
    /// apart (a matrix's row: one run of all its groups; a convolution's window: one run per
    /// kernel row).
    a: *const u8,
    starts: RowStarts,
    segments: usize,
    run: usize,
    segment_stride: usize,
    /// The tile's first weight panel.
    w: *const u8,
    panel_bytes: usize,
    /// Per-channel constants (bias minus the zero point's share) of the first panel.
    columns: *const i32,
    /// The tile's first output.
    out: *mut i32,
    out_stride: usize,
    /// Output channels the tile writes (the last panel may be partly padding).
    cols: usize,
    /// Groups summed before each widening, where the form widens ([`Simd::WIDENS`]).
    chunk: usize,
}

/// `acc` plus the dot products of groups `groups` of run `segment` by [`Simd::dot`] (taken
/// and returned by value, so that they stay in registers).
///
/// # Safety
/// As [`tile`], and `segment < t.segments`, `groups` within `0..t.run`.
#[inline(always)]
unsafe fn accumulate<S: Simd, const R: usize, const B: usize>(
    t: &Tile,
    mut acc: [[S::V; B]; R],
    segment: usize,
    groups: std::ops::Range<usize>,
) -> [[S::V; B]; R] {
    // SAFETY: the caller guarantees that the CPU runs `S`.
    let zero = unsafe { S::V::zero() };
    let rows: [*const u8; R] = std::array::from_fn(|r| {
        let start = match t.starts {
            RowStarts::Strided(stride) => r * stride,
            // SAFETY: the table holds a start for each of the tile's `R` rows.
            RowStarts::Table(table) => unsafe { *table.add(r) as usize },
        };
        // SAFETY: row `r < R` starts at `start`, and its run `segment < t.segments` lies
        // `segment · segment_stride` bytes further, inside the activations (the caller's
        // guarantee); `wrapping_add` would do as well, nothing is read here.
        unsafe { t.a.add(start + segment * t.segment_stride) }
    });
    // SAFETY: run `segment`'s weight groups start at group `segment · run` of every panel,
    // below the panel's `segments · run` groups.
    let w0 = unsafe { t.w.add(segment * t.run * S::LANES * 4) };
    for g in groups {
        let mut w = [zero; B];
        for (b, w) in w.iter_mut().enumerate() {
            // SAFETY: the CPU runs `S` (the caller's guarantee). A panel is `t.groups` groups
            // of `4 · LANES` bytes, and `t.w` addresses `B` of them: group
            // `segment · run + g < segments · run` of panel `b < B` lies inside.
            *w = unsafe { S::V::load(w0.add(b * t.panel_bytes + g * S::LANES * 4)) };
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            // SAFETY: the CPU runs `S`; row `r < R`'s run `segment` holds `t.run` groups of 4
            // bytes from `rows[r]` (the caller's guarantee), read unaligned, and `g < t.run`.
            let group = unsafe { (rows[r].add(g * 4) as *const i32).read_unaligned() };
            // SAFETY: the CPU runs `S`; no memory is accessed.
            let a = unsafe { S::V::splat(group) };
            for (acc, w) in acc.iter_mut().zip(&w) {
                // SAFETY: the CPU runs `S` (the caller's guarantee); no memory is accessed.
                *acc = unsafe { S::dot(*acc, a, *w) };
            }
        }
    }
    acc
}

/// `R` rows × `B` panels of outputs.
///
/// # Safety
/// The CPU runs `S`; `t` addresses `R` rows of activations (as [`Tile`] describes them, with
/// `R` entries in a table of starts), `B` panels of weights, `B · LANES` constants and `R` rows
/// of `cols` outputs.
#[inline(always)]
unsafe fn tile<S: Simd, const R: usize, const B: usize>(t: &Tile) {
    // SAFETY: the caller guarantees that the CPU runs `S`.
    let zero = unsafe { S::V::zero() };
    let mut acc = [[zero; B]; R];
    for segment in 0..t.segments {
        if S::WIDENS {
            let mut first = 0;
            while first < t.run {
                let end = t.run.min(first.saturating_add(t.chunk.max(1)));
                // SAFETY: the caller's guarantees, for groups `first..end` within the run.
                let part = unsafe { accumulate::<S, R, B>(t, [[zero; B]; R], segment, first..end) };
                for r in 0..R {
                    for b in 0..B {
                        // SAFETY: the CPU runs `S` (the caller's guarantee); no memory is
                        // accessed.
                        acc[r][b] = unsafe { S::V::add(acc[r][b], S::widen(part[r][b])) };
                    }
                }
                first = end;
            }
        } else {
            // SAFETY: the caller's guarantees, for the run's `t.run` groups.
            acc = unsafe { accumulate::<S, R, B>(t, acc, segment, 0..t.run) };
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (b, acc) in acc.iter().enumerate() {
            let first = b * S::LANES;
            if first >= t.cols {
                break;
            }
            // SAFETY: the CPU runs `S`; `t.columns` addresses `B · LANES` constants, and
            // `first + LANES <= B · LANES` since `b < B`.
            let v = unsafe { S::V::add(*acc, S::V::load_i32(t.columns.add(first))) };
            // SAFETY: `t.out` addresses `R` rows, `out_stride` apart, of `cols` outputs, and
            // `r < R`, `first < cols`: the offset stays inside row `r`.
            let out = unsafe { t.out.add(r * t.out_stride + first) };
            if first + S::LANES <= t.cols {
                // SAFETY: the CPU runs `S`; outputs `first..first + LANES` of the row are
                // within its `cols`.
                unsafe { S::V::store(out, v) };
            } else {
                // SAFETY: the CPU runs `S`; the `cols - first` (< `LANES`) outputs from
                // `first` are the rest of the row's `cols`.
                unsafe { S::V::store_first(out, v, t.cols - first) };
            }
        }
    }
}

/// [`tile`] for `rows` (at most `MR`) rows and `panels` (1 or `NB`) panels.
///
/// # Safety
/// The CPU runs `S`; `t` addresses what [`tile`] reads and writes for `rows` rows and
/// `panels` panels (a tile of 1 panel, chosen for any `panels` other than `NB`, reads and
/// writes only the first).
#[inline(always)]
unsafe fn dispatch<S: Simd, const MR: usize, const NB: usize>(
    rows: usize,
    panels: usize,
    t: &Tile,
) {
    macro_rules! by_rows {
        ($b:expr) => {
            // SAFETY: the caller guarantees `S` and that `t` covers `rows` rows and
            // `panels` panels; each arm runs a tile of exactly `rows` rows and of `NB`
            // panels when `panels == NB`, else of 1 (other row counts panic).
            unsafe {
                match rows {
                    1 => tile::<S, 1, $b>(t),
                    2 => tile::<S, 2, $b>(t),
                    3 => tile::<S, 3, $b>(t),
                    4 => tile::<S, 4, $b>(t),
                    5 if MR >= 5 => tile::<S, 5, $b>(t),
                    6 if MR >= 6 => tile::<S, 6, $b>(t),
                    7 if MR >= 7 => tile::<S, 7, $b>(t),
                    8 if MR >= 8 => tile::<S, 8, $b>(t),
                    _ => unreachable!("tiles have at most {MR} rows"),
                }
            }
        };
    }
    if panels == NB {
        by_rows!(NB)
    } else {
        by_rows!(1)
    }
}

/// Groups of one row of activations, zero-padded to whole groups: 4 bytes (`Quads`) or 2
/// bytes widened to `i16` (`Pairs`) per `i32`.
///
/// The whole groups go through `chunks_exact`, which the compiler turns into vector
/// widening (a scalar loop here took 40% of the AVX2 pair form's time on 8-bit convolutions).
#[inline(always)]
fn pack_row(a: &[u8], form: Form, out: &mut [i32]) {
    let group = form.group();
    let whole = a.len() - a.len() % group;
    let (groups, rest) = a.split_at(whole);
    match form {
        Form::Pairs => {
            for (g, pair) in out.iter_mut().zip(groups.chunks_exact(2)) {
                *g = pair[0] as i32 | (pair[1] as i32) << 16;
            }
        }
        _ => {
            for (g, quad) in out.iter_mut().zip(groups.chunks_exact(4)) {
                *g = i32::from_le_bytes([quad[0], quad[1], quad[2], quad[3]]);
            }
        }
    }
    if let Some(g) = out.get_mut(whole / group).filter(|_| !rest.is_empty()) {
        let mut bytes = [0u8; 4];
        for (i, x) in rest.iter().enumerate() {
            // Pairs hold each code in the low byte of its `i16`.
            bytes[i * (4 / group)] = *x;
        }
        *g = i32::from_le_bytes(bytes);
    }
}

/// `rows` rows of tiles from the template `t` (whose `a` and `out` address the first row),
/// `MR` rows × `NB` panels at a time over its `cols` outputs.
///
/// # Safety
/// The CPU runs `S`; `t` addresses `rows` rows of activations (as [`Tile`] describes them,
/// with `rows` entries in a table of starts), `cols.div_ceil(LANES)` weight panels and as many
/// panels of constants, and `rows` rows of `cols` outputs (`out_stride` apart).
#[inline(always)]
unsafe fn tiles<S: Simd, const MR: usize, const NB: usize>(t: &Tile, rows: usize) {
    let panels = t.cols.div_ceil(S::LANES);
    let mut r0 = 0;
    while r0 < rows {
        let mr = (rows - r0).min(MR);
        let mut p = 0;
        while p < panels {
            let nb = (panels - p).min(NB);
            // SAFETY: `r0 < rows` and `p < panels`, so the offsets stay inside what the
            // caller guarantees: row `r0` of the activations and of the outputs, panel `p` of
            // the weights and constant `p · LANES` (one per packed channel).
            let sub = unsafe {
                Tile {
                    a: match t.starts {
                        RowStarts::Strided(stride) => t.a.add(r0 * stride),
                        RowStarts::Table(_) => t.a,
                    },
                    starts: match t.starts {
                        RowStarts::Table(table) => RowStarts::Table(table.add(r0)),
                        strided => strided,
                    },
                    w: t.w.add(p * t.panel_bytes),
                    columns: t.columns.add(p * S::LANES),
                    out: t.out.add(r0 * t.out_stride + p * S::LANES),
                    cols: (t.cols - p * S::LANES).min(nb * S::LANES),
                    ..*t
                }
            };
            // SAFETY: the caller guarantees `S`; `sub` covers `mr <= MR` rows and panels
            // `p..p + nb` (`nb <= NB`), within what the caller guarantees for `t`.
            unsafe { dispatch::<S, MR, NB>(mr, nb, &sub) };
            p += nb;
        }
        r0 += mr;
    }
}

/// `rows` rows of the product on `S` with tiles of up to `MR` rows × `NB` panels, `chunk`
/// groups summed before each widening where `S` widens.
///
/// # Safety
/// The CPU runs `S`, and `w` is packed for it (`w.lanes() == S::LANES`); `a` holds `rows`
/// rows of `w.k()` codes, `out` `rows · w.n()` outputs, `columns` one constant per packed
/// output channel.
#[inline(always)]
unsafe fn run<S: Simd, const MR: usize, const NB: usize>(
    a: &[u8],
    rows: usize,
    w: &PackedMatrix,
    columns: &[i32],
    out: &mut [i32],
    chunk: usize,
) {
    let (n, k, groups) = (w.n(), w.k(), w.groups());
    debug_assert_eq!(w.lanes(), S::LANES);
    debug_assert!(columns.len() >= n.div_ceil(S::LANES) * S::LANES && a.len() >= rows * k);
    debug_assert!(out.len() >= rows * n);
    let template = Tile {
        a: a.as_ptr(),
        starts: RowStarts::Strided(k),
        segments: 1,
        run: groups,
        segment_stride: 0,
        w: w.packed_bytes(),
        panel_bytes: w.panel_bytes(),
        columns: columns.as_ptr(),
        out: out.as_mut_ptr(),
        out_stride: n,
        cols: n,
        chunk,
    };
    // Whole groups of bytes are read where they lie; anything else is packed a tile of rows
    // at a time (a fan-in packed as runs, run by run).
    if w.form() == Form::Quads && k % 4 == 0 && w.runs().is_none() {
        // SAFETY: the caller guarantees `S` and the lengths: `a` holds `rows` rows of
        // `k = 4 · groups` bytes, read in place; `w`, `columns` and `out` as `tiles` needs.
        unsafe { tiles::<S, MR, NB>(&template, rows) };
        return;
    }
    let mut packed = vec![0i32; MR * groups];
    let mut r0 = 0;
    while r0 < rows {
        let mr = (rows - r0).min(MR);
        for (r, row) in packed.chunks_mut(groups.max(1)).take(mr).enumerate() {
            let codes = &a[(r0 + r) * k..(r0 + r + 1) * k];
            match w.runs() {
                None => pack_row(codes, w.form(), row),
                Some(runs) => {
                    for (codes, row) in codes.chunks(runs.codes).zip(row.chunks_mut(runs.groups)) {
                        pack_row(codes, w.form(), row);
                    }
                }
            }
        }
        // SAFETY: `r0 < rows`: output row `r0` lies inside `out`.
        let out = unsafe { out.as_mut_ptr().add(r0 * n) };
        let t = Tile {
            a: packed.as_ptr() as *const u8,
            starts: RowStarts::Strided(groups * 4),
            out,
            ..template
        };
        // SAFETY: the caller guarantees `S`; `t` covers the `mr` rows packed into `packed`
        // (`MR · groups` long), all of `w`'s panels and `columns`, and rows `r0..r0 + mr` of
        // `out`.
        unsafe { tiles::<S, MR, NB>(&t, mr) };
        r0 += mr;
    }
}

/// What an entry runs: a product on packed weights, or tiles over operands that the caller
/// laid out itself ([`run_quads`]).
enum Job<'a> {
    Gemm {
        a: &'a [u8],
        rows: usize,
        w: &'a PackedMatrix,
        columns: &'a [i32],
        out: &'a mut [i32],
    },
    Tiles {
        template: &'a Tile,
        rows: usize,
    },
}

/// One `#[target_feature]` entry: [`run`] or [`tiles`] on `$simd` with tiles of `$mr` rows ×
/// 2 panels.
macro_rules! entry {
    ($name:ident, $features:literal, $simd:ty, $mr:literal) => {
        #[doc = concat!("[`run`] or [`tiles`] on `", stringify!($simd), "`, compiled for ")]
        #[doc = concat!($features, ".")]
        ///
        /// # Safety
        #[doc = concat!("The CPU supports ", $features, " (checked with")]
        /// `is_x86_feature_detected!`),
        /// and the weights are packed for this entry's register width and form; the buffers
        /// are as long as [`run`] or [`tiles`] requires; where the form widens, no `chunk`
        /// groups of products leave its narrow lanes (see [`i16_chunk`]).
        #[target_feature(enable = $features)]
        unsafe fn $name(job: Job<'_>, chunk: usize) {
            // SAFETY: the caller guarantees the CPU features enabled here, which include
            // the instruction set of the tiles' intrinsics, and the other requirements of
            // `run` and `tiles` (packing and lengths).
            unsafe {
                match job {
                    Job::Gemm {
                        a,
                        rows,
                        w,
                        columns,
                        out,
                    } => run::<$simd, $mr, 2>(a, rows, w, columns, out, chunk),
                    Job::Tiles { template, rows } => {
                        tiles::<$simd, $mr, 2>(&Tile { chunk, ..*template }, rows)
                    }
                }
            }
        }
    };
}

entry!(avx2_quads, "avx2", Quads<__m256i>, 4);
entry!(avx2_quads16, "avx2", Quads16<__m256i>, 4);
entry!(avx2_pairs, "avx2", Pairs<__m256i>, 4);
entry!(avxvnni_quads, "avx2,avxvnni", AvxVnniQuads, 6);
entry!(avxvnni_pairs, "avx2,avxvnni", AvxVnniPairs, 6);
entry!(avx512_quads, "avx512f,avx512bw", Quads<__m512i>, 8);
entry!(avx512_quads16, "avx512f,avx512bw", Quads16<__m512i>, 8);
entry!(avx512_pairs, "avx512f,avx512bw", Pairs<__m512i>, 8);
entry!(
    vnni512_quads,
    "avx512f,avx512bw,avx512vnni",
    Vnni512Quads,
    8
);
entry!(
    vnni512_pairs,
    "avx512f,avx512bw,avx512vnni",
    Vnni512Pairs,
    8
);

fused! {
    /// AVX-VNNI's `vpdpbusd` in its EVEX encoding (AVX-512 VNNI + VL).
    EvexQuads: __m256i = _mm256_dpbusd_epi32;
    /// AVX-VNNI's `vpdpwssd` in its EVEX encoding.
    EvexPairs: __m256i = _mm256_dpwssd_epi32;
}
entry!(evex_quads, "avx2,avx512f,avx512vl,avx512vnni", EvexQuads, 6);
entry!(evex_pairs, "avx2,avx512f,avx512vl,avx512vnni", EvexPairs, 6);

/// Not public API (re-exported in `quant_core::__internals`): [`gemm_u8`](super::gemm_u8)'s
/// product, `a` (`rows × k` codes with zero point `a_zero_point`) times `w` plus `bias`, on the
/// AVX-VNNI path's tiles (256-bit registers, 6-row tiles) with its two instructions in their
/// AVX-512 VL encoding. The tiles, packing and column sums are the AVX-VNNI path's, so
/// quant-core's tests check all of that path but the instruction encoding on AVX-512 VNNI
/// machines, which mostly lack AVX-VNNI. `w` must be packed for [`Isa::Avx2`] (8-lane panels in
/// the forms AVX-VNNI uses). `None`, with nothing written, where the CPU lacks AVX-512 VNNI + VL
/// or the lengths do not fit.
pub fn gemm_u8_on_avx_vnni_tiles_in_evex(
    a: &[u8],
    rows: usize,
    a_zero_point: i32,
    w: &PackedMatrix,
    bias: &[i32],
    out: &mut [i32],
) -> Option<()> {
    use std::arch::is_x86_feature_detected as has;
    let cpu = has!("avx2") && has!("avx512f") && has!("avx512vl") && has!("avx512vnni");
    let (n, k) = (w.n(), w.k());
    let fits = a.len() == rows.checked_mul(k)?
        && out.len() == rows.checked_mul(n)?
        && bias.len() == n
        && w.isa() == Isa::Avx2;
    if !(cpu && fits) {
        return None;
    }
    let columns = super::gemm::zero_point_columns(w, a_zero_point, bias);
    let job = Job::Gemm {
        a,
        rows,
        w,
        columns: &columns,
        out,
    };
    // SAFETY: the CPU runs AVX2 and AVX-512 VNNI + VL (checked above); `w` is packed in 8-lane
    // panels (`Isa::Avx2`), and `a`, `columns` (whole panels) and `out` are as long as `run`
    // requires (checked above).
    unsafe {
        match w.form() {
            Form::Quads => evex_quads(job, usize::MAX),
            _ => evex_pairs(job, usize::MAX),
        }
    }
    Some(())
}

/// How many groups of `vpmaddubsw` pair sums of activations `a` and weights of largest
/// magnitude `max_abs` an `i16` lane can add up without leaving `i16`: each pair sum is within
/// `±2 · max(a) · max_abs`. `None` below 2 (no gain over widening every group).
pub(super) fn i16_chunk(a: &[u8], max_abs: u32) -> Option<usize> {
    let top = a.iter().fold(0u8, |top, a| top.max(*a));
    let pair = 2 * top as usize * max_abs as usize;
    let chunk = (i16::MAX as usize).checked_div(pair).unwrap_or(usize::MAX);
    (chunk >= 2).then_some(chunk)
}

/// Runs `job` on the entry for `isa` and `form`, summing `chunk` groups in `i16` lanes where
/// it is given and the path has no VNNI.
///
/// # Safety
/// The CPU runs `isa` (not [`Isa::Portable`]); the job's weights are packed for `isa` in
/// `form` and its buffers are as long as [`run`] or [`tiles`] requires; a `chunk` is one
/// [`i16_chunk`] allows for the job's activations and weights.
unsafe fn run_job(isa: Isa, form: Form, chunk: Option<usize>, job: Job<'_>) {
    // SAFETY: the caller's guarantees, which are each entry's.
    unsafe {
        match (isa, form, chunk) {
            (Isa::Avx2, Form::Quads, Some(c)) => avx2_quads16(job, c),
            (Isa::Avx2, Form::Quads, None) => avx2_quads(job, 0),
            (Isa::Avx2, _, _) => avx2_pairs(job, 0),
            (Isa::AvxVnni, Form::Quads, _) => avxvnni_quads(job, 0),
            (Isa::AvxVnni, _, _) => avxvnni_pairs(job, 0),
            (Isa::Avx512Bw, Form::Quads, Some(c)) => avx512_quads16(job, c),
            (Isa::Avx512Bw, Form::Quads, None) => avx512_quads(job, 0),
            (Isa::Avx512Bw, _, _) => avx512_pairs(job, 0),
            (Isa::Avx512Vnni, Form::Quads, _) => vnni512_quads(job, 0),
            (Isa::Avx512Vnni, _, _) => vnni512_pairs(job, 0),
            (Isa::Portable, _, _) => unreachable!("the portable path has its own kernel"),
        }
    }
}

/// `rows` rows of the product on the path `w` is packed for (not [`Isa::Portable`]).
pub(super) fn run_rows(a: &[u8], rows: usize, w: &PackedMatrix, columns: &[i32], out: &mut [i32]) {
    // Where the pair sums of `vpmaddubsw` may be summed in `i16` (narrow grids), they are.
    let chunk = match (w.isa(), w.form()) {
        (Isa::Avx2 | Isa::Avx512Bw, Form::Quads) => i16_chunk(a, w.max_abs()),
        _ => None,
    };
    let job = Job::Gemm {
        a,
        rows,
        w,
        columns,
        out,
    };
    // SAFETY: `PackedMatrix::with_isa` checked that this CPU runs `w.isa()` and packed `w` for
    // it; `gemm_u8` checked the lengths of `a` and `out` and padded `columns` to whole panels;
    // `i16_chunk` gives the widening forms their chunk.
    unsafe { run_job(w.isa(), w.form(), chunk, job) }
}

/// The `i32` lanes of the quads form's panels on `isa`: output channels per panel.
pub(super) fn quads_lanes(isa: Isa) -> usize {
    match isa {
        Isa::Avx512Bw | Isa::Avx512Vnni => 16,
        _ => 8,
    }
}

/// Operands that a caller laid out for the tiles itself (attention's products, whose weights
/// change with every sample): `rows` rows of `groups` groups of 4 activation codes, the rows
/// `a_stride` bytes apart; weights in panels of [`quads_lanes`] output channels, each holding,
/// for every group, 4 `i8` codes (stored as their bytes) per channel
/// (`[panel][group][lane][position]`); one constant
/// per packed channel, added to its outputs; `rows` rows of `cols` outputs, `out_stride`
/// apart.
pub(super) struct QuadsOperands<'a> {
    pub a: &'a [u8],
    pub a_stride: usize,
    pub rows: usize,
    pub groups: usize,
    pub w: &'a [u8],
    pub columns: &'a [i32],
    pub out: &'a mut [i32],
    pub out_stride: usize,
    pub cols: usize,
}

/// `out[r][o] = columns[o] + Σ a[r][i] · w[o][i]` over the laid-out operands, on `isa`'s
/// tiles, exact (wrapping `i32`) where the weights suit the path: within `i8` with VNNI,
/// within ±64 without, and `chunk` (if given, without VNNI) one that [`i16_chunk`] allows.
///
/// # Panics
/// Where `isa` is the portable path or this CPU cannot run it, or a buffer is shorter than
/// the operands' sizes say (the caller's layout, not user input).
pub(super) fn run_quads(isa: Isa, chunk: Option<usize>, o: QuadsOperands<'_>) {
    let lanes = quads_lanes(isa);
    let panels = o.cols.div_ceil(lanes);
    assert!(
        isa != Isa::Portable && isa.is_available(),
        "{isa} cannot run here"
    );
    assert!(o.out_stride >= o.cols);
    assert!(o.w.len() >= panels * o.groups * lanes * 4 && o.columns.len() >= panels * lanes);
    if o.rows == 0 || o.cols == 0 {
        return;
    }
    assert!(o.a.len() >= (o.rows - 1) * o.a_stride + 4 * o.groups);
    assert!(o.out.len() >= (o.rows - 1) * o.out_stride + o.cols);
    let template = Tile {
        a: o.a.as_ptr(),
        starts: RowStarts::Strided(o.a_stride),
        segments: 1,
        run: o.groups,
        segment_stride: 0,
        w: o.w.as_ptr(),
        panel_bytes: o.groups * lanes * 4,
        columns: o.columns.as_ptr(),
        out: o.out.as_mut_ptr(),
        out_stride: o.out_stride,
        cols: o.cols,
        chunk: 0,
    };
    let job = Job::Tiles {
        template: &template,
        rows: o.rows,
    };
    // SAFETY: this CPU runs `isa` (checked above); the weights are packed in `isa`'s quads
    // panels (the caller's layout) and every buffer is as long as `tiles` reads or writes
    // (checked above); the caller gives a chunk `i16_chunk` allows.
    unsafe { run_job(isa, Form::Quads, chunk, job) }
}

/// A convolution's operands for [`run_windows`]: `source` holds the (possibly padded)
/// input, whose output row `r` (one window) starts at byte `starts[r]` and holds `segments`
/// runs (its kernel rows) of `run` groups of 4 bytes, `segment_stride` bytes apart, in the
/// weights' form (`u8` codes for quads, `u16` for pairs); `columns` holds one constant per
/// packed channel of `w`; `out` `starts.len()` rows of `w.n()` outputs.
pub(super) struct WindowOperands<'a> {
    pub source: &'a [u8],
    pub starts: &'a [u32],
    pub segments: usize,
    pub run: usize,
    pub segment_stride: usize,
    pub w: &'a PackedMatrix,
    pub columns: &'a [i32],
    pub out: &'a mut [i32],
}

/// `out[r][o] = columns[o] + Σ window(r) · w[o]` on the path `w` is packed for, reading each
/// window where it lies rather than from an im2col copy; `chunk` (if given) one that
/// [`i16_chunk`] allows for `source` and `w`.
///
/// # Panics
/// Where `w` is packed for the portable path or in neither group form, or a buffer is shorter
/// than the operands' sizes say (the caller's layout, not user input).
pub(super) fn run_windows(chunk: Option<usize>, o: WindowOperands<'_>) {
    let (n, w) = (o.w.n(), o.w);
    assert!(w.isa() != Isa::Portable && matches!(w.form(), Form::Quads | Form::Pairs));
    assert_eq!(
        o.segments * o.run,
        w.groups(),
        "the windows' groups are the weights'"
    );
    assert!(o.columns.len() >= n.div_ceil(w.lanes()) * w.lanes());
    assert_eq!(o.out.len(), o.starts.len() * n);
    let Some(last) = o.starts.iter().max() else {
        return;
    };
    if o.segments > 0 {
        let end = *last as usize + (o.segments - 1) * o.segment_stride + o.run * 4;
        assert!(end <= o.source.len(), "a window reads past the source");
    }
    let template = Tile {
        a: o.source.as_ptr(),
        starts: RowStarts::Table(o.starts.as_ptr()),
        segments: o.segments,
        run: o.run,
        segment_stride: o.segment_stride,
        w: w.packed_bytes(),
        panel_bytes: w.panel_bytes(),
        columns: o.columns.as_ptr(),
        out: o.out.as_mut_ptr(),
        out_stride: n,
        cols: n,
        chunk: 0,
    };
    let job = Job::Tiles {
        template: &template,
        rows: o.starts.len(),
    };
    // SAFETY: `PackedMatrix::with_isa` checked that this CPU runs `w.isa()` and packed `w`
    // for it in the form named; every row's runs lie inside `source` (the largest start
    // checked above), `columns` covers whole panels and `out` one row per start (checked
    // above); the caller gives a chunk `i16_chunk` allows.
    unsafe { run_job(w.isa(), w.form(), chunk, job) }
}
