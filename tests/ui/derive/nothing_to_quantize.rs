use quant::dfdx::prelude::*;
use quant::prelude::*;

// No weights field and no `input`: the wrapper would quantize nothing.
#[derive(Clone, Debug, QuantizedLayer)]
pub struct Layer {
    pub w: Tensor<Rank2<4, 4>, f32, Cpu>,
}

fn main() {}
