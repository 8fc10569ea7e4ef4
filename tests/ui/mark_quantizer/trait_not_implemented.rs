use quant::prelude::*;

// Claims to be a weights quantizer but implements neither TrainableQuantizer nor
// WeightsQuantizer.
#[mark_quantizer(target = Weights, method = [Symmetric], id = Ste)]
#[derive(Debug)]
pub struct NotAQuantizer {
    pub bits: u32,
}

fn main() {}
