//! Quantizer configs: round trips through JSON, unknown keys refused, activation signedness.

use quant_core::{
    ActivationQuantizerConfig, QuantizationMethod, QuantizerConfig, TrainingMethod,
    WeightsQuantizerConfig,
};

#[test]
fn config_round_trips_and_rejects_unknown_keys() {
    let cfg = QuantizerConfig::Weights(WeightsQuantizerConfig::new(
        TrainingMethod::Lsq,
        QuantizationMethod::Uniform,
        4,
    ));
    let json = serde_json::to_string(&cfg).unwrap();
    assert!(json.contains("\"target\":\"Weights\""), "{json}");
    assert_eq!(serde_json::from_str::<QuantizerConfig>(&json).unwrap(), cfg);
    let bad =
        r#"{"target":"Weights","training_method":"Lsq","method":"Uniform","bits":4,"bitz":3}"#;
    let err = serde_json::from_str::<QuantizerConfig>(bad)
        .unwrap_err()
        .to_string();
    assert!(err.contains("bitz"), "{err}");
}

#[test]
fn activation_signedness() {
    let mut cfg =
        ActivationQuantizerConfig::new(TrainingMethod::Ste, QuantizationMethod::Symmetric, 2);
    assert!(!cfg.grid(false).unwrap().signed());
    assert!(cfg.grid(true).unwrap().signed());
    cfg.signed = Some(false);
    assert!(!cfg.grid(true).unwrap().signed());
    cfg.method = QuantizationMethod::Uniform;
    cfg.signed = Some(true);
    assert!(!cfg.grid(true).unwrap().signed());
}
