use quant::dfdx::prelude::*;
use quant::prelude::*;

// `channels` must be the weight's first dimension: checked by the type system.
#[derive(Clone, Debug, QuantizedLayer)]
pub struct Layer<const I: usize, const O: usize> {
    #[quantized(weights, channels = I)]
    pub w: Tensor<(Const<O>, Const<I>), f32, Cpu>,
}

fn main() {}
