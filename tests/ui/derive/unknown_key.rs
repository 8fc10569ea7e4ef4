use quant::dfdx::prelude::*;
use quant::prelude::*;

// A typo on the struct, a typo on a field, and keys of the other derive (with a hint).
#[derive(Clone, Debug, QuantizedLayer)]
#[quantized(inputs, forward = manual)]
pub struct Layer {
    #[quantized(weight)]
    pub w: Tensor<Rank2<4, 4>, f32, Cpu>,
}

#[derive(QuantizedModel)]
#[quantized(input)]
pub struct Model {
    pub layer: Layer,
}

fn main() {}
