use quant::prelude::*;

#[mark_quantizer(target = Weights, method = [Symmetric], id = Lsq, colour = Red)]
pub struct Q;

fn main() {}
