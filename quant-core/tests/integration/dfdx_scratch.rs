use quant_core::dfdx_ops::Scratch;

/// A pooled buffer serves a shorter value and then a longer one again: each use sees
/// exactly the length it asked for, and the storage is the same one (the reason for the
/// pool: no fresh allocation, so no fresh pages, from step to step).
#[test]
fn scratch_buffers_are_reused_at_the_length_asked_for() {
    let first = {
        let mut a = Scratch::with_len(1000);
        a.fill(1.5);
        a.as_ptr()
    };
    for len in [10, 1000, 0, 999, 1000] {
        let mut b = Scratch::with_len(len);
        assert_eq!(b.len(), len);
        if len > 0 {
            assert_eq!(b.as_ptr(), first, "length {len}: not the pooled buffer");
        }
        b.fill(len as f32);
        assert!(b.iter().all(|v| *v == len as f32));
    }
}
