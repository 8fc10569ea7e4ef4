use quant::dfdx::prelude::*;
use quant::prelude::*;

#[derive(Clone, Debug, QuantizedLayer)]
#[quantized(input)]
pub struct Layer {
    #[quantized(channels = 4)]
    pub w: Tensor<Rank2<4, 4>, f32, Cpu>,
    #[quantized(weights, channels = 0)]
    pub v: Tensor<Rank2<4, 4>, f32, Cpu>,
    #[quantized(weights, channels)]
    pub u: Tensor<Rank2<4, 4>, f32, Cpu>,
}

fn main() {}
