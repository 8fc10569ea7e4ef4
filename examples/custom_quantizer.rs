//! MCT's "make your own trainable quantizer" story, in Rust.
//!
//! Declares a custom training method `MyTraining`, marks a weights quantizer and an activation
//! quantizer with `#[mark_quantizer]`, selects each from the registry by enum, trains the
//! weights quantizer's learnable threshold (the reference's `new_param`) on a dfdx tensor,
//! converts both to inferable quantizers and quantizes to integers.
//!
//! Run: `cargo run --release --example custom_quantizer`

use std::sync::Arc;

use dfdx::optim::{Adam, AdamConfig};
use dfdx::prelude::*;
use quant::prelude::*;
use quant::{dfdx_ops, kernels, registry, symmetric_scale};

quant::training_methods!(
    /// The training methods this program adds to quant's built-in ones.
    pub trait MyMethods { MyTraining }
);

/// The shared engine of both quantizers: symmetric quantization whose threshold `T` learns
/// (slot 0, one value per channel, or one per tensor). `scale = T / 2^(b-1)` on a signed grid,
/// `T / 2^b` on an unsigned one (MCT's convention). The threshold's gradient is LSQ's scale
/// gradient times `∂scale/∂T`.
#[derive(Debug, Clone)]
pub struct LearnedThreshold {
    config: QuantizerConfig,
}

impl LearnedThreshold {
    fn new(config: QuantizerConfig) -> Result<Self, QuantError> {
        config.check_option_keys("LearnedThreshold", &[])?;
        config.grid(false)?;
        Ok(LearnedThreshold { config })
    }

    fn scales(
        &self,
        params: &ParamBank<'_>,
        grid: IntegerGrid,
        axis: Option<usize>,
    ) -> Result<Vec<f32>, QuantError> {
        params
            .values(0, axis)
            .iter()
            .map(|t| symmetric_scale(*t, grid))
            .collect()
    }
}

impl TrainableQuantizer for LearnedThreshold {
    fn config(&self) -> &QuantizerConfig {
        &self.config
    }

    fn parameters(&self) -> Vec<ParamDecl> {
        vec![ParamDecl {
            name: "threshold",
            trainable: true,
        }]
    }

    fn set_qparams(
        &self,
        qparams: &QParams,
        grid: IntegerGrid,
        params: &mut ParamBankMut<'_>,
    ) -> Result<(), QuantError> {
        let thresholds: Vec<f32> = qparams
            .scales()
            .iter()
            .map(|s| s * grid.threshold_divisor())
            .collect();
        params.set(0, &thresholds)
    }

    fn qparams(
        &self,
        params: &ParamBank<'_>,
        grid: IntegerGrid,
        axis: Option<usize>,
    ) -> Result<QParams, QuantError> {
        let scales = self.scales(params, grid, axis)?;
        let zeros = vec![0; scales.len()];
        QParams::new(scales, zeros, axis)
    }

    fn forward(
        &self,
        x: QuantizerInput<'_>,
        params: &ParamBank<'_>,
        y: &mut [f32],
    ) -> Result<(), QuantError> {
        let axis = if x.layout.channels > 1 {
            x.layout.axis
        } else {
            None
        };
        let scales = self.scales(params, x.grid, axis)?;
        let zeros = vec![0; scales.len()];
        kernels::fake_quantize_affine_into(
            x.data,
            y,
            x.layout,
            &scales,
            &zeros,
            x.grid.quant_min(),
            x.grid.quant_max(),
            self.config.rounding(),
        )
    }

    fn backward(
        &self,
        x: QuantizerInput<'_>,
        params: &ParamBank<'_>,
        dy: &[f32],
        dx: &mut [f32],
        dparams: &mut ParamBankMut<'_>,
    ) {
        let axis = if x.layout.channels > 1 {
            x.layout.axis
        } else {
            None
        };
        let Ok(scales) = self.scales(params, x.grid, axis) else {
            return;
        };
        let zeros = vec![0.0; scales.len()];
        let mut dscale = vec![0.0; scales.len()];
        let g = dfdx_ops::lsq_grad_factor(x.layout.numel(), x.grid);
        let ok = kernels::fake_quantize_learnable_affine_backward_into(
            x.data,
            dy,
            dx,
            x.layout,
            &scales,
            &zeros,
            x.grid.quant_min(),
            x.grid.quant_max(),
            g,
            self.config.rounding(),
            &mut dscale,
            None, // the zero point stays 0: no gradient for it
        );
        if ok.is_ok() {
            // scale = T / divisor, so dT = dscale / divisor.
            let divisor = x.grid.threshold_divisor();
            for (d, ds) in dparams.slot_mut(0).iter_mut().zip(&dscale) {
                *d += ds / divisor;
            }
        }
    }
}

/// The reference's `MyWeightsTrainingQuantizer`: symmetric weights quantization with a
/// learnable per-channel threshold.
#[mark_quantizer(target = Weights, method = [Symmetric], id = MyTraining)]
#[derive(Debug)]
pub struct MyWeightsTrainingQuantizer(LearnedThreshold);

/// The reference's `MyActivationsTrainingQuantizer`: symmetric activation quantization with a
/// learnable threshold (unsigned when the data is non-negative).
#[mark_quantizer(target = Activation, method = [Symmetric], id = MyTraining)]
#[derive(Debug)]
pub struct MyActivationsTrainingQuantizer(LearnedThreshold);

impl WeightsQuantizer for MyWeightsTrainingQuantizer {
    fn from_config(config: &WeightsQuantizerConfig) -> Result<Self, QuantError> {
        Ok(MyWeightsTrainingQuantizer(LearnedThreshold::new(
            config.clone().into(),
        )?))
    }
}

impl ActivationQuantizer for MyActivationsTrainingQuantizer {
    fn from_config(config: &ActivationQuantizerConfig) -> Result<Self, QuantError> {
        Ok(MyActivationsTrainingQuantizer(LearnedThreshold::new(
            config.clone().into(),
        )?))
    }
}

macro_rules! delegate {
    ($name:ident) => {
        impl TrainableQuantizer for $name {
            fn config(&self) -> &QuantizerConfig {
                self.0.config()
            }
            fn parameters(&self) -> Vec<ParamDecl> {
                self.0.parameters()
            }
            fn set_qparams(
                &self,
                q: &QParams,
                g: IntegerGrid,
                p: &mut ParamBankMut<'_>,
            ) -> Result<(), QuantError> {
                self.0.set_qparams(q, g, p)
            }
            fn qparams(
                &self,
                p: &ParamBank<'_>,
                g: IntegerGrid,
                a: Option<usize>,
            ) -> Result<QParams, QuantError> {
                self.0.qparams(p, g, a)
            }
            fn forward(
                &self,
                x: QuantizerInput<'_>,
                p: &ParamBank<'_>,
                y: &mut [f32],
            ) -> Result<(), QuantError> {
                self.0.forward(x, p, y)
            }
            fn backward(
                &self,
                x: QuantizerInput<'_>,
                p: &ParamBank<'_>,
                dy: &[f32],
                dx: &mut [f32],
                d: &mut ParamBankMut<'_>,
            ) {
                self.0.backward(x, p, dy, dx, d)
            }
        }
    };
}
delegate!(MyWeightsTrainingQuantizer);
delegate!(MyActivationsTrainingQuantizer);

/// Parameter slots of a quantizer chosen at run time: `MAX_PARAMETERS` rows, one column per
/// channel (here 8 output channels).
type Slots = Tensor<Rank2<{ quant::MAX_PARAMETERS }, 8>, f32, Cpu>;

fn mse(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f32>() / a.len() as f32
}

fn main() -> Result<(), QuantError> {
    let dev = Cpu::seed_from_u64(7);

    println!("Registered quantizers with the custom id `MyTraining`:");
    for e in registry::registered()
        .iter()
        .filter(|e| e.metadata.training_method == TrainingMethod::MyTraining)
    {
        println!("  {}", e.metadata);
    }

    // --- Weights: select by enum, build from a typed config --------------------------------
    let entry = registry::find(
        QuantizationTarget::Weights,
        QuantizationMethod::Symmetric,
        TrainingMethod::MyTraining,
    )?;
    let config =
        WeightsQuantizerConfig::new(TrainingMethod::MyTraining, QuantizationMethod::Symmetric, 4);
    let grid = config.grid()?;
    let quantizer: Arc<dyn TrainableQuantizer> = entry.build(&config.into())?.into();
    println!(
        "\nBuilt {} for 4-bit per-channel weights, grid [{}, {}]",
        entry.metadata.name,
        grid.quant_min(),
        grid.quant_max()
    );

    // A Linear-like weight matrix [8 outputs, 32 inputs] with a few outliers.
    let mut w_data: Vec<f32> = dev
        .sample_normal::<Rank2<8, 32>>()
        .as_vec()
        .iter()
        .map(|v: &f32| v * 0.2)
        .collect();
    for c in 0..8 {
        w_data[c * 32] = 0.9 + 0.1 * c as f32;
    }
    let w: Tensor<Rank2<8, 32>, f32, Cpu> = dev.tensor_from_vec(w_data.clone(), (Const, Const));
    let layout = ChannelLayout::new(&[8, 32], Some(0))?;

    // Initialise the thresholds from the data (per-channel max |w|, the trait's default).
    let mut learned: Slots = dev.zeros();
    let fixed: Slots = dev.zeros();
    let mut slots = learned.as_vec();
    quantizer.initialize(
        QuantizerInput::new(&w_data, layout, grid)?,
        &mut ParamBankMut::new(&mut slots, 8)?,
    )?;
    learned.copy_from(&slots);
    let t0 = learned.as_vec()[..8].to_vec();

    let quantize = |learned: &Slots| -> Result<Vec<f32>, QuantError> {
        Ok(dfdx_ops::fake_quantize_dyn(
            &quantizer,
            w.clone(),
            learned,
            &fixed,
            grid,
            Some(0),
            false,
        )?
        .as_vec())
    };
    let before = mse(&quantize(&learned)?, &w_data);

    // Train the thresholds to minimise the reconstruction error ||fq(w) - w||².
    let mut opt = Adam::new(
        &learned,
        AdamConfig {
            lr: 0.01,
            ..Default::default()
        },
    );
    for _ in 0..300 {
        let grads = learned.alloc_grads();
        let y = dfdx_ops::fake_quantize_dyn(
            &quantizer,
            w.clone().traced(grads),
            &learned,
            &fixed,
            grid,
            Some(0),
            true,
        )?;
        let loss = (y - w.clone()).square().mean();
        let grads = loss.backward();
        opt.update(&mut learned, &grads)
            .map_err(|e| QuantError::Device(format!("{e:?}")))?;
    }
    let after_y = quantize(&learned)?;
    let after = mse(&after_y, &w_data);
    let t1 = learned.as_vec()[..8].to_vec();
    println!(
        "Thresholds before training: {:?}",
        t0.iter().map(|t| format!("{t:.3}")).collect::<Vec<_>>()
    );
    println!(
        "Thresholds after training:  {:?}",
        t1.iter().map(|t| format!("{t:.3}")).collect::<Vec<_>>()
    );
    println!(
        "Reconstruction MSE: {before:.6} -> {after:.6} ({:.0}% lower)",
        100.0 * (1.0 - after / before)
    );

    // --- Convert to an inferable quantizer: plain data, integers out ----------------------
    let inferable =
        quantizer.to_inferable(&ParamBank::new(&learned.as_vec(), 8)?, grid, Some(0))?;
    assert_eq!(
        inferable.fake_quantize(&w_data, &[8, 32])?,
        after_y,
        "inferable must reproduce training-time quantization"
    );
    let ints: Vec<i8> = inferable.quantize(&w_data, &[8, 32])?;
    println!(
        "Inferable weights quantizer: {}",
        serde_json::to_string(&inferable).map_err(|e| QuantError::Device(e.to_string()))?
    );
    println!("Row 0 as int4 values stored in i8: {:?}", &ints[..16]);

    // --- Activations: the same story, per tensor, on a ReLU'd batch -------------------------
    let entry = registry::find(
        QuantizationTarget::Activation,
        QuantizationMethod::Symmetric,
        TrainingMethod::MyTraining,
    )?;
    let config = ActivationQuantizerConfig::new(
        TrainingMethod::MyTraining,
        QuantizationMethod::Symmetric,
        8,
    );
    let act: Arc<dyn TrainableQuantizer> = entry.build(&config.clone().into())?.into();
    let x: Tensor<Rank2<4, 16>, f32, Cpu> = dev.sample_normal::<Rank2<4, 16>>().relu();
    let x_data = x.as_vec();
    // Signedness is decided from the data (all non-negative here), as MCT does.
    let grid = config.grid(x_data.iter().any(|v| *v < 0.0))?;
    let mut learned: Tensor<Rank2<{ quant::MAX_PARAMETERS }, 1>, f32, Cpu> = dev.zeros();
    let fixed = learned.clone();
    let mut slots = learned.as_vec();
    act.initialize(
        QuantizerInput::new(&x_data, ChannelLayout::per_tensor(64), grid)?,
        &mut ParamBankMut::new(&mut slots, 1)?,
    )?;
    learned.copy_from(&slots);
    let y =
        dfdx_ops::fake_quantize_dyn(&act, x.clone(), &learned, &fixed, grid, None, false)?.as_vec();
    let inferable = act.to_inferable(&ParamBank::new(&learned.as_vec(), 1)?, grid, None)?;
    assert_eq!(inferable.fake_quantize(&x_data, &[4, 16])?, y);
    let codes: Vec<u8> = inferable.quantize(&x_data, &[4, 16])?;
    println!(
        "\nBuilt {} for 8-bit activations: unsigned grid [{}, {}], scale {:.5}",
        entry.metadata.name,
        grid.quant_min(),
        grid.quant_max(),
        inferable.qparams().scales()[0]
    );
    println!(
        "First 8 activations: {:?}",
        &x_data[..8]
            .iter()
            .map(|v| format!("{v:.3}"))
            .collect::<Vec<_>>()
    );
    println!("As uint8 codes:      {:?}", &codes[..8]);
    println!(
        "Max error after quantization: {:.5}",
        x_data
            .iter()
            .zip(&y)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max)
    );
    Ok(())
}
