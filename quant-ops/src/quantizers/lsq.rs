//! Learned step size quantization (Esser et al. 2020): the scale, and for Uniform the zero
//! point, are trained with the gradient of PyTorch's `_fake_quantize_learnable_*_affine`.

use quant_core::{
    kernels, ActivationQuantizer, ActivationQuantizerConfig, IntegerGrid, ParamBank, ParamBankMut,
    ParamDecl, QParams, QuantizationMethod, QuantizerConfig, QuantizerInput, Result,
    TrainableQuantizer, WeightsQuantizer, WeightsQuantizerConfig, MIN_SCALE,
};
use quant_macros::mark_quantizer;

use super::{
    add_param_grads, affine_parameters, axis_of, engine_quantizer, forward_affine,
    optional_positive_option, read_zero_points, write_affine,
};

/// The shared engine: slot 0 the scale, slot 1 the zero point (a learnable float for Uniform,
/// rounded before use as PyTorch does), both trainable.
#[derive(Debug, Clone)]
pub(crate) struct Lsq {
    config: QuantizerConfig,
    grad_factor: Option<f32>,
}

impl Lsq {
    fn new(config: QuantizerConfig) -> Result<Lsq> {
        config.check_option_keys("Lsq", &["grad_factor"])?;
        config.grid(false)?;
        let grad_factor = optional_positive_option(
            &config,
            "grad_factor",
            "a finite value >= 0 (0 = LSQ's 1/sqrt(numel * quant_max))",
        )?;
        Ok(Lsq {
            config,
            grad_factor,
        })
    }

    fn learn_zero_point(&self) -> bool {
        self.config.method() == QuantizationMethod::Uniform
    }

    /// Scales floored at `MIN_SCALE` (a step may push a scale to or below zero).
    fn scales(&self, params: &ParamBank<'_>, axis: Option<usize>) -> Vec<f32> {
        params
            .values(0, axis)
            .iter()
            .map(|s| s.max(MIN_SCALE))
            .collect()
    }
}

impl TrainableQuantizer for Lsq {
    fn config(&self) -> &QuantizerConfig {
        &self.config
    }

    fn parameters(&self) -> Vec<ParamDecl> {
        affine_parameters(true, self.learn_zero_point())
    }

    fn set_qparams(
        &self,
        qparams: &QParams,
        grid: IntegerGrid,
        params: &mut ParamBankMut<'_>,
    ) -> Result<()> {
        write_affine(qparams, self.config.method(), grid, params)
    }

    fn qparams(
        &self,
        params: &ParamBank<'_>,
        grid: IntegerGrid,
        axis: Option<usize>,
    ) -> Result<QParams> {
        QParams::new(
            self.scales(params, axis),
            read_zero_points(params, grid, axis)?,
            axis,
        )
    }

    fn forward(&self, x: QuantizerInput<'_>, params: &ParamBank<'_>, y: &mut [f32]) -> Result<()> {
        let q = self.qparams(params, x.grid, axis_of(&x))?;
        forward_affine(x, &q, &self.config, y)
    }

    fn backward(
        &self,
        x: QuantizerInput<'_>,
        params: &ParamBank<'_>,
        dy: &[f32],
        dx: &mut [f32],
        dparams: &mut ParamBankMut<'_>,
    ) {
        let axis = axis_of(&x);
        let scales = self.scales(params, axis);
        let zero_points = params.values(1, axis).to_vec();
        let g = self
            .grad_factor
            .unwrap_or_else(|| quant_core::ops::lsq_grad_factor(x.layout.numel(), x.grid));
        let mut ds = vec![0.0; scales.len()];
        let mut dz = vec![0.0; scales.len()];
        if kernels::fake_quantize_learnable_affine_backward_into(
            x.data,
            dy,
            dx,
            x.layout,
            &scales,
            &zero_points,
            x.grid.quant_min(),
            x.grid.quant_max(),
            g,
            self.config.rounding(),
            &mut ds,
            &mut dz,
        )
        .is_ok()
        {
            add_param_grads(dparams, &[(0, &ds)]);
            if self.learn_zero_point() {
                add_param_grads(dparams, &[(1, &dz)]);
            }
        }
    }
}

engine_quantizer! {
    /// LSQ weights quantizer: per-channel (default) or per-tensor learned step sizes, initialised
    /// from the weights (min/max, or the `LsqInit` observer `2·mean|w|/sqrt(qmax)` when the policy
    /// says so). Option `grad_factor` overrides LSQ's gradient scale `1/sqrt(numel·qmax)`.
    #[mark_quantizer(target = Weights, method = [Symmetric, Uniform], id = Lsq)]
    pub struct LsqWeightsQuantizer(Lsq);
}

impl WeightsQuantizer for LsqWeightsQuantizer {
    fn from_config(config: &WeightsQuantizerConfig) -> Result<Self> {
        Ok(LsqWeightsQuantizer(Lsq::new(config.clone().into())?))
    }
}

engine_quantizer! {
    /// LSQ activation quantizer: a per-tensor learned step size (and zero point for Uniform),
    /// initialised from the first batch. Option `grad_factor` as for weights.
    #[mark_quantizer(target = Activation, method = [Symmetric, Uniform], id = Lsq)]
    pub struct LsqActivationQuantizer(Lsq);
}

impl ActivationQuantizer for LsqActivationQuantizer {
    fn from_config(config: &ActivationQuantizerConfig) -> Result<Self> {
        Ok(LsqActivationQuantizer(Lsq::new(config.clone().into())?))
    }
}
