//! Quantizers registered from a crate other than the one that looks them up: the registry
//! tests (`tests/integration/registry.rs` at the workspace root) find them by enum. Two of them share one
//! `(target, method, training method)` on purpose, to exercise the `Ambiguous` error.

#![forbid(unsafe_code)]

use quant_core::{
    kernels, ActivationQuantizer, ActivationQuantizerConfig, IntegerGrid, ParamBank, ParamBankMut,
    ParamDecl, QParams, QuantizerConfig, QuantizerInput, Result, TrainableQuantizer,
    WeightsQuantizer, WeightsQuantizerConfig,
};
use quant_macros::mark_quantizer;

quant_core::training_methods!(
    /// Training methods defined by this crate.
    pub trait FixtureMethods { FixtureTraining, Twin }
);

/// Per-tensor symmetric quantization with a fixed scale of 1/8: enough to see it quantize.
#[derive(Debug)]
pub struct EighthStep(QuantizerConfig);

impl TrainableQuantizer for EighthStep {
    fn config(&self) -> &QuantizerConfig {
        &self.0
    }
    fn parameters(&self) -> Vec<ParamDecl> {
        Vec::new()
    }
    fn set_qparams(&self, _: &QParams, _: IntegerGrid, _: &mut ParamBankMut<'_>) -> Result<()> {
        Ok(())
    }
    fn qparams(&self, _: &ParamBank<'_>, _: IntegerGrid, _: Option<usize>) -> Result<QParams> {
        QParams::per_tensor(0.125, 0)
    }
    fn forward(&self, x: QuantizerInput<'_>, _: &ParamBank<'_>, y: &mut [f32]) -> Result<()> {
        let g = x.grid;
        let out = kernels::fake_quantize_per_tensor_affine(
            x.data,
            0.125,
            0,
            g.quant_min(),
            g.quant_max(),
        )?;
        y.copy_from_slice(&out);
        Ok(())
    }
    fn backward(
        &self,
        _: QuantizerInput<'_>,
        _: &ParamBank<'_>,
        dy: &[f32],
        dx: &mut [f32],
        _: &mut ParamBankMut<'_>,
    ) {
        for (g, d) in dx.iter_mut().zip(dy) {
            *g += d;
        }
    }
}

/// Weights, Symmetric, `FixtureTraining`.
#[mark_quantizer(target = Weights, method = [Symmetric], id = FixtureTraining)]
#[derive(Debug)]
pub struct FixtureWeightsQuantizer(EighthStep);

/// Activation, Uniform, `Twin` (first of two).
#[mark_quantizer(target = Activation, method = [Uniform], id = Twin)]
#[derive(Debug)]
pub struct TwinA(EighthStep);

/// Activation, Uniform, `Twin` (second of two).
#[mark_quantizer(target = Activation, method = [Uniform, Symmetric], id = Twin)]
#[derive(Debug)]
pub struct TwinB(EighthStep);

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
            ) -> Result<()> {
                self.0.set_qparams(q, g, p)
            }
            fn qparams(
                &self,
                p: &ParamBank<'_>,
                g: IntegerGrid,
                a: Option<usize>,
            ) -> Result<QParams> {
                self.0.qparams(p, g, a)
            }
            fn forward(
                &self,
                x: QuantizerInput<'_>,
                p: &ParamBank<'_>,
                y: &mut [f32],
            ) -> Result<()> {
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
delegate!(FixtureWeightsQuantizer);
delegate!(TwinA);
delegate!(TwinB);

impl WeightsQuantizer for FixtureWeightsQuantizer {
    fn from_config(config: &WeightsQuantizerConfig) -> Result<Self> {
        Ok(FixtureWeightsQuantizer(EighthStep(config.clone().into())))
    }
}
impl ActivationQuantizer for TwinA {
    fn from_config(config: &ActivationQuantizerConfig) -> Result<Self> {
        Ok(TwinA(EighthStep(config.clone().into())))
    }
}
impl ActivationQuantizer for TwinB {
    fn from_config(config: &ActivationQuantizerConfig) -> Result<Self> {
        Ok(TwinB(EighthStep(config.clone().into())))
    }
}
