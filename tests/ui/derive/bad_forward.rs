use quant::dfdx::nn::modules::Linear;
use quant::dfdx::prelude::*;
use quant::prelude::*;

#[derive(QuantizedModel)]
#[quantized(forward = auto)]
pub struct A {
    pub fc: Linear<4, 4, f32, Cpu>,
}

#[derive(QuantizedModel)]
#[quantized(forward = "manual")]
pub struct B {
    pub fc: Linear<4, 4, f32, Cpu>,
}

#[derive(QuantizedModel)]
#[quantized(forward)]
pub struct C {
    pub fc: Linear<4, 4, f32, Cpu>,
}

fn main() {}
