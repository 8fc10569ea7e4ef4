use quant::prelude::*;

#[mark_quantizer(target = Weights, method = [Symetric, Uniform], id = Lsq)]
pub struct Q;

fn main() {}
