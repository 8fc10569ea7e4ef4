#[path = "../support/identity.rs"]
mod support;

use quant::prelude::*;

// An activation quantizer marked as a weights quantizer.
#[mark_quantizer(target = Weights, method = [Symmetric], id = Ste)]
#[derive(Debug)]
pub struct Q(QuantizerConfig);
identity_quantizer!(Q: Activation);

fn main() {}
