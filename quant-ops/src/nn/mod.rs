//! Float layers dfdx 0.13 only has behind its `nightly` feature: 2-D convolution, max and
//! average pooling, and flattening, implemented on stable Rust.
