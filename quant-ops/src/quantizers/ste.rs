//! Straight-through-estimator quantizers: fixed quantization parameters (from calibration),
//! gradient `dy` inside the grid and 0 outside.

use quant_core::{
    power_of_two_scale, ActivationQuantizer, ActivationQuantizerConfig, IntegerGrid, ParamBank,
    ParamBankMut, ParamDecl, QParams, QuantizationMethod, QuantizerConfig, QuantizerInput, Result,
    TrainableQuantizer, WeightsQuantizer, WeightsQuantizerConfig,
};
use quant_macros::mark_quantizer;

use super::{backward_ste, delegate_trainable, forward_affine};

/// The shared engine: slot 0 is the scale, slot 1 the zero point, both fixed.
#[derive(Debug, Clone)]
pub(crate) struct Ste {
    config: QuantizerConfig,
}

impl Ste {
    pub(crate) fn new(config: QuantizerConfig) -> Result<Ste> {
        config.check_option_keys("Ste", &[])?;
        config.grid(false)?;
        Ok(Ste { config })
    }
}

/// Reads affine parameters kept as (scale, zero point) slots.
pub(crate) fn read_affine(
    params: &ParamBank<'_>,
    grid: IntegerGrid,
    axis: Option<usize>,
) -> Result<QParams> {
    let scales = params.values(0, axis).to_vec();
    let zero_points = quant_core::kernels::round_zero_points(
        params.values(1, axis),
        grid.quant_min(),
        grid.quant_max(),
    )?;
    QParams::new(scales, zero_points, axis)
}

/// Stores `qparams` as (scale, zero point) slots, adjusted to `method`: Symmetric zeroes the
/// zero point, PowerOfTwo also rounds the threshold up to a power of two.
pub(crate) fn write_affine(
    qparams: &QParams,
    method: QuantizationMethod,
    grid: IntegerGrid,
    params: &mut ParamBankMut<'_>,
) -> Result<()> {
    qparams.check_zero_points(grid)?;
    let scales: Vec<f32> = match method {
        QuantizationMethod::PowerOfTwo => qparams
            .scales()
            .iter()
            .map(|s| power_of_two_scale(s * grid.power_of_two_divisor(), grid))
            .collect::<Result<Vec<f32>>>()?,
        _ => qparams.scales().to_vec(),
    };
    let zero_points: Vec<f32> = match method {
        QuantizationMethod::Uniform => qparams.zero_points().iter().map(|z| *z as f32).collect(),
        _ => vec![0.0; qparams.channels()],
    };
    params.set(0, &scales)?;
    params.set(1, &zero_points)
}

impl TrainableQuantizer for Ste {
    fn config(&self) -> &QuantizerConfig {
        &self.config
    }

    fn parameters(&self) -> Vec<ParamDecl> {
        vec![
            ParamDecl {
                name: "scale",
                trainable: false,
            },
            ParamDecl {
                name: "zero_point",
                trainable: false,
            },
        ]
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
        read_affine(params, grid, axis)
    }

    fn forward(&self, x: QuantizerInput<'_>, params: &ParamBank<'_>, y: &mut [f32]) -> Result<()> {
        let q = self.qparams(params, x.grid, super::axis_of(&x))?;
        forward_affine(x, &q, &self.config, y)
    }

    fn backward(
        &self,
        x: QuantizerInput<'_>,
        params: &ParamBank<'_>,
        dy: &[f32],
        dx: &mut [f32],
        _: &mut ParamBankMut<'_>,
    ) {
        if let Ok(q) = self.qparams(params, x.grid, super::axis_of(&x)) {
            backward_ste(x, &q, &self.config, dy, dx);
        }
    }
}

/// Straight-through weights quantizer (MCT's STE): quantization parameters come from
/// calibration (min/max of the weights by default, per channel unless configured per tensor)
/// and stay fixed; the gradient passes through inside the grid.
#[mark_quantizer(target = Weights, method = [Symmetric, PowerOfTwo, Uniform], id = Ste)]
#[derive(Debug, Clone)]
pub struct SteWeightsQuantizer(Ste);

impl WeightsQuantizer for SteWeightsQuantizer {
    fn from_config(config: &WeightsQuantizerConfig) -> Result<Self> {
        Ok(SteWeightsQuantizer(Ste::new(config.clone().into())?))
    }
}
delegate_trainable!(SteWeightsQuantizer);

/// Straight-through activation quantizer: per-tensor parameters from calibration, fixed
/// during training.
#[mark_quantizer(target = Activation, method = [Symmetric, PowerOfTwo, Uniform], id = Ste)]
#[derive(Debug, Clone)]
pub struct SteActivationQuantizer(Ste);

impl ActivationQuantizer for SteActivationQuantizer {
    fn from_config(config: &ActivationQuantizerConfig) -> Result<Self> {
        Ok(SteActivationQuantizer(Ste::new(config.clone().into())?))
    }
}
delegate_trainable!(SteActivationQuantizer);
