use quant::dfdx::prelude::*;
use quant::prelude::*;

// The wrapper names its quantizers `<field>_quantizer` and `input_quantizer`, next to the
// layer's own tensors: names that would collide are rejected.
#[derive(Clone, Debug, QuantizedLayer)]
#[quantized(input)]
pub struct Layer {
    #[quantized(weights)]
    pub input: Tensor<Rank1<4>, f32, Cpu>,
    #[quantized(weights)]
    pub w: Tensor<Rank1<4>, f32, Cpu>,
    pub w_quantizer: Tensor<Rank1<4>, f32, Cpu>,
}

fn main() {}
