//! Learned rounding (AdaRound) and bias correction after calibration: what the policy asks for
//! per kind and per name, each layer's output error against nearest rounding, and the export
//! carrying the learned codes.

use dfdx::prelude::*;
use quant_dfdx::calibration::calibrate;
use quant_dfdx::convert::convert_model;
use quant_dfdx::layers::{QuantizedModuleExt, QuantizerMode};
use quant_dfdx::lower::export_model;
use quant_dfdx::nn::builders;
use quant_dfdx::policy::Policy;
use quant_dfdx::ptq::{refine, WeightRounding};
use quant_runtime::graph::{evaluate, Op, ParamValues};
use quant_runtime::integer::IntegerModel;

use crate::common::assert_integer_matches;

type Cnn = (
    builders::Conv2d<1, 8, 3, 1, 1>,
    ReLU,
    builders::MaxPool2d<2>,
    builders::Flatten<128>,
    Linear<128, 10>,
);

const POLICY: &str = r#"
[weights]
training_method = "Ste"
method = "Symmetric"
bits = 3
per_channel = true
learned_rounding = "AdaRound"
bias_correction = true

[input]
training_method = "Ste"
method = "Uniform"
bits = 8

# The classifier keeps nearest rounding; its bias is still corrected.
[[overrides]]
pattern = "4"
weights = { learned_rounding = "Nearest" }
"#;

const SAMPLES: usize = 64;

/// Smooth random 8x8 images (neighbouring pixels correlate, as in real images).
fn images(dev: &Cpu) -> Vec<f32> {
    let noise: Tensor<Rank4<SAMPLES, 1, 8, 8>, f32, _> = dev.sample_normal();
    let v = noise.as_vec();
    let mut x = vec![0f32; v.len()];
    for s in 0..SAMPLES {
        for y in 0..8 {
            for c in 0..8 {
                let at = |yy: usize, cc: usize| v[s * 64 + yy.min(7) * 8 + cc.min(7)];
                x[s * 64 + y * 8 + c] = (at(y, c) + at(y + 1, c) + at(y, c + 1)) / 3.0;
            }
        }
    }
    x
}

/// The float CNN (random weights) and the images.
fn float_and_images() -> (<Cnn as BuildOnDevice<Cpu, f32>>::Built, Vec<f32>) {
    let dev = Cpu::seed_from_u64(7);
    let float = dev.build_module::<Cnn, f32>();
    let x = images(&dev);
    (float, x)
}

fn layer_output(graph: &quant_runtime::graph::Graph, x: &[f32], layer: &str) -> Vec<f32> {
    let kept = evaluate(graph, x, &|i, _| graph.nodes[i].name == layer)
        .expect("evaluates")
        .kept;
    kept.into_iter().next().expect("the layer's output").1
}

fn mse(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| ((x - y) as f64).powi(2))
        .sum::<f64>()
        / a.len() as f64
}

type QuantizedCnn =
    <<Cnn as BuildOnDevice<Cpu, f32>>::Built as quant_dfdx::convert::Convert>::Quantized;

/// The CNN converted under `policy`, calibrated and refined: what `refine` reported, the model
/// before and after it, the images and their batch.
struct Refined {
    layers: Vec<quant_dfdx::ptq::RefinedLayer>,
    nearest: QuantizedCnn,
    model: QuantizedCnn,
    x: Vec<f32>,
    batch: Tensor<Rank4<SAMPLES, 1, 8, 8>, f32, Cpu>,
}

fn refined_cnn(policy: &str) -> Refined {
    let policy = Policy::from_toml_str(policy, "policy.toml").expect("valid policy");
    let (float, x) = float_and_images();
    let dev = Cpu::default();
    let mut model = convert_model(&float, &policy).expect("converts");
    let batch = dev.tensor_from_vec(x.clone(), (Const, Const, Const, Const));
    calibrate(&mut model, [batch.clone()]).expect("calibrates");
    let nearest = model.clone();
    let (layers, _) = refine(&mut model, &policy, &[1, 8, 8], &x).expect("refines");
    Refined {
        layers,
        nearest,
        model,
        x,
        batch,
    }
}

impl Refined {
    fn layer(&self, name: &str) -> &quant_dfdx::ptq::RefinedLayer {
        self.layers
            .iter()
            .find(|r| r.layer == name)
            .expect("refined")
    }

    /// The graphs of the nearest-rounded and the refined model.
    fn graphs(&self) -> (quant_runtime::graph::Graph, quant_runtime::graph::Graph) {
        let graph = |m: &_| export_model(m, &[1, 8, 8], Default::default()).expect("exports");
        (graph(&self.nearest), graph(&self.model))
    }

    /// Layer `name`'s output against the float layer's, on float inputs for the float model,
    /// as mean squared errors with nearest rounding and with the refined model.
    fn errors_at(&self, name: &str) -> (f64, f64) {
        let mut reference = self.nearest.clone();
        reference
            .set_mode("*", QuantizerMode::Disabled)
            .expect("disables");
        let g_float = export_model(&reference, &[1, 8, 8], Default::default()).expect("exports");
        let (g_nearest, g_learned) = self.graphs();
        let y = layer_output(&g_float, &self.x, name);
        (
            mse(&y, &layer_output(&g_nearest, &self.x, name)),
            mse(&y, &layer_output(&g_learned, &self.x, name)),
        )
    }

    /// The refined export runs on integers and computes what the fake-quantized model does.
    fn assert_integer_model_matches(&self, what: &str) {
        let integer = IntegerModel::new(&self.graphs().1).expect("runs on integers");
        let fake_quantized = self
            .model
            .clone()
            .try_forward(self.batch.clone())
            .expect("forward")
            .as_vec();
        assert_integer_matches(
            &integer.forward(&self.x).expect("integer forward"),
            &fake_quantized,
            what,
        );
    }
}

#[test]
fn learned_rounding_lowers_each_layers_error_and_the_export_carries_its_codes() {
    let r = refined_cnn(POLICY);

    // Per kind and per name: the convolution learned its rounding, the classifier kept nearest
    // rounding, both got bias correction.
    let refined = &r.layers;
    assert_eq!(refined.len(), 2, "{refined:?}");
    assert_eq!(r.layer("0").rounding, WeightRounding::AdaRound);
    assert!(
        r.layer("0").settled.expect("AdaRound ran") > 0.9,
        "{refined:?}"
    );
    assert_eq!(r.layer("4").rounding, WeightRounding::Nearest);
    assert!(r.layer("0").bias_corrected && r.layer("4").bias_corrected);
    for l in refined {
        assert!(l.error_refined <= l.error_nearest, "{l:?}");
    }
    assert!(
        r.layer("0").error_refined < 0.9 * r.layer("0").error_nearest,
        "{refined:?}"
    );

    // Measured directly: the convolution's output is closer to the float layer's with the
    // learned codes than with nearest rounding.
    let (e_nearest, e_learned) = r.errors_at("0");
    assert!(
        e_learned < e_nearest,
        "learned {e_learned} vs nearest {e_nearest}"
    );

    // The export holds the learned codes (some differ from nearest, each by one step), and
    // the integer model computes what the fake-quantized model does.
    let codes =
        |g: &quant_runtime::graph::Graph| match &g.nodes[g.node_index("0").expect("conv")].op {
            Op::Conv2d(quant_runtime::graph::Conv2d { weight, .. }) => match &weight.values {
                ParamValues::Codes { codes, .. } => codes.clone(),
                other => panic!("float weights: {other:?}"),
            },
            other => panic!("not a convolution: {other:?}"),
        };
    let (g_nearest, g_learned) = r.graphs();
    let (a, b) = (codes(&g_nearest), codes(&g_learned));
    let changed = a.iter().zip(&b).filter(|(p, q)| p != q).count();
    assert!(changed > 0, "AdaRound changed no code");
    assert!(
        a.iter().zip(&b).all(|(p, q)| (p - q).abs() <= 1),
        "{a:?} vs {b:?}"
    );
    r.assert_integer_model_matches("refined CNN");
}

#[test]
fn gptq_lowers_the_layers_error_and_the_export_carries_its_codes() {
    // Every layer learns its rounding: the classifier too.
    let text = POLICY.replace("\"AdaRound\"", "\"GPTQ\"").replace(
        "learned_rounding = \"Nearest\"",
        "learned_rounding = \"GPTQ\"",
    );
    let r = refined_cnn(&text);

    // Each layer's error is below nearest rounding's: a little for the convolution (9 inputs
    // leave few columns to absorb an error), by far for the classifier (128).
    let refined = &r.layers;
    for l in refined {
        assert_eq!(l.rounding, WeightRounding::Gptq, "{refined:?}");
        assert_eq!(l.settled, None);
        assert!(l.error_refined < l.error_nearest, "{l:?}");
    }
    assert!(
        r.layer("4").error_refined < 0.2 * r.layer("4").error_nearest,
        "{refined:?}"
    );

    // Measured on the graphs: the classifier's output is closer to the float model's with
    // GPTQ's codes, which the export holds, and the integer model computes what the
    // fake-quantized model does.
    let (e_nearest, e_learned) = r.errors_at("4");
    assert!(
        e_learned < 0.5 * e_nearest,
        "GPTQ {e_learned} vs nearest {e_nearest}"
    );
    r.assert_integer_model_matches("GPTQ CNN");
}

#[test]
fn nothing_runs_unless_asked_and_misplaced_settings_are_refused() {
    let plain = POLICY
        .replace("learned_rounding = \"AdaRound\"\n", "")
        .replace("bias_correction = true\n", "")
        .replace(
            "weights = { learned_rounding = \"Nearest\" }",
            "weights = { bits = 4 }",
        );
    let policy = Policy::from_toml_str(&plain, "policy.toml").expect("valid policy");
    let (float, x) = float_and_images();
    let dev = Cpu::default();
    let mut model = convert_model(&float, &policy).expect("converts");
    let batch = dev.tensor_from_vec(x.clone(), (SAMPLES, Const::<1>, Const::<8>, Const::<8>));
    calibrate(&mut model, [batch]).expect("calibrates");
    let before = export_model(&model, &[1, 8, 8], Default::default()).expect("exports");
    assert!(refine(&mut model, &policy, &[1, 8, 8], &x)
        .expect("nothing to do")
        .0
        .is_empty());
    assert_eq!(
        export_model(&model, &[1, 8, 8], Default::default()).expect("exports"),
        before
    );

    for (text, key, says) in [
        (
            POLICY.replace("bits = 8\n", "bits = 8\nlearned_rounding = \"AdaRound\"\n"),
            "input",
            "only in weights settings",
        ),
        (
            format!("{POLICY}\n[adaround]\niterations = 0\n"),
            "adaround.iterations",
            "1 to 1000000",
        ),
        (
            format!("{POLICY}\n[adaround]\nlearning_rate = nan\n"),
            "adaround.learning_rate",
            "finite",
        ),
        (
            POLICY.replace("\"AdaRound\"", "\"Adaround\""),
            "weights.learned_rounding",
            "GPTQ",
        ),
        (
            format!("{POLICY}\n[gptq]\ndamping = 0\n"),
            "gptq.damping",
            "above 0",
        ),
        (
            format!("{POLICY}\n[gptq]\nact_order = 1\n"),
            "gptq.act_order",
            "bool",
        ),
        (
            format!("{POLICY}\n[gptq]\ndampening = 0.1\n"),
            "dampening",
            "damping",
        ),
    ] {
        let e = Policy::from_toml_str(&text, "policy.toml")
            .expect_err("refused")
            .to_string();
        assert!(e.contains(key) && e.contains(says), "{key}: {e}");
    }
}
