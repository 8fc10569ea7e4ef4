use quant::prelude::*;

#[mark_quantizer(target = "Weights", method = [Symmetric], id = 3)]
pub struct Q;

fn main() {}
