//! Running the seeds of a run in parallel, on the threads of the current rayon pool.
//!
//! Each seed is two tasks: its float model (trained, or loaded from the cache), then
//! everything quantized (PTQ, QAT, export, integer inference), which needs the first. Seeds are
//! independent: each has its own device, generators and copy of the run file, so a seed's
//! results do not depend on which thread runs it, on what runs beside it, or in which order;
//! the kernels inside a task split their work at size-based boundaries and sum in a fixed
//! order, so neither does the number of threads.
//!
//! One worker loop runs on each thread of the pool ([`rayon::broadcast`]): it takes the next
//! ready task, runs it, and makes the task's successor ready. Kernels inside a task use the
//! same pool (`rayon::join`, parallel iterators), so the pool's threads are never
//! oversubscribed: a thread whose worker loop has found nothing left to start helps with the
//! kernels of the tasks still running.
//!
//! With several threads, float models go first: they are the longest tasks, and starting them
//! early keeps every thread busy to the end (3 seeds on 2 threads take about half the time of
//! one thread, where one seed per thread would take two thirds). With one thread, each seed
//! goes to the end before the next starts, as a plain loop would.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, also after a task panicked while holding it (the panic itself reaches the caller
/// through [`rayon::broadcast`]).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The two tasks of a seed, by the seed's index in the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Task {
    Float(usize),
    Quantized(usize),
}

impl Task {
    /// The order of a plain loop over the seeds: by seed, float first.
    fn sequential_order(self) -> (usize, bool) {
        match self {
            Task::Float(i) => (i, false),
            Task::Quantized(i) => (i, true),
        }
    }
}

/// Shared state of the worker loops.
struct Board<F, Q, E> {
    /// Tasks that may start.
    ready: Vec<Task>,
    /// Whether float models go before quantized tasks.
    floats_first: bool,
    /// Float task `i` may start only after float task `float_after[i]` (the same seed listed
    /// twice: the second finds the first's model in the cache, as a sequential run would).
    float_after: Vec<Option<usize>>,
    /// Float models waiting for their quantized task.
    floats: Vec<Option<F>>,
    /// Finished seeds.
    done: Vec<Option<Q>>,
    /// Errors, with the task that failed.
    errors: Vec<(Task, E)>,
}

impl<F, Q, E> Board<F, Q, E> {
    /// The next task to start, if any.
    fn next(&mut self) -> Option<Task> {
        if !self.errors.is_empty() {
            return None;
        }
        let floats_first = self.floats_first;
        let best = self
            .ready
            .iter()
            .enumerate()
            .min_by_key(|(_, t)| match **t {
                Task::Float(i) => (!floats_first, i),
                Task::Quantized(i) => (floats_first, i),
            })
            .map(|(at, _)| at)?;
        Some(self.ready.swap_remove(best))
    }

    fn float_done(&mut self, i: usize, model: F) {
        self.floats[i] = Some(model);
        self.ready.push(Task::Quantized(i));
        for (j, after) in self.float_after.iter().enumerate() {
            if *after == Some(i) {
                self.ready.push(Task::Float(j));
            }
        }
    }
}

/// Runs `float(i)` then `quantized(i, float's result)` for every seed index `i` in
/// `0..float_after.len()`, on every thread of the current rayon pool; returns the quantized
/// results in seed order.
///
/// Float task `i` starts after float task `float_after[i]` when that is `Some`. On an error,
/// no further task starts; the tasks already running finish, and the error of the earliest
/// failed task (by seed, float before quantized) is returned.
pub(crate) fn run_seeds<F, Q, E>(
    float_after: Vec<Option<usize>>,
    float: impl Fn(usize) -> Result<F, E> + Sync,
    quantized: impl Fn(usize, F) -> Result<Q, E> + Sync,
) -> Result<Vec<Q>, E>
where
    F: Send,
    Q: Send,
    E: Send,
{
    let n = float_after.len();
    let board = Mutex::new(Board {
        ready: (0..n)
            .filter(|i| float_after[*i].is_none())
            .map(Task::Float)
            .collect(),
        floats_first: rayon::current_num_threads() > 1,
        float_after,
        floats: (0..n).map(|_| None).collect(),
        done: (0..n).map(|_| None).collect(),
        errors: Vec::new(),
    });
    let worker = || loop {
        let Some(task) = lock(&board).next() else {
            return;
        };
        match task {
            Task::Float(i) => match float(i) {
                Ok(model) => lock(&board).float_done(i, model),
                Err(e) => lock(&board).errors.push((task, e)),
            },
            Task::Quantized(i) => {
                let model = lock(&board).floats[i].take();
                // Always there: the float task put it there before making this one ready.
                let Some(model) = model else { return };
                let result = quantized(i, model);
                let mut b = lock(&board);
                match result {
                    Ok(q) => b.done[i] = Some(q),
                    Err(e) => b.errors.push((task, e)),
                }
            }
        }
    };
    rayon::broadcast(|_| worker());
    let board = board.into_inner().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, e)) = board
        .errors
        .into_iter()
        .min_by_key(|(task, _)| task.sequential_order())
    {
        return Err(e);
    }
    // Every seed finished without error.
    Ok(board.done.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    }

    #[test]
    fn every_seed_runs_float_then_quantized_and_results_come_in_seed_order() {
        for threads in [1, 2, 3] {
            let log = Mutex::new(Vec::new());
            let results = pool(threads)
                .install(|| {
                    run_seeds(
                        vec![None, None, None, None, Some(1)],
                        |i| {
                            lock(&log).push(Task::Float(i));
                            Ok::<_, String>(i * 10)
                        },
                        |i, f| {
                            lock(&log).push(Task::Quantized(i));
                            // The float result of the same seed.
                            assert_eq!(f, i * 10);
                            Ok(format!("seed {i}"))
                        },
                    )
                })
                .unwrap();
            assert_eq!(
                results,
                (0..5).map(|i| format!("seed {i}")).collect::<Vec<_>>()
            );
            let log = log.into_inner().unwrap();
            assert_eq!(log.len(), 10, "{threads} threads: {log:?}");
            let at = |t: Task| log.iter().position(|x| *x == t).unwrap();
            for i in 0..5 {
                assert!(at(Task::Float(i)) < at(Task::Quantized(i)), "{log:?}");
            }
            // A seed listed twice: its second float task waits for the first.
            assert!(at(Task::Float(1)) < at(Task::Float(4)), "{log:?}");
            if threads == 1 {
                // One thread: each seed to the end before the next, as a plain loop.
                assert_eq!(
                    &log[..4],
                    &[
                        Task::Float(0),
                        Task::Quantized(0),
                        Task::Float(1),
                        Task::Quantized(1)
                    ]
                );
            }
        }
    }

    #[test]
    fn seeds_run_at_the_same_time_on_several_threads() {
        // Two float tasks that each wait for the other to have started: they finish only if
        // two threads run them at once.
        let started = AtomicUsize::new(0);
        let results = pool(2).install(|| {
            run_seeds(
                vec![None, None],
                |_| {
                    started.fetch_add(1, Ordering::SeqCst);
                    let t = std::time::Instant::now();
                    while started.load(Ordering::SeqCst) < 2 {
                        if t.elapsed() > std::time::Duration::from_secs(20) {
                            return Err("the other seed never started");
                        }
                        std::thread::yield_now();
                    }
                    Ok(())
                },
                |i, ()| Ok(i),
            )
        });
        assert_eq!(results, Ok(vec![0, 1]));
    }

    #[test]
    fn the_earliest_failed_task_is_reported_and_nothing_new_starts() {
        for threads in [1, 2] {
            let quantized_runs = AtomicUsize::new(0);
            let r: Result<Vec<()>, String> = pool(threads).install(|| {
                run_seeds(
                    vec![None; 6],
                    |i| {
                        if i >= 1 {
                            Err(format!("float {i}"))
                        } else {
                            Ok(())
                        }
                    },
                    |i, ()| {
                        quantized_runs.fetch_add(1, Ordering::SeqCst);
                        Err(format!("quantized {i}"))
                    },
                )
            });
            let e = r.unwrap_err();
            // Float 1 fails; quantized 0 may fail too, and comes first.
            assert!(
                e == "float 1" || e == "quantized 0",
                "{threads} threads: {e}"
            );
            assert!(quantized_runs.load(Ordering::SeqCst) <= 1);
        }
    }
}
