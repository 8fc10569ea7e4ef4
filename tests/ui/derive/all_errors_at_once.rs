use quant::dfdx::nn::modules::Linear;
use quant::dfdx::prelude::*;
use quant::prelude::*;

// Six problems, six errors, each on its own token.
#[derive(Clone, Debug, QuantizedLayer)]
#[quantized(name = "QLayer", bits = 8)]
pub struct Layer<'a, T> {
    #[quantized(weights)]
    pub proj: Linear<4, 4, f32, Cpu>,
    #[quantized(channels = 4)]
    pub w: Tensor<Rank2<4, 4>, f32, Cpu>,
    pub borrowed: &'a T,
}

fn main() {}
