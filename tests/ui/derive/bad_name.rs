use quant::dfdx::prelude::*;
use quant::prelude::*;

#[derive(Clone, Debug, QuantizedLayer)]
#[quantized(name = "QA")]
pub struct A {
    #[quantized(weights)]
    pub w: Tensor<Rank1<4>, f32, Cpu>,
}

#[derive(Clone, Debug, QuantizedLayer)]
#[quantized(name = wrappers::QB)]
pub struct B {
    #[quantized(weights)]
    pub w: Tensor<Rank1<4>, f32, Cpu>,
}

#[derive(QuantizedModel)]
#[quantized(name = C)]
pub struct C {
    pub a: A,
}

#[derive(QuantizedModel)]
#[quantized(name)]
pub struct D {
    pub a: A,
}

fn main() {}
