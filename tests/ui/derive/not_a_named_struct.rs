use quant::dfdx::nn::modules::Linear;
use quant::dfdx::prelude::*;
use quant::prelude::*;

#[derive(QuantizedModel)]
pub enum Either {
    Left(Linear<4, 4, f32, Cpu>),
}

#[derive(QuantizedModel)]
pub struct Pair(Linear<4, 4, f32, Cpu>, ReLU);

#[derive(QuantizedLayer)]
#[quantized(input)]
pub struct Unit;

#[derive(QuantizedModel)]
pub struct Empty {}

fn main() {}
