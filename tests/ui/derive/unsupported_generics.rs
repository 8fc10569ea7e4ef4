use quant::dfdx::nn::modules::Linear;
use quant::dfdx::prelude::*;
use quant::prelude::*;

#[derive(QuantizedModel)]
pub struct Borrowed<'a> {
    pub layer: &'a Linear<4, 4, f32, Cpu>,
}

#[derive(QuantizedModel)]
pub struct Boxed<M> {
    pub inner: M,
}

#[derive(QuantizedModel)]
pub struct DtypeOnly<E: Dtype> {
    pub fc: Linear<4, 4, E, Cpu>,
}

#[derive(Clone, Debug, QuantizedLayer)]
pub struct TwoDevices<E: Dtype, D: Device<E>, D2: Device<E>> {
    #[quantized(weights)]
    pub w: Tensor<Rank1<4>, E, D>,
    #[quantized(weights)]
    pub v: Tensor<Rank1<4>, E, D2>,
}

fn main() {}
