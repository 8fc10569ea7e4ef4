//! Buffers reused from a per-thread pool instead of allocated (and zeroed) afresh: an op's
//! temporaries, and the storage of its output tensor.

use crate::kernels::passes;

/// Most bytes of scratch buffers one thread keeps for reuse ([`Scratch`]).
pub const MAX_SCRATCH_BYTES: usize = 64 << 20;

/// Most scratch buffers one thread keeps for reuse.
const MAX_SCRATCH_BUFFERS: usize = 512;

std::thread_local! {
    static SCRATCH: std::cell::RefCell<pool::Pool> = const {
        std::cell::RefCell::new(pool::Pool::new(MAX_SCRATCH_BUFFERS, MAX_SCRATCH_BYTES))
    };
}

pub(crate) mod pool {
    //! The per-thread pool behind [`Scratch`](super::Scratch).

    /// One thread's buffers, by capacity, with their count and bytes kept as they change: a
    /// training step takes and gives back hundreds of buffers, and a scan of the whole pool on
    /// each (as it once was) took about 1% of the digits ViT's QAT step. Not public API
    /// (re-exported in `quant_core::__internals` for quant-core's tests).
    #[derive(Debug)]
    pub struct Pool {
        /// Buffers of each capacity, the one given back last on top (the likeliest still in
        /// cache). Capacities whose buffers are all taken keep their (empty) entry, so that
        /// taking and giving back the same sizes step after step allocates nothing.
        by_capacity: std::collections::BTreeMap<usize, Vec<Vec<f32>>>,
        buffers: usize,
        bytes: usize,
        max_buffers: usize,
        max_bytes: usize,
    }

    impl Pool {
        /// An empty pool that keeps at most `max_buffers` buffers of at most `max_bytes` in all.
        pub const fn new(max_buffers: usize, max_bytes: usize) -> Pool {
            Pool {
                by_capacity: std::collections::BTreeMap::new(),
                buffers: 0,
                bytes: 0,
                max_buffers,
                max_bytes,
            }
        }

        /// A buffer of the smallest capacity in `min..=max` the pool has: of those, the one
        /// given back last.
        pub fn take(&mut self, min: usize, max: usize) -> Option<Vec<f32>> {
            if min > max {
                return None;
            }
            let buf = self
                .by_capacity
                .range_mut(min..=max)
                .find_map(|(_, stack)| stack.pop())?;
            self.buffers -= 1;
            self.bytes -= buf.capacity() * 4;
            Some(buf)
        }

        /// Keeps `buf`, then lets the smallest buffers go until within the limits (the large
        /// ones are the costly ones to allocate again).
        pub fn give(&mut self, buf: Vec<f32>) {
            self.buffers += 1;
            self.bytes += buf.capacity() * 4;
            self.by_capacity
                .entry(buf.capacity())
                .or_default()
                .push(buf);
            while self.buffers > self.max_buffers || self.bytes > self.max_bytes {
                let Some(smallest) = self.by_capacity.values_mut().find_map(|stack| stack.pop())
                else {
                    break;
                };
                self.buffers -= 1;
                self.bytes -= smallest.capacity() * 4;
            }
            if self.by_capacity.len() > self.max_buffers {
                // Sizes that came and went (a changing batch size): their empty entries go.
                self.by_capacity.retain(|_, stack| !stack.is_empty());
            }
        }

        /// Buffers kept.
        pub fn buffers(&self) -> usize {
            self.buffers
        }

        /// Bytes of the buffers kept (their capacities).
        pub fn bytes(&self) -> usize {
            self.bytes
        }

        /// The capacities of the buffers kept, smallest first.
        pub fn capacities(&self) -> Vec<usize> {
            let stacks = self.by_capacity.iter();
            stacks
                .flat_map(|(capacity, stack)| std::iter::repeat_n(*capacity, stack.len()))
                .collect()
        }

        /// Capacities with an entry, empty ones included.
        pub fn entries(&self) -> usize {
            self.by_capacity.len()
        }
    }
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
            .try_with(|pool| pool.borrow_mut().take(len, max_capacity))
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
        let _ = SCRATCH.try_with(|pool| pool.borrow_mut().give(buf));
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
