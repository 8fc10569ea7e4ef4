//! Observers: statistics of tensors turned into quantization parameters.
