#[path = "../support/identity.rs"]
mod support;

use quant::prelude::*;

// `MyTraining` was never declared with `training_methods!` (or its trait is not in scope).
#[mark_quantizer(target = Weights, method = [Symmetric], id = MyTraining)]
#[derive(Debug)]
pub struct Q(QuantizerConfig);
identity_quantizer!(Q: Weights);

fn main() {}
