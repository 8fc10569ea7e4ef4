use quant::prelude::*;

#[mark_quantizer(target = Activation, method = [Symmetric, Uniform, Symmetric], id = Lsq)]
pub struct Q;

fn main() {}
