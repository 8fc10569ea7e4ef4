use quant::dfdx::nn::modules::Linear;
use quant::dfdx::prelude::*;
use quant::prelude::*;

#[derive(Clone, Debug, QuantizedLayer)]
pub struct Layer {
    #[quantized(weights)]
    pub proj: Linear<4, 4, f32, Cpu>,
    #[quantized(weights)]
    pub scale: f32,
}

fn main() {}
