//! The element driver every kernel family runs on: how per-channel constants map onto a tensor
//! laid out as `[outer, channels, inner]` ([`Walk`]), how a call is cut into parallel jobs whose
//! boundaries depend only on the tensor's size (so sums do not depend on the number of
//! threads), and the run-time choice between AVX2 and baseline code.
//!
//! A kernel family is a type implementing [`ElementKernel`] over its buffers ([`Streams`]): what
//! it does to a span of elements sharing one set of constants, and to whole periods of short
//! rows with per-element constants. Element-wise maps implement the simpler [`Map`] once,
//! generic over where their constants come from ([`Constants`]).

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::params::Affine;
use super::PARALLEL_THRESHOLD;
use crate::quantizer::ChannelLayout;

/// Least number of elements in one parallel job (128 KiB of `f32` per stream).
pub(super) const PARALLEL_CHUNK: usize = 1 << 15;
/// Below this many elements per channel block, parameters are expanded per element so the
/// inner loop stays long enough to vectorise.
const SHORT_BLOCK: usize = 64;

// ---------------------------------------------------------------------------------------------
// Buffers and constants
// ---------------------------------------------------------------------------------------------

/// The element-aligned buffers of one kernel call (inputs `&[T]`, outputs `&mut [T]`, and
/// tuples of them), cut into jobs, rows and periods together.
pub(super) trait Streams: Sized + Send {
    /// Elements (the shortest buffer's length; the public functions check they agree).
    fn len(&self) -> usize;
    /// The first `mid` elements of every buffer, and the rest.
    fn split_at(self, mid: usize) -> (Self, Self);
    /// Consecutive pieces of `size` elements (the last may be shorter).
    fn chunks(self, size: usize) -> Chunks<Self> {
        Chunks {
            rest: Some(self),
            size: size.max(1),
        }
    }
}

impl<T: Sync> Streams for &[T] {
    #[inline(always)]
    fn len(&self) -> usize {
        <[T]>::len(self)
    }
    #[inline(always)]
    fn split_at(self, mid: usize) -> (Self, Self) {
        <[T]>::split_at(self, mid.min(<[T]>::len(self)))
    }
}

impl<T: Send> Streams for &mut [T] {
    #[inline(always)]
    fn len(&self) -> usize {
        <[T]>::len(self)
    }
    #[inline(always)]
    fn split_at(self, mid: usize) -> (Self, Self) {
        let mid = mid.min(<[T]>::len(self));
        <[T]>::split_at_mut(self, mid)
    }
}

impl<A: Streams, B: Streams> Streams for (A, B) {
    #[inline(always)]
    fn len(&self) -> usize {
        self.0.len().min(self.1.len())
    }
    #[inline(always)]
    fn split_at(self, mid: usize) -> (Self, Self) {
        let (a0, a1) = self.0.split_at(mid);
        let (b0, b1) = self.1.split_at(mid);
        ((a0, b0), (a1, b1))
    }
}

impl<A: Streams, B: Streams, C: Streams> Streams for (A, B, C) {
    #[inline(always)]
    fn len(&self) -> usize {
        self.0.len().min(self.1.len()).min(self.2.len())
    }
    #[inline(always)]
    fn split_at(self, mid: usize) -> (Self, Self) {
        let (a0, a1) = self.0.split_at(mid);
        let (b0, b1) = self.1.split_at(mid);
        let (c0, c1) = self.2.split_at(mid);
        ((a0, b0, c0), (a1, b1, c1))
    }
}

/// See [`Streams::chunks`].
pub(super) struct Chunks<S> {
    rest: Option<S>,
    size: usize,
}

impl<S: Streams> Iterator for Chunks<S> {
    type Item = S;
    #[inline(always)]
    fn next(&mut self) -> Option<S> {
        let s = self.rest.take()?;
        if s.len() == 0 {
            return None;
        }
        if s.len() <= self.size {
            return Some(s);
        }
        let (head, tail) = s.split_at(self.size);
        self.rest = Some(tail);
        Some(head)
    }
}

/// Where an element-wise result goes: into a caller's buffer (`T`), or into fresh storage
/// (`MaybeUninit<T>`, written once and never read, so an allocating function need not zero
/// its output first).
pub(super) trait Out<T = f32>: Send {
    fn set(&mut self, v: T);
}

impl<T: Send> Out<T> for T {
    #[inline(always)]
    fn set(&mut self, v: T) {
        *self = v;
    }
}

impl<T: Send> Out<T> for MaybeUninit<T> {
    #[inline(always)]
    fn set(&mut self, v: T) {
        self.write(v);
    }
}

/// Where a gradient goes: added into a caller's buffer (`f32`), or written into fresh storage
/// (`MaybeUninit<f32>`) as `0.0 + v`, bit for bit what zeroing it first and adding gives
/// (`-0.0` becomes `+0.0`).
pub(super) trait GradOut: Send {
    /// Whether the buffer holds values to add to (`false`: fresh storage, never read).
    const ACCUMULATE: bool;
    fn add(&mut self, v: f32);
    /// For an element that adds nothing (`add(0.0)` would turn a caller's `-0.0` into `+0.0`).
    fn add_nothing(&mut self);
}

impl GradOut for f32 {
    const ACCUMULATE: bool = true;
    #[inline(always)]
    fn add(&mut self, v: f32) {
        *self += v;
    }
    #[inline(always)]
    fn add_nothing(&mut self) {}
}

impl GradOut for MaybeUninit<f32> {
    const ACCUMULATE: bool = false;
    #[inline(always)]
    fn add(&mut self, v: f32) {
        self.write(0.0 + v);
    }
    #[inline(always)]
    fn add_nothing(&mut self) {
        self.write(0.0);
    }
}

/// A vector of `len` values that `fill` writes, without zeroing it first.
///
/// `fill` must write every element of the slice it is given whenever it returns `Ok` (the
/// drivers write each element of their output once); on `Err` the storage is dropped unread.
pub(super) fn uninit_vec<E>(
    len: usize,
    fill: impl FnOnce(&mut [MaybeUninit<f32>]) -> Result<(), E>,
) -> Result<Vec<f32>, E> {
    let mut v = Vec::with_capacity(len);
    fill(&mut v.spare_capacity_mut()[..len])?;
    // SAFETY: the capacity is at least `len`, and `fill` initialised elements `0..len` (its
    // contract above).
    unsafe { v.set_len(len) };
    Ok(v)
}

/// Where a kernel's constants come from: one set for a whole span ([`Affine`]), or one set per
/// element for periods of short rows ([`PerElement`]).
pub(super) trait Constants: Sized {
    /// The constants of the first `n` elements (which lets the compiler drop index checks).
    fn prefix(&self, n: usize) -> Self;
    /// The constants of element `i` of the prefix.
    fn at(&self, i: usize) -> Affine;
}

impl Constants for Affine {
    #[inline(always)]
    fn prefix(&self, _: usize) -> Self {
        *self
    }
    #[inline(always)]
    fn at(&self, _: usize) -> Affine {
        *self
    }
}

/// Per-element constants for one period (`channels * inner` elements) when rows are short.
pub(super) struct Expanded {
    pub inner: usize,
    scale: Vec<f32>,
    inv: Vec<f32>,
    lo: Vec<f32>,
    hi: Vec<f32>,
    zero_point: Vec<f32>,
    zero_point_i: Vec<i32>,
    /// Global, the same for every channel.
    quant_min: f32,
    quant_max: f32,
    /// The constants per channel.
    pub params: Vec<Affine>,
}

impl Expanded {
    fn new(params: &[Affine], inner: usize) -> Expanded {
        fn per<T: Copy>(params: &[Affine], inner: usize, f: fn(&Affine) -> T) -> Vec<T> {
            params
                .iter()
                .flat_map(|p| std::iter::repeat_n(f(p), inner))
                .collect()
        }
        Expanded {
            inner,
            scale: per(params, inner, |p| p.scale),
            inv: per(params, inner, |p| p.inv),
            lo: per(params, inner, |p| p.lo),
            hi: per(params, inner, |p| p.hi),
            zero_point: per(params, inner, |p| p.zero_point),
            zero_point_i: per(params, inner, |p| p.zero_point_i),
            quant_min: params.first().map_or(0.0, |p| p.quant_min),
            quant_max: params.first().map_or(0.0, |p| p.quant_max),
            params: params.to_vec(),
        }
    }

    pub fn period(&self) -> usize {
        self.scale.len()
    }

    /// The constants of one period, element by element.
    pub fn per_element(&self) -> PerElement<'_> {
        PerElement {
            scale: &self.scale,
            inv: &self.inv,
            lo: &self.lo,
            hi: &self.hi,
            zero_point: &self.zero_point,
            zero_point_i: &self.zero_point_i,
            quant_min: self.quant_min,
            quant_max: self.quant_max,
        }
    }
}

/// A view of [`Expanded`]'s arrays (see [`Constants`]).
#[derive(Clone, Copy)]
pub(super) struct PerElement<'a> {
    scale: &'a [f32],
    inv: &'a [f32],
    lo: &'a [f32],
    hi: &'a [f32],
    zero_point: &'a [f32],
    zero_point_i: &'a [i32],
    quant_min: f32,
    quant_max: f32,
}

impl Constants for PerElement<'_> {
    #[inline(always)]
    fn prefix(&self, n: usize) -> Self {
        PerElement {
            scale: &self.scale[..n],
            inv: &self.inv[..n],
            lo: &self.lo[..n],
            hi: &self.hi[..n],
            zero_point: &self.zero_point[..n],
            zero_point_i: &self.zero_point_i[..n],
            ..*self
        }
    }
    #[inline(always)]
    fn at(&self, i: usize) -> Affine {
        Affine {
            scale: self.scale[i],
            inv: self.inv[i],
            lo: self.lo[i],
            hi: self.hi[i],
            zero_point: self.zero_point[i],
            zero_point_i: self.zero_point_i[i],
            quant_min: self.quant_min,
            quant_max: self.quant_max,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Walks: how per-channel constants map onto a tensor laid out as [outer, channels, inner].
// ---------------------------------------------------------------------------------------------

/// The constants of consecutive rows from row `first` on: `params` over and over. (A `%` per
/// row costs as much as a row of 64 elements.)
#[inline(always)]
fn rows_params(params: &[Affine], first: usize) -> impl Iterator<Item = &Affine> {
    let skip = first % params.len().max(1);
    params[skip..].iter().chain(params.iter().cycle())
}

/// The fewest values sharing one set of constants (a row of a per-channel weight) for which a
/// kernel runs at 512 bits: LSQ's backward on rows of 9 and 27 values took 1.16x–1.4x its AVX2
/// time there (the per-row work), on rows of 64 and more 0.73x–0.93x.
const WIDE_RUN: usize = 64;

/// How a kernel walks a tensor.
pub(super) enum Walk<'a> {
    /// One set of constants for every element.
    Tensor(Affine),
    /// Rows of `inner` elements; row `b` uses `params[b % params.len()]`.
    Rows { inner: usize, params: &'a [Affine] },
    /// Short rows: whole periods of `channels * inner` elements with expanded constants.
    Periods(Expanded),
}

impl<'a> Walk<'a> {
    pub fn new(layout: ChannelLayout, params: &'a [Affine]) -> Walk<'a> {
        match params {
            [p] => Walk::Tensor(*p),
            // Expanding costs a few floats per element of one period: worth it when periods
            // repeat.
            _ if layout.inner >= SHORT_BLOCK || layout.outer < 4 => Walk::Rows {
                inner: layout.inner,
                params,
            },
            _ => Walk::Periods(Expanded::new(params, layout.inner)),
        }
    }

    /// How many consecutive values share one set of constants: a whole tensor's, a row's, or a
    /// row's within the periods.
    fn run_len(&self) -> usize {
        match self {
            Walk::Tensor(_) => usize::MAX,
            Walk::Rows { inner, .. } => *inner,
            Walk::Periods(e) => e.inner,
        }
    }

    /// The path a kernel whose widest is `widest` ([`ElementKernel::WIDEST`]) runs this walk on:
    /// the widest the CPU has ([`VectorPath::widest`]) up to `widest`, and no wider than AVX2
    /// for runs of fewer than [`WIDE_RUN`] values.
    pub fn path(&self, widest: VectorPath) -> VectorPath {
        let path = VectorPath::widest().min(widest);
        if path == VectorPath::Avx512 && self.run_len() < WIDE_RUN {
            return VectorPath::Avx2;
        }
        path
    }

    /// Jobs are made of whole units.
    fn unit(&self) -> usize {
        match self {
            Walk::Tensor(_) => 1,
            Walk::Rows { inner, .. } => *inner,
            Walk::Periods(e) => e.period(),
        }
        .max(1)
    }

    /// Length of one job: whole units, at least `PARALLEL_CHUNK` elements, all of `n` when `n`
    /// is below the parallel threshold. Depends only on `n` and the layout, so sums come out
    /// the same whatever the number of threads.
    fn job_len(&self, n: usize) -> usize {
        if n < PARALLEL_THRESHOLD {
            return n.max(1);
        }
        let unit = self.unit();
        // Periods: at least 16 per job, which bounds the per-channel partial sums LSQ keeps per
        // job to one per 16 elements.
        let least = if let Walk::Periods(_) = self { 16 } else { 1 };
        (PARALLEL_CHUNK.div_ceil(unit).max(least) * unit)
            .min(n)
            .max(1)
    }
}

// ---------------------------------------------------------------------------------------------
// Kernels and the driver
// ---------------------------------------------------------------------------------------------

/// What a kernel sums per channel: partial sums of jobs are added up in job order.
pub(super) trait Sums: Copy + Default + Send {
    fn add(&mut self, other: Self);
}

/// Element-wise maps sum nothing.
impl Sums for () {
    #[inline(always)]
    fn add(&mut self, _: ()) {}
}

impl Sums for f64 {
    #[inline(always)]
    fn add(&mut self, other: f64) {
        *self += other;
    }
}

/// One kernel family over buffers `S`. Every method is inlined into the driver's job, which is
/// compiled for each [`VectorPath`]: they must be `#[inline(always)]`, and must not hide their
/// loops in closures (a closure is compiled for the baseline).
pub(super) trait ElementKernel<S: Streams>: Sync {
    /// What the kernel sums per channel, if anything (`()` for element-wise maps).
    type Sums: Sums;
    /// The widest path the driver's job runs this kernel on (where the CPU has it, and see
    /// [`Walk::path`]). AVX2 unless a kernel measured faster wider: the fake-quantization
    /// forward took as long or longer on 512 bits (1.0x–1.2x, one thread, a training step's
    /// sizes: its loop waits on the cache), LSQ's backward 0.67x–0.93x.
    const WIDEST: VectorPath = VectorPath::Avx2;
    /// Elements that share one set of constants (a whole tensor, or one row).
    fn span(&self, s: S, p: &Affine) -> Self::Sums;
    /// Whole periods of short rows with per-element constants: adds each channel's sums into
    /// `sums` (one per channel).
    fn periods(&self, s: S, e: &Expanded, sums: &mut [Self::Sums]);
}

/// An element-wise kernel with nothing to sum: written once for any source of constants.
pub(super) trait Map<S: Streams>: Sync {
    /// Processes every element of `s`, element `i` with the constants `c.at(i)`.
    fn map<C: Constants>(&self, s: S, c: &C);
}

/// A [`Map`] from one input to one output, element by element: `y[i] = apply(x[i], c.at(i))`.
pub(super) trait Unary: Sync {
    type In: Copy + Sync;
    type Out;
    fn apply(&self, x: Self::In, p: &Affine) -> Self::Out;
}

impl<U: Unary, O: Out<U::Out>> Map<(&[U::In], &mut [O])> for U {
    #[inline(always)]
    fn map<C: Constants>(&self, (x, y): (&[U::In], &mut [O]), c: &C) {
        let n = x.len().min(y.len());
        let (x, y, c) = (&x[..n], &mut y[..n], c.prefix(n));
        for i in 0..n {
            y[i].set(self.apply(x[i], &c.at(i)));
        }
    }
}

impl<S: Streams, M: Map<S>> ElementKernel<S> for M {
    type Sums = ();
    #[inline(always)]
    fn span(&self, s: S, p: &Affine) {
        self.map(s, p)
    }
    #[inline(always)]
    fn periods(&self, s: S, e: &Expanded, _: &mut [()]) {
        let c = e.per_element();
        for period in s.chunks(e.period()) {
            self.map(period, &c);
        }
    }
}

/// Set by [`limit_kernel_paths`]: the widest [`VectorPath`] the kernels may take, as its `u8`.
static PATH_LIMIT: std::sync::atomic::AtomicU8 =
    std::sync::atomic::AtomicU8::new(VectorPath::Avx512 as u8);

/// Not public API (re-exported in `quant_core::__internals`): from now on, the
/// fake-quantization, GELU and `exp` kernels take no code path wider than `widest`
/// ([`VectorPath::Avx512`]: no limit beyond the CPU's), so that quant-core's tests compare every
/// path on one machine. The integer runtime's paths are limited with
/// [`Isa::limit_to`](crate::int8::Isa::limit_to) instead, which limits these too.
pub fn limit_kernel_paths(widest: VectorPath) {
    PATH_LIMIT.store(widest as u8, std::sync::atomic::Ordering::Relaxed);
}

/// Whether [`limit_kernel_paths`] allows `path`.
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn path_allowed(path: VectorPath) -> bool {
    path as u8 <= PATH_LIMIT.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether the AVX2 code may run (checked at run time, once per job): the CPU has it, and
/// neither [`Isa::limit_to`](crate::int8::Isa::limit_to) nor [`limit_kernel_paths`] kept the
/// process below it.
#[inline(always)]
#[cfg(target_arch = "x86_64")]
pub(super) fn use_avx2() -> bool {
    path_allowed(VectorPath::Avx2)
        && std::arch::is_x86_feature_detected!("avx2")
        && crate::int8::Isa::detected() >= crate::int8::Isa::Avx2
}

/// One job (whole units of the walk) starting at element `start`: its partial sums, one for
/// the tensor, one per row, or one per channel for periods. (Not one per channel for a job of
/// rows: with many channels and many jobs, that much memory, allocated and page-faulted on
/// every call, cost more than the kernel.)
#[inline(always)]
fn job_body<S: Streams, K: ElementKernel<S>>(
    kernel: &K,
    start: usize,
    s: S,
    walk: &Walk<'_>,
) -> Vec<K::Sums> {
    match walk {
        Walk::Periods(e) => {
            let mut sums = vec![K::Sums::default(); e.params.len()];
            kernel.periods(s, e, &mut sums);
            sums
        }
        Walk::Rows { inner, params } => {
            let mut sums = Vec::with_capacity(s.len().div_ceil(*inner));
            // A loop, not a closure: a closure would be compiled without AVX2.
            for (p, row) in rows_params(params, start / inner).zip(s.chunks(*inner)) {
                sums.push(kernel.span(row, p));
            }
            sums
        }
        Walk::Tensor(p) => vec![kernel.span(s, p)],
    }
}

/// [`job_body`] compiled for AVX-512 F or AVX2 when the CPU has it and the kernel and the walk
/// allow it ([`Walk::path`]), for the baseline target otherwise.
/// Every lane's arithmetic is the same on each: the same bits.
fn job<S: Streams, K: ElementKernel<S>>(
    kernel: &K,
    start: usize,
    s: S,
    walk: &Walk<'_>,
) -> Vec<K::Sums> {
    #[cfg(target_arch = "x86_64")]
    {
        // `unsafe fn`: safe functions with target features need Rust 1.86.
        /// [`job_body`] compiled for AVX2.
        ///
        /// # Safety
        /// The CPU supports AVX2 (checked with [`VectorPath::widest`]).
        #[target_feature(enable = "avx2")]
        unsafe fn avx2<S: Streams, K: ElementKernel<S>>(
            kernel: &K,
            start: usize,
            s: S,
            walk: &Walk<'_>,
        ) -> Vec<K::Sums> {
            job_body(kernel, start, s, walk)
        }
        /// [`job_body`] compiled for AVX-512 F: 16 lanes where the compiler vectorises, and
        /// LSQ's AVX-512 kernel inlined.
        ///
        /// # Safety
        /// The CPU supports AVX-512 F and AVX2 (checked with [`VectorPath::widest`]).
        #[target_feature(enable = "avx512f,avx2")]
        unsafe fn avx512<S: Streams, K: ElementKernel<S>>(
            kernel: &K,
            start: usize,
            s: S,
            walk: &Walk<'_>,
        ) -> Vec<K::Sums> {
            job_body(kernel, start, s, walk)
        }
        match walk.path(K::WIDEST) {
            VectorPath::Avx512 => {
                // SAFETY: `path` gives `Avx512` only where `VectorPath::widest` does, for a CPU
                // with AVX-512 F and AVX2.
                return unsafe { avx512(kernel, start, s, walk) };
            }
            VectorPath::Avx2 => {
                // SAFETY: `path` gives `Avx2` only where `VectorPath::widest` gives `Avx2` or
                // `Avx512`, for a CPU with AVX2.
                return unsafe { avx2(kernel, start, s, walk) };
            }
            VectorPath::Baseline => {}
        }
    }
    job_body(kernel, start, s, walk)
}

/// Adds the partial sums of the job starting at element `start` into per-channel `sums`.
fn fold<T: Sums>(walk: &Walk<'_>, start: usize, part: &[T], sums: &mut [T]) {
    match walk {
        Walk::Rows { inner, .. } => {
            let channels = sums.len();
            // Row `b` of the job is row `first + b` of the tensor, of channel `(first + b) %
            // channels`: counted along rather than divided per row.
            let mut c = (start / inner) % channels.max(1);
            for p in part {
                if let Some(s) = sums.get_mut(c) {
                    s.add(*p);
                }
                c += 1;
                if c == channels {
                    c = 0;
                }
            }
        }
        _ => {
            for (s, p) in sums.iter_mut().zip(part) {
                s.add(*p);
            }
        }
    }
}

/// Runs `kernel` over every element of `s` as `walk` says, split into parallel jobs from
/// [`PARALLEL_THRESHOLD`] elements on, and returns its sums per channel (`channels` of them),
/// folded in job order: the same result whatever the number of threads.
pub(super) fn drive<S: Streams, K: ElementKernel<S>>(
    kernel: &K,
    s: S,
    walk: &Walk<'_>,
    channels: usize,
) -> Vec<K::Sums> {
    let mut sums = vec![K::Sums::default(); channels];
    let n = s.len();
    let job_len = walk.job_len(n);
    if job_len >= n {
        fold(walk, 0, &job(kernel, 0, s, walk), &mut sums);
        return sums;
    }
    let jobs: Vec<S> = s.chunks(job_len).collect();
    let parts: Vec<Vec<K::Sums>> = jobs
        .into_par_iter()
        .enumerate()
        .map(|(j, s)| job(kernel, j * job_len, s, walk))
        .collect();
    for (j, part) in parts.iter().enumerate() {
        fold(walk, j * job_len, part, &mut sums);
    }
    sums
}

// ---------------------------------------------------------------------------------------------
// Sums
// ---------------------------------------------------------------------------------------------

/// `f32` accumulator lanes of the gradient sums: one AVX2 register, two SSE2. (More lanes
/// spill registers on AVX2.)
pub(super) const LANES: usize = 8;
/// Elements per accumulation block: each `f32` lane sums 4 terms before it is added to an
/// `f64` accumulator, which bounds the rounding error of a block sum to a few ulps.
pub(super) const BLOCK: usize = 4 * LANES;
/// Elements per chunk of the two-phase reductions: the per-element terms of one chunk live
/// in a stack buffer (2 KiB per sum, in L1).
pub(super) const CHUNK: usize = 512;

/// Sums `terms` (whose length is a multiple of [`BLOCK`]) into `wide`: `f32` lanes over 4 terms
/// each, then `f64`. Kept apart from the element-wise loop that produced `terms`: both loops
/// then vectorise cleanly, where one fused loop left LLVM half scalar.
#[inline(always)]
pub(super) fn reduce_blocks(terms: &[f32], wide: &mut [f64; LANES]) {
    for b in terms.chunks_exact(BLOCK) {
        let mut lanes = [0f32; LANES];
        for j in 0..BLOCK / LANES {
            for l in 0..LANES {
                lanes[l] += b[j * LANES + l];
            }
        }
        for l in 0..LANES {
            wide[l] += lanes[l] as f64;
        }
    }
}

/// The code paths of a kernel written once as a branchless loop over lanes (the GELU forward,
/// `exp` of the softmax gradient): the same source compiled for wider registers, so every path
/// gives the same bits. Not public API (re-exported in `quant_core::__internals` for
/// quant-core's tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum VectorPath {
    /// x86-64's SSE2 (or any other target's baseline).
    Baseline,
    /// AVX2: 8 lanes.
    Avx2,
    /// AVX-512 F: 16 lanes, and mask registers for the selections.
    Avx512,
}

impl VectorPath {
    /// The widest path this CPU has within [`Isa::limit_to`](crate::int8::Isa::limit_to)'s
    /// and [`limit_kernel_paths`]'s limits.
    pub fn widest() -> VectorPath {
        #[cfg(target_arch = "x86_64")]
        {
            use crate::int8::Isa;
            let isa = Isa::detected();
            if use_avx2()
                && path_allowed(VectorPath::Avx512)
                && matches!(isa, Isa::Avx512Bw | Isa::Avx512Vnni)
                && std::arch::is_x86_feature_detected!("avx512f")
            {
                return VectorPath::Avx512;
            }
            if use_avx2() {
                return VectorPath::Avx2;
            }
        }
        VectorPath::Baseline
    }
}
