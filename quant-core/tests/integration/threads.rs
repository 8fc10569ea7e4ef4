//! Running a check on more than one number of threads.

/// `f` run on a pool of one thread and on a pool of three: what a result that must not
/// depend on the number of threads is checked on.
pub fn on_one_and_three_threads<T: Send>(f: impl Fn() -> T + Send + Sync) -> [T; 2] {
    [1, 3].map(|threads| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(&f)
    })
}
