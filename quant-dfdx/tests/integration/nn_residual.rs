//! `quant_dfdx::nn::Residual`: dfdx's `Residual` bit for bit, in training and in evaluation,
//! and it converts to the same quantized layers.

use crate::common::all_same;
use dfdx::prelude::*;
use quant_dfdx::convert::{convert_model, LayerKind};
use quant_dfdx::layers::QuantizedModule;
use quant_dfdx::nn::{builders as qnn, Residual};
use quant_dfdx::policy::Policy;

/// A ViT block's MLP branch.
type Branch = <(
    qnn::LayerNorm<8>,
    qnn::Linear<8, 12>,
    qnn::Gelu,
    qnn::Linear<12, 8>,
) as BuildOnDevice<Cpu, f32>>::Built;
type Input = Tensor<(usize, Const<5>, Const<8>), f32, Cpu>;
type Traced = Tensor<(usize, Const<5>, Const<8>), f32, Cpu, OwnedTape<f32, Cpu>>;

/// Output, the input's gradient and the branch's parameters' gradients of `(m(x) · w).sum()`
/// in training (`forward_mut`), then the output in evaluation (`forward`).
fn run<M>(model: &mut M, branch: fn(&M) -> &Branch, x: &Input, w: &Input) -> Vec<Vec<f32>>
where
    M: ModuleMut<Traced, Output = Traced> + Module<Input, Output = Input>,
{
    let y = model.forward_mut(x.clone().leaky_traced());
    let out = y.as_vec();
    let grads = (y * w.clone()).sum().backward();
    let b = branch(model);
    vec![
        out,
        grads.get(x).as_vec(),
        grads.get(&b.0.gamma).as_vec(),
        grads.get(&b.1.weight).as_vec(),
        grads.get(&b.3.bias).as_vec(),
        model.forward(x.clone()).as_vec(),
    ]
}

#[test]
fn outputs_and_gradients_are_dfdx_residuals_bit_for_bit() {
    let dev = Cpu::seed_from_u64(5);
    let branch = dev.build_module::<(
        qnn::LayerNorm<8>,
        qnn::Linear<8, 12>,
        qnn::Gelu,
        qnn::Linear<12, 8>,
    ), f32>();
    let mut theirs = dfdx::nn::modules::Residual(branch.clone());
    let mut ours = Residual(branch);
    let what = [
        "outputs",
        "input gradients",
        "gamma gradients",
        "weight gradients",
        "bias gradients",
        "outputs in evaluation",
    ];
    for (batch, spread) in [(1, 1e-3f32), (7, 1.0), (64, 50.0)] {
        let x: Input = dev.sample_normal_like(&(batch, Const, Const)) * spread;
        let w: Input = dev.sample_normal_like(&(batch, Const, Const));
        let a = run(&mut ours, |m| &m.0, &x, &w);
        let b = run(&mut theirs, |m| &m.0, &x, &w);
        for (what, (a, b)) in what.iter().zip(a.iter().zip(&b)) {
            assert!(all_same(a, b), "{what}, batch {batch}, spread {spread}");
        }
    }
}

#[test]
fn it_converts_to_the_layers_dfdx_residual_converts_to() {
    let dev = Cpu::seed_from_u64(6);
    let branch = dev.build_module::<(qnn::Linear<4, 4>, ReLU), f32>();
    let first = dev.build_module::<qnn::Linear<4, 4>, f32>();
    let ours = (first.clone(), Residual(branch.clone()));
    let theirs = (first, dfdx::nn::modules::Residual(branch));
    let policy = Policy::from_toml_str(
        "[weights]\ntraining_method = \"Lsq\"\nmethod = \"Symmetric\"\nbits = 8\n\
         [input]\ntraining_method = \"Lsq\"\nmethod = \"Uniform\"\nbits = 8\n",
        "policy",
    )
    .unwrap();
    let named = |q: &mut dyn QuantizedModule| {
        let mut out = Vec::new();
        q.visit_slots("", &mut |s| {
            out.push((s.name(), s.kind));
            Ok(())
        })
        .unwrap();
        out
    };
    let a = named(&mut convert_model(&ours, &policy).unwrap());
    assert_eq!(a, named(&mut convert_model(&theirs, &policy).unwrap()));
    assert!(
        a.contains(&("1.input".to_string(), LayerKind::Add)),
        "{a:?}"
    );
}
