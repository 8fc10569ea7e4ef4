//! quant-dfdx' integration tests, in one binary: the stable-Rust convolution and pooling, the
//! quantized layers at every rank, attention and dfdx's composites converted, trained and run on
//! integers, policies and observers. One binary links dfdx once instead of once per file.

mod attention;
mod common;
mod composites;
mod layers;
mod nn_cnn;
mod nn_conv;
mod nn_flatten;
mod nn_pool;
mod observers;
mod policy;
mod ptq;
mod ranks;
mod smoothing;
