//! quant-core's integration tests, in one binary: the int8 kernels and their nonlinear
//! functions against exact references, the fake-quantization kernels against PyTorch and on
//! hostile arguments, and the dfdx ops. One binary links dfdx once instead of once per file.

mod config;
mod dfdx_scratch;
mod grid;
mod inferable;
mod int8;
mod int8_codes;
mod int8_nonlinear;
mod int8_simulate;
mod int8_softmax_exp;
#[cfg(target_arch = "x86_64")]
mod int8_x86;
mod kernels;
mod kernels_affine;
mod kernels_channel_sums;
mod kernels_exp;
mod kernels_gelu;
mod kernels_hostile;
mod kernels_passes;
mod kernels_pool;
mod nonlinear_reference;
mod ops;
mod ops_nonlinear;
mod ops_nonlinear_backward;
mod pytorch_reference;
mod quantizer;
mod test_rng;
mod threads;
mod vocab;
