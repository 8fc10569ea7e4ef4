use quant::dfdx::nn::modules::Linear;
use quant::dfdx::prelude::*;
use quant::prelude::*;

// A model's fields are layers: no field arguments, no bare tensors.
#[derive(QuantizedModel)]
pub struct Model {
    #[quantized(weights)]
    pub fc: Linear<4, 4, f32, Cpu>,
    pub scale: Tensor<Rank1<4>, f32, Cpu>,
}

fn main() {}
