#[path = "../support/identity.rs"]
mod support;

use quant::prelude::*;

quant::training_methods!(pub trait MyMethods { MyTraining });

// `method = Uniform` without brackets means `method = [Uniform]`; `crate = ...` points at
// quant-core through the facade; `id = TrainingMethod::MyTraining` is the long form.
#[mark_quantizer(target = Activation, method = Uniform, id = TrainingMethod::MyTraining, crate = ::quant)]
#[derive(Debug)]
pub struct Marked(QuantizerConfig);
identity_quantizer!(Marked: Activation);

const METHODS: &[QuantizationMethod] = Marked::METADATA.methods;

fn main() {
    assert_eq!(METHODS, &[QuantizationMethod::Uniform]);
    let entry = quant::registry::find(
        QuantizationTarget::Activation,
        QuantizationMethod::Uniform,
        TrainingMethod::MyTraining,
    )
    .unwrap();
    assert_eq!(entry.metadata.name, "Marked");
    let config: QuantizerConfig =
        ActivationQuantizerConfig::new(TrainingMethod::MyTraining, QuantizationMethod::Uniform, 8).into();
    assert!(entry.build(&config).is_ok());
}
