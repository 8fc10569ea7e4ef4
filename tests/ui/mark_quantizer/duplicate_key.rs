use quant::prelude::*;

#[mark_quantizer(target = Weights, method = [Symmetric], target = Activation, id = Lsq)]
pub struct Q;

fn main() {}
