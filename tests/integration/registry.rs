//! The registry across crates: quantizers marked in `registry-fixture` (another workspace
//! crate) are found here by enum and by name.

// Referencing the crate links it; without this line its registrations would not exist in this
// test binary (see quant_core::registry).
use registry_fixture::FixtureMethods;

use quant::prelude::*;
use quant::registry;

#[test]
fn a_quantizer_from_another_crate_is_found_by_enum_and_builds() {
    let entry = registry::find(
        QuantizationTarget::Weights,
        QuantizationMethod::Symmetric,
        TrainingMethod::FixtureTraining,
    )
    .unwrap();
    assert_eq!(entry.metadata.name, "FixtureWeightsQuantizer");
    assert_eq!(entry.metadata.module_path, "registry_fixture");
    let config = WeightsQuantizerConfig::new(
        TrainingMethod::FixtureTraining,
        QuantizationMethod::Symmetric,
        8,
    );
    let q = entry.build(&config.into()).unwrap();
    let mut y = [0.0; 3];
    let x = [0.3, -0.06, 100.0];
    q.forward(
        QuantizerInput::new(&x, ChannelLayout::per_tensor(3), IntegerGrid::INT8).unwrap(),
        &ParamBank::new(&[0.0; 4], 1).unwrap(),
        &mut y,
    )
    .unwrap();
    assert_eq!(y, [0.25, 0.0, 127.0 * 0.125]);
}

#[test]
fn a_custom_training_method_is_selected_by_name_in_a_config_file() {
    let config: QuantizerConfig = serde_json::from_str(
        r#"{"target": "Weights", "training_method": "FixtureTraining", "method": "Symmetric", "bits": 4}"#,
    )
    .unwrap();
    assert_eq!(config.training_method(), TrainingMethod::FixtureTraining);
    assert!(registry::build(&config).is_ok());
    assert!(TrainingMethod::known().contains(&TrainingMethod::Twin));
}

#[test]
fn two_quantizers_for_one_combination_are_ambiguous() {
    let err = registry::find(
        QuantizationTarget::Activation,
        QuantizationMethod::Uniform,
        TrainingMethod::Twin,
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, QuantError::Ambiguous { count: 2, .. }),
        "{msg}"
    );
    assert!(
        msg.contains("registry_fixture::TwinA") && msg.contains("registry_fixture::TwinB"),
        "{msg}"
    );
    // Only one of them supports Symmetric: no ambiguity there.
    let one = registry::find(
        QuantizationTarget::Activation,
        QuantizationMethod::Symmetric,
        TrainingMethod::Twin,
    )
    .unwrap();
    assert_eq!(one.metadata.name, "TwinB");
}

#[test]
fn not_found_lists_what_is_registered_for_the_target() {
    let err = registry::find(
        QuantizationTarget::Weights,
        QuantizationMethod::Uniform,
        TrainingMethod::FixtureTraining,
    )
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("no quantizer registered for target Weights, method Uniform, training method FixtureTraining"), "{err}");
    assert!(
        err.contains("FixtureTraining [Symmetric]") && err.contains("Lsq [Symmetric, Uniform]"),
        "{err}"
    );
}

#[test]
fn listing_covers_built_ins_and_other_crates() {
    let all = registry::registered();
    let paths: Vec<String> = all.iter().map(|e| e.metadata.path()).collect();
    assert!(
        paths
            .iter()
            .any(|p| p == "quant_dfdx::quantizers::lsq::LsqWeightsQuantizer"),
        "{paths:?}"
    );
    assert!(
        paths.iter().any(|p| p == "registry_fixture::TwinA"),
        "{paths:?}"
    );
}
