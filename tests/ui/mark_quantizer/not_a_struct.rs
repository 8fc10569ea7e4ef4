use quant::prelude::*;

#[mark_quantizer(target = Weights, method = [Symmetric], id = Lsq)]
pub enum Q {
    A,
}

fn main() {}
