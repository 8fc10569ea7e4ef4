//! The integer matrix product: packed weights, the row split across threads, the portable
//! reference kernel, and the dispatch to the x86 micro-kernels.

use rayon::prelude::*;

use super::{check_len, checked_size, Isa};
use crate::error::{QuantError, Result};

/// Products with at least this many multiply-adds (`m · n · k`) are split by rows across
/// rayon's threads (when its pool has more than one); smaller ones run on the calling thread.
pub const PARALLEL_MACS: usize = 1 << 22;
/// Least multiply-adds in one parallel job.
const JOB_MACS: usize = 1 << 20;

/// How the weights are laid out for the kernel that reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Form {
    /// Row-major `[n][k]` `i16`, for the portable kernel.
    Rows,
    /// Panels of `lanes` output channels; each holds, for every group of 4 consecutive fan-in
    /// positions, 4 `i8` codes per channel (`vpdpbusd`, `vpmaddubsw`).
    Quads,
    /// Panels of `lanes` output channels; each holds, for every pair of consecutive fan-in
    /// positions, 2 `i16` codes per channel (`vpdpwssd`, `vpmaddwd`).
    Pairs,
}

impl Form {
    /// Fan-in positions per group (one `i32` of activations).
    pub(super) fn group(self) -> usize {
        match self {
            Form::Rows => 1,
            Form::Quads => 4,
            Form::Pairs => 2,
        }
    }
}

/// A weight matrix of `n` rows (output channels) by `k` (fan-in) of centered codes `w - z_w`,
/// packed once for one instruction-set path, with its row sums (for the activations' zero
/// point: `Σ (a - z_a) · w = Σ a · w - z_a · Σ w`).
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    n: usize,
    k: usize,
    isa: Isa,
    form: Form,
    /// Output channels per panel (`i32` lanes of the kernel's registers; 1 for `Rows`).
    lanes: usize,
    /// Fan-in groups per channel (`k` rounded up to the form's group).
    groups: usize,
    /// The codes of `Rows` and `Pairs` (the other one stays empty).
    wide: Vec<i16>,
    /// The codes of `Quads`.
    bytes: Vec<i8>,
    row_sums: Vec<i32>,
    /// The largest `|w - z_w|`: how far products may be summed in `i16` lanes.
    max_abs: u32,
    /// Where the fan-in is packed as separate runs (see [`PackedMatrix::for_windows`]).
    runs: Option<Runs>,
}

/// A fan-in packed as `count` runs of `codes` positions, each zero-padded to `groups` whole
/// groups of the form (a convolution's kernel rows, whose codes are not whole groups).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Runs {
    pub count: usize,
    pub codes: usize,
    pub groups: usize,
}

impl PackedMatrix {
    /// Packs `centered` (`n` rows of `k` codes, row-major, each within `i16`) for the fastest
    /// path this CPU has ([`Isa::detected`]).
    ///
    /// # Errors
    /// `centered.len() != n · k`, or a code outside `[-32768, 32767]` (its index is reported).
    pub fn new(centered: &[i32], n: usize, k: usize) -> Result<PackedMatrix> {
        PackedMatrix::with_isa(centered, n, k, Isa::detected())
    }

    /// Packs `centered` for the path `isa` (tests and benchmarks use it to force a path).
    ///
    /// # Errors
    /// See [`PackedMatrix::new`]; also a path this CPU cannot run.
    pub fn with_isa(centered: &[i32], n: usize, k: usize, isa: Isa) -> Result<PackedMatrix> {
        PackedMatrix::with_runs(centered, n, k, isa, None)
    }

    /// Packs `centered` (`n` rows of a convolution's fan-in `kh · kw · c`, in
    /// [`im2col_u8`](super::im2col_u8)'s order) for [`conv_u8`](super::conv_u8) on the path
    /// `isa`: where neither a kernel row's `kw · c` codes nor the whole fan-in are whole groups
    /// of the path's form, each kernel row is packed zero-padded to whole groups, so that the
    /// convolution reads its windows in place (the padded positions read codes that a zero
    /// weight cancels) rather than writing patches. It is the same matrix for [`gemm_u8`] and
    /// everything else.
    ///
    /// # Errors
    /// See [`PackedMatrix::with_isa`], and a fan-in other than `kh · kw · c`.
    pub fn for_windows(
        centered: &[i32],
        n: usize,
        [kh, kw, c]: [usize; 3],
        isa: Isa,
    ) -> Result<PackedMatrix> {
        let k = super::nhwc::volume("window", [kh, kw, c])?;
        PackedMatrix::with_runs(centered, n, k, isa, Some([kh, kw * c]))
    }

    /// [`PackedMatrix::with_isa`], the fan-in packed as `runs` (count, codes) where they are
    /// given and not whole groups of the chosen form.
    fn with_runs(
        centered: &[i32],
        n: usize,
        k: usize,
        isa: Isa,
        runs: Option<[usize; 2]>,
    ) -> Result<PackedMatrix> {
        let isa = isa.check_available()?;
        check_len(
            "centered weights",
            checked_size("weights", n, k)?,
            centered.len(),
        )?;
        if let Some(i) = centered.iter().position(|w| i16::try_from(*w).is_err()) {
            return Err(QuantError::InvalidValue {
                what: format!("centered weight [{}][{}]", i / k.max(1), i % k.max(1)),
                value: centered[i].to_string(),
                expected: "a code within [-32768, 32767] (w - z_w of a grid of at most 16 bits)"
                    .into(),
            });
        }
        let row_sums = (0..n)
            .map(|o| {
                centered[o * k..(o + 1) * k]
                    .iter()
                    .fold(0i32, |s, w| s.wrapping_add(*w))
            })
            .collect();
        let max_abs = centered.iter().map(|w| w.unsigned_abs()).max().unwrap_or(0);
        let fits_i8 = centered.iter().all(|w| i8::try_from(*w).is_ok());
        let (form, lanes) = match isa {
            Isa::Portable => (Form::Rows, 1),
            // `vpdpbusd` takes any i8 weight.
            Isa::Avx512Vnni if fits_i8 => (Form::Quads, 16),
            Isa::AvxVnni if fits_i8 => (Form::Quads, 8),
            // `vpmaddubsw` saturates its pair sums beyond |w| = 64.
            Isa::Avx512Bw if max_abs <= 64 => (Form::Quads, 16),
            Isa::Avx2 if max_abs <= 64 => (Form::Quads, 8),
            Isa::Avx512Vnni | Isa::Avx512Bw => (Form::Pairs, 16),
            Isa::AvxVnni | Isa::Avx2 => (Form::Pairs, 8),
        };
        let per_group = form.group();
        // Only where the plain fan-in is not whole groups either: its rows would be packed
        // then, and a run's padding can cost more groups than it saves (a 2x2 kernel on one
        // channel: two groups a window rather than one).
        let runs = match runs {
            Some([count, codes])
                if form != Form::Rows
                    && !codes.is_multiple_of(per_group)
                    && !k.is_multiple_of(per_group) =>
            {
                Some(Runs {
                    count,
                    codes,
                    groups: codes.div_ceil(per_group),
                })
            }
            _ => None,
        };
        let groups = match runs {
            Some(r) => r.count * r.groups,
            None => k.div_ceil(per_group),
        };
        let panels = n.div_ceil(lanes);
        // The fan-in position packed at `i` (past a run's codes: none, a zero weight).
        let position = |i: usize| match runs {
            Some(r) => {
                let (run, at) = (i / (r.groups * per_group), i % (r.groups * per_group));
                (at < r.codes).then_some(run * r.codes + at)
            }
            None => Some(i),
        };
        let code = |o: usize, i: usize| match position(i) {
            Some(i) if o < n && i < k => centered[o * k + i],
            _ => 0,
        };
        let mut packed = PackedMatrix {
            n,
            k,
            isa,
            form,
            lanes,
            groups,
            wide: Vec::new(),
            bytes: Vec::new(),
            row_sums,
            max_abs,
            runs,
        };
        match form {
            Form::Rows => packed.wide = centered.iter().map(|w| *w as i16).collect(),
            Form::Quads | Form::Pairs => {
                // [panel][group][lane][position in group]
                let len = checked_size("packed weights", panels * groups, lanes * per_group)?;
                let mut out = Vec::with_capacity(len);
                for p in 0..panels {
                    for g in 0..groups {
                        for l in 0..lanes {
                            for t in 0..per_group {
                                out.push(code(p * lanes + l, g * per_group + t));
                            }
                        }
                    }
                }
                if form == Form::Quads {
                    packed.bytes = out.into_iter().map(|w| w as i8).collect();
                } else {
                    packed.wide = out.into_iter().map(|w| w as i16).collect();
                }
            }
        }
        Ok(packed)
    }

    /// Output channels (rows of the weight matrix).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Fan-in (columns of the weight matrix).
    pub fn k(&self) -> usize {
        self.k
    }

    /// The path the matrix is packed for.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// `Σ_i w[o][i]` per output channel (wrapping `i32`).
    pub fn row_sums(&self) -> &[i32] {
        &self.row_sums
    }

    pub(super) fn max_abs(&self) -> u32 {
        self.max_abs
    }
    pub(super) fn form(&self) -> Form {
        self.form
    }
    pub(super) fn lanes(&self) -> usize {
        self.lanes
    }
    /// The runs the fan-in is packed as, where it is (see [`PackedMatrix::for_windows`]).
    pub(super) fn runs(&self) -> Option<Runs> {
        self.runs
    }
    pub(super) fn groups(&self) -> usize {
        self.groups
    }
    /// The packed codes as bytes, in the order the x86 kernels read them.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) fn packed_bytes(&self) -> *const u8 {
        match self.form {
            Form::Quads => self.bytes.as_ptr() as *const u8,
            _ => self.wide.as_ptr() as *const u8,
        }
    }
    /// Bytes of one panel of `lanes` output channels.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) fn panel_bytes(&self) -> usize {
        self.groups * self.lanes * 4
    }
}

/// `out[r·n + o] = bias[o] + Σ_i (a[r·k + i] - a_zero) · w[o][i]`, exact in `i32` (modulo
/// `2^32`: the caller guarantees the true value fits `i32`). `a` holds `m` rows of `k` `u8`
/// activation codes (a grid of at most 8 bits; signed grids are stored offset by 128, with
/// the zero point offset alike).
///
/// # Errors
/// `a`, `bias` or `out` whose length does not match `m`, `w.k()` and `w.n()`; nothing is
/// written then.
pub fn gemm_u8(
    a: &[u8],
    m: usize,
    a_zero: i32,
    w: &PackedMatrix,
    bias: &[i32],
    out: &mut [i32],
) -> Result<()> {
    let (n, k) = (w.n, w.k);
    check_len("activations", checked_size("activations", m, k)?, a.len())?;
    check_len("bias", n, bias.len())?;
    check_len("output", checked_size("output", m, n)?, out.len())?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let columns = zero_point_columns(w, a_zero, bias);
    split_rows(m, n, k, out, |first_row, out| {
        let rows = out.len() / n;
        let a = &a[first_row * k..(first_row + rows) * k];
        run_rows(a, rows, w, &columns, out);
    });
    Ok(())
}

/// Runs `run(first_row, rows of out)` over the `m` rows of `n` outputs of a product with fan-in
/// `k`: at once on this thread, or in jobs across rayon's threads where the product is large
/// (see [`PARALLEL_MACS`]). `n` is at least 1.
pub(super) fn split_rows(
    m: usize,
    n: usize,
    k: usize,
    out: &mut [i32],
    run: impl Fn(usize, &mut [i32]) + Sync,
) {
    let macs = m.saturating_mul(n).saturating_mul(k.max(1));
    let rows_per_job = if macs < PARALLEL_MACS {
        m
    } else {
        // Whole micro-tiles of rows (a multiple of 24 is one for every kernel).
        JOB_MACS
            .div_ceil(n.saturating_mul(k.max(1)))
            .next_multiple_of(24)
            .min(m)
    };
    // With one thread in the pool the jobs would only be handed to it and waited for (from
    // outside the pool, a wake-up and a sleep per product): they run here instead.
    if rows_per_job >= m || rayon::current_num_threads() == 1 {
        run(0, out);
    } else {
        out.par_chunks_mut(rows_per_job * n)
            .enumerate()
            .for_each(|(j, out)| run(j * rows_per_job, out));
    }
}

/// The zero point folded into one constant per output channel, `bias[o] - a_zero · Σ_i w[o][i]`,
/// padded with zeros to whole panels of `w`.
pub(super) fn zero_point_columns(w: &PackedMatrix, a_zero: i32, bias: &[i32]) -> Vec<i32> {
    let mut columns: Vec<i32> = (0..w.n.div_ceil(w.lanes) * w.lanes)
        .map(|o| match (bias.get(o), w.row_sums.get(o)) {
            (Some(b), Some(s)) => b.wrapping_sub(a_zero.wrapping_mul(*s)),
            _ => 0,
        })
        .collect();
    columns.shrink_to_fit();
    columns
}

/// `rows` rows of the product into `out` (`rows · n`), on `w`'s path.
fn run_rows(a: &[u8], rows: usize, w: &PackedMatrix, columns: &[i32], out: &mut [i32]) {
    match w.isa {
        Isa::Portable => portable(a, rows, w, columns, out),
        #[cfg(target_arch = "x86_64")]
        _ => super::x86::run_rows(a, rows, w, columns, out),
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("only the portable path is available off x86-64"),
    }
}

/// The reference: one dot product per output, in wrapping `i32`.
fn portable(a: &[u8], rows: usize, w: &PackedMatrix, columns: &[i32], out: &mut [i32]) {
    let (n, k) = (w.n, w.k);
    for r in 0..rows {
        let a_row = &a[r * k..(r + 1) * k];
        for o in 0..n {
            let w_row = &w.wide[o * k..(o + 1) * k];
            let dot = a_row
                .iter()
                .zip(w_row)
                .fold(0i32, |s, (a, w)| s.wrapping_add(*a as i32 * *w as i32));
            out[r * n + o] = columns[o].wrapping_add(dot);
        }
    }
}
