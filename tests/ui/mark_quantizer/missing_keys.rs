use quant::prelude::*;

#[mark_quantizer(method = [Symmetric])]
pub struct Q;

fn main() {}
