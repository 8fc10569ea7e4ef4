use quant::prelude::*;

#[mark_quantizer(target = Weights, method = [], id = Lsq)]
pub struct Q;

fn main() {}
