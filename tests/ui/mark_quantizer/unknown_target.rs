use quant::prelude::*;

#[mark_quantizer(target = Weight, method = [Symmetric], id = Lsq)]
pub struct Q;

fn main() {}
