//! quant-core's integration tests, in one binary: the int8 kernels and their nonlinear
//! functions against exact references, the fake-quantization kernels against PyTorch and on
//! hostile arguments, and the dfdx ops. One binary links dfdx once instead of once per file.

mod config;
mod grid;
mod inferable;
mod int8;
mod int8_nonlinear;
mod int8_simulate;
mod kernels_hostile;
mod nonlinear_reference;
mod ops;
mod ops_nonlinear;
mod pytorch_reference;
mod quantizer;
mod vocab;
