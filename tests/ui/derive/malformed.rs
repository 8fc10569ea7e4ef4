use quant::dfdx::prelude::*;
use quant::prelude::*;

// A bare attribute, a name-value attribute, flags given values, a key given twice.
#[derive(Clone, Debug, QuantizedLayer)]
#[quantized]
#[quantized = "input"]
#[quantized(input = true, name = QA, name = QB)]
pub struct Layer {
    #[quantized(weights = yes)]
    pub w: Tensor<Rank1<4>, f32, Cpu>,
}

fn main() {}
