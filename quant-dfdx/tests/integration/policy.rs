//! Policy files: the example policies under configs/policies, the merge order, and files
//! with deliberate mistakes, each producing an error that names its key path.

use std::path::Path;

use dfdx::prelude::*;
use quant_core::{QuantizationMethod, QuantizationTarget, QuantizerConfig, TrainingMethod};
use quant_dfdx::convert::{convert_model, LayerKind};
use quant_dfdx::layers::QuantizedModuleExt;
use quant_dfdx::layers::Slot;
use quant_dfdx::policy::{ConfigError, Policy};

fn policies_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../configs/policies")
}

fn load(name: &str) -> Policy {
    Policy::from_file(&policies_dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn bits(config: &QuantizerConfig) -> u32 {
    config.bits()
}

#[test]
fn every_example_policy_loads() {
    let mut n = 0;
    for entry in std::fs::read_dir(policies_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            Policy::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
    }
    assert!(n >= 3);
}

#[test]
fn settings_merge_platform_defaults_kinds_and_overrides_in_order() {
    let p = load("academic_w4a4_lsq.toml");
    let first = |slot| p.resolve("0", LayerKind::Linear, slot).unwrap();
    let w = first(Slot::WEIGHTS).unwrap();
    assert_eq!(
        (bits(&w.config), w.config.training_method()),
        (8, TrainingMethod::Lsq)
    );
    assert_eq!(w.observer.to_string(), "MinMax");
    // The platform's Symmetric weights method survives the merge.
    assert_eq!(w.config.method(), QuantizationMethod::Symmetric);
    let second = |slot| p.resolve("2", LayerKind::Linear, slot).unwrap();
    let (w, i) = (second(Slot::WEIGHTS).unwrap(), second(Slot::INPUT).unwrap());
    assert_eq!(
        (bits(&w.config), w.observer.to_string()),
        (4, "Mse".to_string())
    );
    assert!(w.config.per_channel());
    assert_eq!(
        (i.config.target(), bits(&i.config)),
        (QuantizationTarget::Activation, 4)
    );
    assert_eq!(i.config.method(), QuantizationMethod::Uniform);
    assert_eq!(i.observer.to_string(), "LsqInit");
    // Layers without weights get no quantizer unless their kind or an override asks.
    assert!(p
        .resolve("1", LayerKind::MaxPool2d, Slot::INPUT)
        .unwrap()
        .is_none());
    assert!(p.check_unmatched().unwrap().is_empty());

    let m = load("mixed_precision.toml");
    let conv = m.resolve("0.0", LayerKind::Conv2d, Slot::INPUT).unwrap();
    assert_eq!(conv.unwrap().config.training_method(), TrainingMethod::Pact);
    let head = |slot| m.resolve("2.1", LayerKind::Linear, slot).unwrap();
    assert!(
        head(Slot::INPUT).is_none(),
        "`*.1` leaves the head's input float"
    );
    assert_eq!(
        head(Slot::WEIGHTS).unwrap().config.training_method(),
        TrainingMethod::Ste
    );
    let flatten = m.resolve("2.0", LayerKind::Flatten, Slot::INPUT).unwrap();
    assert_eq!(bits(&flatten.unwrap().config), 8);
}

#[test]
fn a_slot_is_addressed_by_name_after_its_group() {
    let p = Policy::from_toml_str(
        &format!(
            "{OK}[kinds.Linear]\nweights = {{ bits = 6 }}\nslots.weights = {{ bits = 8 }}\n\
             [kinds.MaxPool2d]\nslots.input = {{ bits = 8 }}\n\
             [[overrides]]\npattern = \"head\"\nslots.input = \"float\"\n\
             [[overrides]]\npattern = \"mix\"\nslots.gate = {{ bits = 3, per_channel = false }}\n"
        ),
        "slots.toml",
    )
    .unwrap();
    let w = p
        .resolve("fc", LayerKind::Linear, Slot::WEIGHTS)
        .unwrap()
        .unwrap();
    assert_eq!(
        bits(&w.config),
        8,
        "`slots.weights` applies after `weights`"
    );
    let pool = p
        .resolve("pool", LayerKind::MaxPool2d, Slot::INPUT)
        .unwrap();
    assert_eq!(
        bits(&pool.unwrap().config),
        8,
        "a slot turned on by name starts from [input]"
    );
    assert!(p
        .resolve("head", LayerKind::Linear, Slot::INPUT)
        .unwrap()
        .is_none());
    assert!(p
        .resolve("head", LayerKind::Linear, Slot::WEIGHTS)
        .unwrap()
        .is_some());
    // A custom layer's slot by its field's name.
    let gate = Slot {
        name: "gate",
        target: QuantizationTarget::Weights,
        per_channel: false,
        optional: false,
    };
    assert_eq!(
        bits(
            &p.resolve("mix", LayerKind::Custom, gate)
                .unwrap()
                .unwrap()
                .config
        ),
        3
    );
    // A slot name the kind does not have is refused with its key.
    let m = error(
        &format!("{OK}[kinds.Conv2d]\nslots.wieghts = {{ bits = 8 }}\n"),
        "kinds.Conv2d.slots.wieghts",
    );
    assert!(m.contains("wieghts") && m.contains("slot"), "{m}");
}

/// Loads `text` and returns the error message, which must name `key`.
fn error(text: &str, key: &str) -> String {
    let err = Policy::from_toml_str(text, "bad.toml").expect_err(text);
    let msg = err.to_string();
    let named = match &err {
        ConfigError::Parse { key: k, .. } | ConfigError::Invalid { key: k, .. } => k == key,
        _ => false,
    };
    assert!(named, "expected key `{key}` in: {msg}");
    assert!(msg.starts_with(&format!("bad.toml: `{key}`")), "{msg}");
    msg
}

const OK: &str = "[weights]\ntraining_method = \"Lsq\"\nmethod = \"Symmetric\"\nbits = 4\n[input]\ntraining_method = \"Lsq\"\nmethod = \"Uniform\"\nbits = 4\n";

#[test]
fn deliberate_mistakes_name_their_key() {
    assert!(Policy::from_toml_str(OK, "ok.toml").is_ok());

    let m = error(&format!("platfrom = \"Academic\"\n{OK}"), "platfrom");
    assert!(m.contains("unknown field `platfrom`"), "{m}");
    let m = error(
        &OK.replace("bits = 4\n[input]", "bitz = 4\n[input]"),
        "weights.bitz",
    );
    assert!(
        m.contains("unknown field `bitz`") && m.contains("bits"),
        "{m}"
    );
    let m = error(
        &OK.replacen("\"Lsq\"", "\"Lqs\"", 1),
        "weights.training_method",
    );
    assert!(
        m.contains("unknown training method `Lqs`") && m.contains("Lsq, Pact, Ste"),
        "{m}"
    );
    let m = error(&format!("platform = \"TensorRT\"\n{OK}"), "platform");
    assert!(
        m.contains("Academic, GenericInt4, OpenVinoInt8, TensorRtInt8"),
        "{m}"
    );
    let m = error(&OK.replacen("bits = 4", "bits = 1", 1), "weights");
    assert!(
        m.contains("bits = 1 is out of range: quantizers support 2..=16 bits"),
        "{m}"
    );
    let m = error(&OK.replacen("\"Lsq\"", "\"Pact\"", 1), "weights");
    assert!(
        m.contains(
            "no quantizer registered for target Weights, method Symmetric, training method Pact"
        ),
        "{m}"
    );
    assert!(m.contains("Lsq [Symmetric, Uniform]"), "{m}");
    let m = error(&format!("{OK}observer = \"Histogram\"\n"), "input.observer");
    assert!(
        m.contains("MinMax, MovingAverageMinMax, Percentile, Mse, Entropy, LsqInit"),
        "{m}"
    );
    let m = error(
        &format!("{OK}[[overrides]]\npattern = \"[\"\ninput = \"float\"\n"),
        "overrides[0].pattern",
    );
    assert!(m.contains("glob"), "{m}");
    let m = error(
        &format!("{OK}[kinds.MaxPool2d]\nweights = {{ bits = 8 }}\n"),
        "kinds.MaxPool2d.weights",
    );
    assert!(m.contains("MaxPool2d layers have no weights"), "{m}");
    let m = error(
        &OK.replacen("bits = 4", "bits = \"four\"", 1),
        "weights.bits",
    );
    assert!(m.contains("invalid type"), "{m}");
    let m = error(
        &format!("{OK}[[overrides]]\npattern = \"0\"\ninput = \"none\"\n"),
        "overrides[0].input",
    );
    assert!(m.contains("\"float\" or a table"), "{m}");
    let m = error(&OK.replacen("bits = 4\n", "", 1), "weights");
    assert!(m.contains("bits = (missing)"), "{m}");
    let m = error(&format!("{OK}[[overrides]]\npattern = \"2\"\nweights = {{ method = \"Uniform\", training_method = \"Pact\" }}\n"), "overrides[0].weights");
    assert!(m.contains("no quantizer registered"), "{m}");
    let m = error("[weights\nbits = 4", ".");
    assert!(m.contains("at byte"), "{m}");
}

#[test]
fn patterns_that_match_no_layer_fail_conversion_unless_warned() {
    type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);
    let dev = Cpu::default();
    let model = dev.build_module::<Mlp, f32>();
    let strict = Policy::from_toml_str(
        &format!("{OK}[[overrides]]\npattern = \"fc1\"\nweights = {{ bits = 8 }}\n"),
        "s.toml",
    )
    .unwrap();
    let mut q = convert_model(&model, &strict).unwrap();
    let err = strict.check_unmatched().unwrap_err().to_string();
    assert!(err.contains("fc1") && err.contains("0, 2"), "{err}");
    assert_eq!(q.quantizers().unwrap().len(), 4);

    let lenient = Policy::from_toml_str(
        &format!("unmatched_patterns = \"warn\"\n{OK}[[overrides]]\npattern = \"fc1\"\nweights = {{ bits = 8 }}\n"),
        "w.toml",
    )
    .unwrap();
    convert_model(&model, &lenient).unwrap();
    assert_eq!(lenient.check_unmatched().unwrap(), vec!["fc1".to_string()]);
}

#[test]
fn a_layer_left_float_converts_to_exactly_the_float_layer() {
    type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);
    let dev = Cpu::seed_from_u64(5);
    let model = dev.build_module::<Mlp, f32>();
    let p = Policy::from_toml_str(
        &format!("{OK}[[overrides]]\npattern = \"2\"\nweights = \"float\"\ninput = \"float\"\n"),
        "f.toml",
    )
    .unwrap();
    let mut q = convert_model(&model, &p).unwrap();
    let names: Vec<String> = q
        .quantizers()
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["0.input", "0.weights"]);
    let x: Tensor<Rank2<3, 4>, f32, Cpu> = dev.sample_normal();
    q.try_forward_mut(x.clone()).unwrap();
    q.finish_calibration().unwrap();
    // Layer 2 stays float: feeding it layer 0's quantized output equals the float layer's result.
    let h =
        q.1.try_forward(q.0.try_forward(x.clone()).unwrap())
            .unwrap();
    assert_eq!(
        q.2.try_forward(h.clone()).unwrap().array(),
        model.2.forward(h).array()
    );
}

/// LayerNorm and GELU inputs are quantized by default (quant's integer runtime runs them on
/// integers); a platform that computes them in float (TensorRT) leaves them float unless the
/// policy's kind table turns them on. Attention's matmul inputs are quantized under both.
#[test]
fn platforms_say_which_transformer_layers_stay_float() {
    let academic = Policy::from_toml_str("platform = \"Academic\"\n", "a.toml").unwrap();
    let trt = Policy::from_toml_str("platform = \"TensorRtInt8\"\n", "t.toml").unwrap();
    let trt_ln = Policy::from_toml_str(
        "platform = \"TensorRtInt8\"\n[kinds.LayerNorm]\ninput = {}\n",
        "t.toml",
    )
    .unwrap();
    for kind in [LayerKind::LayerNorm, LayerKind::Gelu] {
        assert!(academic.resolve("n", kind, Slot::INPUT).unwrap().is_some());
        assert!(
            trt.resolve("n", kind, Slot::INPUT).unwrap().is_none(),
            "{kind}"
        );
    }
    assert!(trt_ln
        .resolve("n", LayerKind::LayerNorm, Slot::INPUT)
        .unwrap()
        .is_some());
    for slot in [Slot::QUERY, Slot::KEY] {
        assert!(trt
            .resolve("a.scores", LayerKind::AttentionScores, slot)
            .unwrap()
            .is_some());
    }
}

/// Override patterns are globs over whole dotted names; a malformed one is refused with what is
/// wrong and where, before anything is matched.
#[test]
fn name_patterns_match_whole_dotted_names() {
    use quant_dfdx::layers::glob;
    let names = ["0", "0.1", "2.weights", "4.1.0.2", "head", "blocks.3.attn"];
    let matched = |pattern: &str| -> Vec<&str> {
        let p = glob(pattern).unwrap();
        names.iter().copied().filter(|n| p.is_match(n)).collect()
    };
    assert_eq!(matched("0"), ["0"]);
    assert_eq!(matched("0*"), ["0", "0.1"]);
    assert_eq!(matched("*.?"), ["0.1", "4.1.0.2"]);
    assert_eq!(matched("[0-3]*"), ["0", "0.1", "2.weights"]);
    assert_eq!(matched("[!0-3]*"), ["4.1.0.2", "head", "blocks.3.attn"]);
    assert_eq!(matched("{0,head}"), ["0", "head"]);
    assert_eq!(matched("*.{weights,attn}"), ["2.weights", "blocks.3.attn"]);
    assert_eq!(matched("!*.*"), ["0", "head"]);
    assert_eq!(matched("\\*"), Vec::<&str>::new());
    for (pattern, why) in [
        ("[0", "unclosed character class at byte 0"),
        ("0.{a,b", "unclosed brace expansion at byte 2"),
        ("head\\", "at byte 4"),
        (
            "{{{{{{{{{{{a}}}}}}}}}}}",
            "nests deeper than the supported 10 levels",
        ),
    ] {
        let e = glob(pattern).unwrap_err().to_string();
        assert!(e.contains(why) && e.contains(pattern), "{pattern}: {e}");
    }
}
