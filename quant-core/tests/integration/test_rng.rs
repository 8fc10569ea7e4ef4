//! The tests' pseudo-random numbers: a xorshift generator, so that every test draws the
//! same values on every machine without a crate for it.

/// 64-bit draws from Marsaglia's xorshift (13, 7, 17) generator seeded with `state` (not zero).
pub fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}
