use quant::prelude::*;

#[mark_quantizer(target = Weights, method = [Symmetric], id = Lsq)]
pub struct Q<T> {
    inner: T,
}

fn main() {}
