//! quant-dfdx' integration tests, in one binary: the stable-Rust convolution and pooling, the
//! quantized layers at every rank, attention and dfdx's composites converted, trained and run on
//! integers, policies and observers. One binary links dfdx once instead of once per file.

mod attention;
mod calibration;
mod common;
mod composites;
mod fold;
mod layers;
mod nn_attention;
mod nn_batch_norm;
mod nn_cnn;
mod nn_conv;
mod nn_flatten;
mod nn_gelu;
mod nn_layer_norm;
mod nn_linear;
mod nn_pool;
mod nn_relu;
mod nn_residual;
mod nn_tokens;
mod observers;
mod platform;
mod policy;
mod ptq;
mod quantizers;
mod ranks;
mod smoothing;
