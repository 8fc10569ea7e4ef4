//! pytorch-quantization's "Creating Custom Quantized Modules" story, in Rust.
//!
//! NVIDIA's tool wraps a module in a quantized subclass: `QuantMaxPool2d` quantizes the input of
//! a module that has only inputs, `QuantLinear` quantizes the input and the weights. Here the
//! wrappers are derived: `#[derive(QuantizedLayer)]` on a user's own layer generates its
//! quantized wrapper, the user keeps writing the float forward pass as an ordinary dfdx module.
//!
//! 1. An input-only module (`HardTanh`, `#[quantized(input)]`) and a module with weights
//!    (`LowRankLinear`, a factorised linear map whose two factors are quantized per channel).
//! 2. Wrapping by hand (`QLowRankLinear::new`): until configured, exactly the float layer.
//! 3. Conversion by a policy, calibration, the quantizers chosen and their scales, disabling
//!    one quantizer by name (NVIDIA's `module.input_quantizer.disable()`).
//! 4. A model (`#[derive(QuantizedModel)]`) using both layers, trained a few Adam steps with
//!    fake quantization: the loss, the weights and the quantizers' scales move.
//!
//! Run: `cargo run --release --example custom_wrapper`

use dfdx::nn::modules::Linear;
use dfdx::optim::{Adam, AdamConfig};
use dfdx::prelude::*;
use dfdx::tensor::CpuError;

use quant::convert::{convert_model, LayerKind};
use quant::layers::{
    QuantizedModule, QuantizedModuleExt, QuantizerControl, QuantizerMode, QuantizerSpec, Slot,
};
use quant::observers::ObserverConfig;
use quant::prelude::*;

// ----- 1. the user's float layers ------------------------------------------------------------------

/// `clamp(x, -1, 1)`: a module with only an input, like a pooling layer.
#[derive(Clone, Debug, Default, QuantizedLayer)]
#[quantized(input)]
pub struct HardTanh {}

impl<S: Shape, T: Tape<f32, Cpu>> Module<Tensor<S, f32, Cpu, T>> for HardTanh {
    type Output = Tensor<S, f32, Cpu, T>;
    type Error = CpuError;

    fn try_forward(&self, x: Tensor<S, f32, Cpu, T>) -> Result<Self::Output, CpuError> {
        x.try_clamp(-1.0, 1.0)
    }
}

impl NonMutableModule for HardTanh {}

/// `y = (x·Aᵀ)·Bᵀ + bias`, a linear map of rank `R` from `I` to `O` features: `down` (`[R, I]`)
/// and `up` (`[O, R]`) are quantized per output channel, the bias stays float.
#[derive(Clone, Debug, QuantizedLayer)]
#[quantized(input)]
pub struct LowRankLinear<const I: usize, const O: usize, const R: usize> {
    /// The projection down to rank `R`.
    #[quantized(weights, channels = R)]
    pub down: Tensor<Rank2<R, I>, f32, Cpu>,
    /// The projection up to `O` features.
    #[quantized(weights, channels = O)]
    pub up: Tensor<Rank2<O, R>, f32, Cpu>,
    /// The bias.
    pub bias: Tensor<Rank1<O>, f32, Cpu>,
}

impl<B: Dim, const I: usize, const O: usize, const R: usize, T: Tape<f32, Cpu> + Merge<T>>
    Module<Tensor<(B, Const<I>), f32, Cpu, T>> for LowRankLinear<I, O, R>
{
    type Output = Tensor<(B, Const<O>), f32, Cpu, T>;
    type Error = CpuError;

    fn try_forward(&self, x: Tensor<(B, Const<I>), f32, Cpu, T>) -> Result<Self::Output, CpuError> {
        // The weights are read with `retaped`: inside the wrapper they are the quantized ones.
        let h = x.try_matmul(self.down.retaped::<T>().try_permute::<_, Axes2<1, 0>>()?)?;
        let y = h.try_matmul(self.up.retaped::<T>().try_permute::<_, Axes2<1, 0>>()?)?;
        let shape = *y.shape();
        y.try_add(self.bias.retaped::<T>().try_broadcast_like(&shape)?)
    }
}

impl<const I: usize, const O: usize, const R: usize> NonMutableModule for LowRankLinear<I, O, R> {}

/// A model using both, written dfdx-style.
#[derive(Clone, Debug, QuantizedModel)]
pub struct Regressor {
    /// 16 → 12 features through rank 4.
    pub mix: LowRankLinear<16, 12, 4>,
    /// Bounded activation, input quantized.
    pub act: HardTanh,
    /// Readout.
    pub out: Linear<12, 2, f32, Cpu>,
}

// ----- the policy -----------------------------------------------------------------------------------

fn spec(config: impl Into<QuantizerConfig>) -> QuantizerSpec {
    QuantizerSpec {
        config: config.into(),
        observer: ObserverConfig::MinMax,
    }
}

/// LSQ everywhere (trainable scales): 4-bit weights per channel, 8-bit inputs; the bounded
/// activation's input on 6 bits.
fn policy(name: &str, _kind: LayerKind, slot: Slot) -> quant::Result<Option<QuantizerSpec>> {
    let input_bits = if name.ends_with("act") { 6 } else { 8 };
    Ok(Some(match slot.target {
        QuantizationTarget::Weights => spec(WeightsQuantizerConfig::new(
            TrainingMethod::Lsq,
            QuantizationMethod::Symmetric,
            4,
        )),
        QuantizationTarget::Activation => spec(ActivationQuantizerConfig::new(
            TrainingMethod::Lsq,
            QuantizationMethod::Symmetric,
            input_bits,
        )),
    }))
}

fn print_quantizers(model: &mut impl QuantizedModule) -> quant::Result<()> {
    model.visit_slots("", &mut |s| {
        let (name, q) = (s.name(), s.quantizer);
        let Some(d) = q.describe() else {
            println!("  {name:<28} float");
            return Ok(());
        };
        let scales = q
            .qparams()?
            .map(|p| p.scales().to_vec())
            .unwrap_or_default();
        let range = if scales.is_empty() {
            "uncalibrated".to_string()
        } else {
            let lo = scales.iter().copied().fold(f32::INFINITY, f32::min);
            let hi = scales.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            format!("scale {lo:.5}..{hi:.5} ({} values)", scales.len())
        };
        println!(
            "  {name:<28} {:<4} {:<9} {} bits {:<11} {:<11} {range}",
            d.training_method.name(),
            d.method.to_string(),
            d.bits,
            if d.per_channel {
                "per channel"
            } else {
                "per tensor"
            },
            d.mode.to_string(),
        );
        Ok(())
    })
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0, |m, (x, y)| m.max((x - y).abs()))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Cpu::seed_from_u64(7);
    let x: Tensor<Rank2<64, 16>, f32, _> = dev.sample_normal();

    // ----- 2. wrapping by hand -----
    println!("== wrapping by hand");
    let mut low_rank = LowRankLinear::<16, 12, 4>::build(&dev)?;
    low_rank.bias = dev.sample_normal::<Rank1<12>>() * 0.1;
    let wrapped = QLowRankLinear::new(low_rank.clone(), &dev);
    let same = wrapped.try_forward(x.clone())?.as_vec() == low_rank.forward(x.clone()).as_vec();
    println!("  unconfigured QLowRankLinear computes the float layer exactly: {same}");
    let clip = QHardTanh::new(HardTanh {}, &dev);
    println!(
        "  QHardTanh::new gives an unconfigured (pass-through) input quantizer: mode {}",
        clip.input_quantizer.mode()
    );

    // ----- 3. conversion, calibration, per-quantizer control -----
    println!("\n== converted by the policy (a user's layer is LayerKind::Custom)");
    let mut q = convert_model(&low_rank, &policy)?;
    print_quantizers(&mut q)?;
    q.try_forward_mut(x.clone())?;
    let n = q.finish_calibration()?;
    println!("\n== calibrated {n} quantizers on one batch (weights calibrate from themselves)");
    print_quantizers(&mut q)?;
    let float_y = low_rank.forward(x.clone()).as_vec();
    let quant_y = q.try_forward(x.clone())?.as_vec();
    println!(
        "  W4A8 output vs float: max |diff| = {:.4}",
        max_abs_diff(&float_y, &quant_y)
    );
    q.input_quantizer.set_mode(QuantizerMode::Disabled)?;
    let no_input_q = q.try_forward(x.clone())?.as_vec();
    println!(
        "  input quantizer disabled by hand (W4, float input): max |diff| = {:.4}",
        max_abs_diff(&float_y, &no_input_q)
    );

    // ----- 4. a model with both layers, trained with fake quantization -----
    println!("\n== Regressor {{ mix: LowRankLinear, act: HardTanh, out: Linear }}");
    let mut float = Regressor::build(&dev)?;
    float.mix = low_rank;
    let teacher = Regressor::build(&dev)?;
    let target = teacher.forward(x.clone());

    let mut model = convert_model(&float, &policy)?;
    model.try_forward_mut(x.clone())?;
    model.finish_calibration()?;
    model.set_mode("*", QuantizerMode::Training)?;
    print_quantizers(&mut model)?;

    let up_scales = model.mix.up_quantizer.learned.as_vec();
    let act_scale = model.act.input_quantizer.learned.as_vec();
    let up = model.mix.layer.up.as_vec();
    let mut opt = Adam::new(
        &model,
        AdamConfig {
            lr: 1e-3,
            ..Default::default()
        },
    );
    println!("\n== QAT, Adam, 30 steps");
    for step in 0..30 {
        let grads = model.alloc_grads();
        let y = model.try_forward_mut(x.clone().traced(grads))?;
        let loss = mse_loss(y, target.clone());
        if step % 5 == 0 || step == 29 {
            println!("  step {step:>2}: loss {:.5}", loss.array());
        }
        opt.update(&mut model, &loss.backward())?;
    }
    let moved = |before: &[f32], after: &[f32]| max_abs_diff(before, after);
    println!(
        "  mix.up weights moved by up to {:.4}; mix.up scales by up to {:.5}; \
         act.input scale by {:.5}",
        moved(&up, &model.mix.layer.up.as_vec()),
        moved(&up_scales, &model.mix.up_quantizer.learned.as_vec()),
        moved(&act_scale, &model.act.input_quantizer.learned.as_vec()),
    );
    println!("\n== after training");
    print_quantizers(&mut model)?;
    Ok(())
}
