//! SmoothQuant before calibration (`smoothing = α` on the input slots of Linear layers a
//! LayerNorm feeds): the float model computes the same, the activation's channels come closer
//! in range, the per-tensor 4-bit activations lose less, and bad requests are refused with
//! nothing changed.

use dfdx::prelude::*;
use quant_dfdx::calibration::calibrate;
use quant_dfdx::convert::convert_model;
use quant_dfdx::layers::{QuantizedModuleExt, QuantizerMode};
use quant_dfdx::lower::export_model;
use quant_dfdx::nn::builders;
use quant_dfdx::policy::Policy;
use quant_dfdx::ptq::smooth;
use quant_runtime::graph::{evaluate, Graph};

/// A pre-norm attention and a pre-norm head reading the mean of the tokens; the ReLU'd Linear
/// reads no LayerNorm.
type Net = (
    (builders::LayerNorm<8>, builders::MultiHeadAttention<8, 2>),
    (
        builders::LayerNorm<8>,
        builders::MeanTokens,
        builders::Linear<8, 6>,
        ReLU,
        builders::Linear<6, 3>,
    ),
);
type Float = <Net as BuildOnDevice<Cpu, f32>>::Built;

const TOKENS: usize = 5;
const SAMPLES: usize = 48;

const POLICY: &str = r#"
[weights]
training_method = "Ste"
method = "Symmetric"
bits = 8
per_channel = true

[input]
training_method = "Ste"
method = "Uniform"
bits = 8
observer = "MinMax"
"#;

/// The policy with `extra` appended.
fn policy(extra: &str) -> Policy {
    Policy::from_toml_str(&format!("{POLICY}\n{extra}"), "policy.toml").expect("valid policy")
}

/// The Linear layers' inputs at 4 bits, smoothed.
const SMOOTH: &str = "[kinds.Linear]\ninput = { bits = 4, smoothing = 0.5 }\n";
/// The same, not smoothed.
const PLAIN: &str = "[kinds.Linear]\ninput = { bits = 4 }\n";

/// A float model whose LayerNorms have two channels scaled 25x and 12x (the outlier channels
/// of trained transformers), and token sequences.
fn float_and_samples() -> (Float, Vec<f32>) {
    let dev = Cpu::seed_from_u64(11);
    let mut float = dev.build_module::<Net, f32>();
    let mut gamma = vec![1.0f32; 8];
    gamma[2] = 25.0;
    gamma[5] = -12.0;
    float.0 .0.gamma = dev.tensor(gamma.clone());
    float.1 .0.gamma = dev.tensor(gamma);
    let x: Tensor<Rank3<SAMPLES, TOKENS, 8>, f32, _> = dev.sample_normal();
    (float, x.as_vec())
}

fn float_graph<M: quant_dfdx::layers::QuantizedModule + Clone>(model: &M) -> Graph {
    let mut reference = model.clone();
    reference.set_mode("*", QuantizerMode::Disabled).unwrap();
    export_model(&reference, &[TOKENS, 8], Default::default()).unwrap()
}

fn outputs(graph: &Graph, x: &[f32]) -> Vec<f32> {
    evaluate(graph, x, &|_, _| false).unwrap().output
}

fn mse(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| f64::from(x - y).powi(2))
        .sum::<f64>()
        / a.len() as f64
}

#[test]
fn smoothing_keeps_the_float_model_and_narrows_the_activations() {
    let (float, x) = float_and_samples();
    let p = policy(SMOOTH);
    let mut q = convert_model(&float, &p).unwrap();
    let before = outputs(&float_graph(&q), &x);
    let smoothing = smooth(&mut q, &p, &[TOKENS, 8], &x).unwrap();

    // Both LayerNorms, each with every Linear reading it; not the attention's output
    // projection or the Linear after the ReLU, which asked too (`[kinds.Linear]`).
    assert_eq!(smoothing.not_applied, ["0.1.w_o", "1.4"]);
    let smoothed = &smoothing.layer_norms;
    let pairs: Vec<(&str, Vec<&str>)> = smoothed
        .iter()
        .map(|s| {
            let linears = s.linears.iter().map(String::as_str).collect();
            (s.layer_norm.as_str(), linears)
        })
        .collect();
    assert_eq!(
        pairs,
        [
            ("0.0", vec!["0.1.w_q", "0.1.w_k", "0.1.w_v"]),
            ("1.0", vec!["1.2"]),
        ]
    );
    for s in smoothed {
        assert_eq!(s.strength, 0.5);
        assert!(
            s.spread_before > 4.0 && s.spread_after < 0.7 * s.spread_before,
            "{s:?}"
        );
    }

    // The float model computes what it did.
    let after = outputs(&float_graph(&q), &x);
    let scale = before.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (a, b) in after.iter().zip(&before) {
        assert!((a - b).abs() <= 1e-4 * scale, "{a} against {b}");
    }

    // Calibrated, the Linear layers' 4-bit inputs lose less than without smoothing.
    let plain_policy = policy(PLAIN);
    let mut plain = convert_model(&float, &plain_policy).unwrap();
    assert!(smooth(&mut plain, &plain_policy, &[TOKENS, 8], &x)
        .unwrap()
        .is_empty());
    let dev = Cpu::default();
    let batches = |x: &[f32]| {
        x.chunks(16 * TOKENS * 8)
            .map(|c| {
                dev.tensor_from_vec(
                    c.to_vec(),
                    (c.len() / (TOKENS * 8), Const::<TOKENS>, Const::<8>),
                )
            })
            .collect::<Vec<_>>()
    };
    calibrate(&mut q, batches(&x)).unwrap();
    calibrate(&mut plain, batches(&x)).unwrap();
    let quantized = |m: &_| {
        outputs(
            &export_model(m, &[TOKENS, 8], Default::default()).unwrap(),
            &x,
        )
    };
    let (error_smoothed, error_plain) = (
        mse(&quantized(&q), &before),
        mse(&quantized(&plain), &before),
    );
    assert!(
        error_smoothed < 0.5 * error_plain,
        "output MSE {error_smoothed} smoothed against {error_plain} without"
    );
}

#[test]
fn linear_layers_reading_one_layer_norm_must_agree() {
    let (float, x) = float_and_samples();
    let p = policy(&format!(
        "{SMOOTH}\n[[overrides]]\npattern = \"0.1.w_k\"\ninput = {{ smoothing = 0.25 }}\n"
    ));
    let mut q = convert_model(&float, &p).unwrap();
    let graph = float_graph(&q);
    let e = smooth(&mut q, &p, &[TOKENS, 8], &x)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`0.1.w_k`") && e.contains("LayerNorm `0.0`") && e.contains("0.25"),
        "{e}"
    );
    assert_eq!(float_graph(&q), graph, "nothing changed");

    // A float input does not take part: the others are smoothed.
    let p = policy(&format!(
        "{SMOOTH}\n[[overrides]]\npattern = \"0.1.w_k\"\ninput = \"float\"\n"
    ));
    let mut q = convert_model(&float, &p).unwrap();
    let smoothed = smooth(&mut q, &p, &[TOKENS, 8], &x).unwrap().layer_norms;
    assert_eq!(smoothed[0].linears, ["0.1.w_q", "0.1.w_k", "0.1.w_v"]);
}

#[test]
fn smoothing_is_refused_where_it_means_nothing() {
    for (extra, key, says) in [
        (
            "[kinds.Linear]\nweights = { smoothing = 0.5 }\n",
            "smoothing",
            "only in input settings",
        ),
        (
            "[kinds.Linear]\ninput = { smoothing = 1.5 }\n",
            "smoothing",
            "from 0 to 1",
        ),
        (
            "[kinds.Linear]\ninput = { smoothing = -0.1 }\n",
            "smoothing",
            "from 0 to 1",
        ),
        (
            "[kinds.Linear]\ninput = { smoothing = nan }\n",
            "smoothing",
            "from 0 to 1",
        ),
    ] {
        let e = Policy::from_toml_str(&format!("{POLICY}\n{extra}"), "policy.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains(key) && e.contains(says), "{extra}: {e}");
    }
    // Asked only of a Linear no LayerNorm feeds: nothing changes, and the result says so.
    let (float, x) = float_and_samples();
    let p = policy("[[overrides]]\npattern = \"1.4\"\ninput = { smoothing = 0.5 }\n");
    let mut q = convert_model(&float, &p).unwrap();
    let graph = float_graph(&q);
    let smoothing = smooth(&mut q, &p, &[TOKENS, 8], &x).unwrap();
    assert!(smoothing.layer_norms.is_empty());
    assert_eq!(smoothing.not_applied, ["1.4"]);
    assert_eq!(float_graph(&q), graph);
}
