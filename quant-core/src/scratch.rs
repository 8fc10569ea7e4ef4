//! Buffers reused from a per-thread pool instead of allocated (and zeroed) afresh: an op's
//! temporaries, and the storage of its output tensor.

use crate::kernels::passes;

/// Most bytes of scratch buffers one thread keeps for reuse ([`Scratch`]).
pub const MAX_SCRATCH_BYTES: usize = 64 << 20;

/// Most scratch buffers one thread keeps for reuse.
const MAX_SCRATCH_BUFFERS: usize = 512;

std::thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<Vec<f32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A buffer of `f32` from a per-thread pool, given back to the pool when dropped.
///
/// For the buffers an op fills and keeps for its backward pass, and for its temporaries.
/// Allocated afresh on every step, such buffers (hundreds of kilobytes for a layer) are freed
/// at the end of the step; the allocator then returns their pages to the system and takes
/// them back, zeroed, on the next step: for the W4A4 MLP's input copies, when ops still copied
/// their inputs, about 200 page faults per training step, more time than the quantizers'
/// arithmetic. A pooled buffer is reused from step to step instead, and needs no zeroing
/// since every use overwrites it whole. The pool keeps at most [`MAX_SCRATCH_BYTES`] per
/// thread.
///
/// An op's output tensor can take its storage from the pool too ([`Scratch::output`]), fed
/// by the gradients the backward passes are done with ([`Scratch::recycle`]): a zeroed
/// allocation of a few hundred kilobytes is a pass over memory the cache no longer holds, and
/// the op's own pass over it follows (on the digits ViT's W4A4 QAT step, a tenth of its time
/// was such zeroing).
pub struct Scratch {
    /// The storage: every element initialised (a buffer never shrinks, so that reusing it for a
    /// shorter value and then a longer one writes nothing before the caller does).
    buf: Vec<f32>,
    /// The elements in use, at most `buf.len()`.
    len: usize,
}

impl Scratch {
    /// A buffer of `len` elements of unspecified (initialised) values. In builds with debug
    /// assertions (the tests') they are NaN, so that a caller who reads one before writing
    /// it gets NaN, not the zeros a fresh allocation would happen to hold.
    pub fn with_len(len: usize) -> Scratch {
        Scratch::taken(len, usize::MAX)
    }

    /// A vector of `len` elements of unspecified (initialised) values, for good: the storage
    /// of an op's output tensor, which the op then writes whole. A pooled buffer only where it
    /// is at most twice as large (a small tensor does not keep a large buffer alive).
    pub fn output(len: usize) -> Vec<f32> {
        let mut taken = Scratch::taken(len, len.saturating_mul(2));
        let mut buf = std::mem::take(&mut taken.buf);
        buf.truncate(len);
        buf
    }

    /// A vector of `len` zeros for good, like [`Scratch::output`] from the pool where it can
    /// be, zeroed on rayon's threads when long: a zeroed allocation is one thread's `memset`,
    /// a serial section in an otherwise parallel training step.
    pub fn zeros(len: usize) -> Vec<f32> {
        match Scratch::pooled(len, len.saturating_mul(2)) {
            Some(mut buf) => {
                buf.truncate(len);
                passes::fill(&mut buf, 0.0);
                // A pooled buffer holds `len` values at most; the rest, if any, within capacity.
                buf.resize(len, 0.0);
                buf
            }
            None => fresh_zeros(len),
        }
    }

    /// The smallest pooled buffer of at least `len` elements and at most `max_capacity`.
    fn pooled(len: usize, max_capacity: usize) -> Option<Vec<f32>> {
        SCRATCH
            .try_with(|pool| {
                let mut pool = pool.borrow_mut();
                let best = pool
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| (len..=max_capacity).contains(&b.capacity()))
                    .min_by_key(|(_, b)| b.capacity())
                    .map(|(i, _)| i)?;
                Some(pool.swap_remove(best))
            })
            .ok()
            .flatten()
    }

    /// The smallest pooled buffer of at least `len` elements and at most `max_capacity`, or a
    /// new one.
    fn taken(len: usize, max_capacity: usize) -> Scratch {
        let mut buf = Scratch::pooled(len, max_capacity).unwrap_or_else(|| fresh_zeros(len));
        if buf.len() < len {
            // Within capacity for a pooled buffer: writes only a tail it never had.
            buf.resize(len, 0.0);
        }
        if cfg!(debug_assertions) {
            // All bits set: a NaN (and -1 as an `i32`); a byte fill is a `memset` unoptimised.
            bytemuck::cast_slice_mut::<f32, u8>(&mut buf[..len]).fill(0xff);
        }
        Scratch { buf, len }
    }

    /// Gives `buf`, which its owner is done with (a used gradient), to this thread's pool.
    pub fn recycle(buf: Vec<f32>) {
        let len = buf.len();
        drop(Scratch { buf, len });
    }

    /// The same memory as `i32`s (as many; an integer kernel's codes).
    pub fn as_i32_mut(&mut self) -> &mut [i32] {
        bytemuck::cast_slice_mut(&mut self.buf[..self.len])
    }
}

impl std::ops::Deref for Scratch {
    type Target = [f32];
    #[inline]
    fn deref(&self) -> &[f32] {
        &self.buf[..self.len]
    }
}

impl std::ops::DerefMut for Scratch {
    #[inline]
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.buf[..self.len]
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        if buf.capacity() == 0 {
            return;
        }
        // During thread exit the pool may be gone: the buffer is then simply freed.
        let _ = SCRATCH.try_with(|pool| {
            let mut pool = pool.borrow_mut();
            pool.push(buf);
            let bytes = |p: &Vec<Vec<f32>>| -> usize { p.iter().map(|b| b.capacity() * 4).sum() };
            // Over the limits: the smallest buffers go first, the large ones are the costly.
            while pool.len() > MAX_SCRATCH_BUFFERS || bytes(&pool) > MAX_SCRATCH_BYTES {
                let smallest = (0..pool.len()).min_by_key(|i| pool[*i].capacity());
                match smallest {
                    Some(i) => drop(pool.swap_remove(i)),
                    None => break,
                }
            }
        });
    }
}

/// A new vector of `len` zeros, written on rayon's threads when long (not `vec![0.0; len]`:
/// where the allocator reuses memory, that is one thread's `memset`).
fn fresh_zeros(len: usize) -> Vec<f32> {
    if len < passes::PASSES_PARALLEL {
        return vec![0.0; len];
    }
    let mut buf = Vec::with_capacity(len);
    passes::fill_zeros_uninit(&mut buf.spare_capacity_mut()[..len]);
    // SAFETY: the capacity is at least `len`, and every element of `0..len` was written above.
    unsafe { buf.set_len(len) };
    buf
}
