//! Straight-through-estimator quantizers: fixed quantization parameters (from calibration),
//! gradient `dy` inside the grid and 0 outside.

use quant_core::{
    ActivationQuantizer, ActivationQuantizerConfig, IntegerGrid, ParamBank, ParamBankMut,
    ParamDecl, QParams, QuantizerConfig, QuantizerInput, Result, TrainableQuantizer,
    WeightsQuantizer, WeightsQuantizerConfig,
};
use quant_macros::mark_quantizer;

use super::{
    affine_parameters, axis_of, backward_ste, engine_quantizer, forward_affine, read_zero_points,
    write_affine,
};

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

impl TrainableQuantizer for Ste {
    fn config(&self) -> &QuantizerConfig {
        &self.config
    }

    fn parameters(&self) -> Vec<ParamDecl> {
        affine_parameters(false, false)
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
        let scales = params.values(0, axis).to_vec();
        QParams::new(scales, read_zero_points(params, grid, axis)?, axis)
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
        _: &mut ParamBankMut<'_>,
    ) {
        if let Ok(q) = self.qparams(params, x.grid, axis_of(&x)) {
            backward_ste(x, &q, &self.config, dy, dx);
        }
    }
}

engine_quantizer! {
    /// Straight-through weights quantizer (MCT's STE): quantization parameters come from
    /// calibration (min/max of the weights by default, per channel unless configured per tensor)
    /// and stay fixed; the gradient passes through inside the grid.
    #[mark_quantizer(target = Weights, method = [Symmetric, PowerOfTwo, Uniform], id = Ste)]
    pub struct SteWeightsQuantizer(Ste);
}

impl WeightsQuantizer for SteWeightsQuantizer {
    fn from_config(config: &WeightsQuantizerConfig) -> Result<Self> {
        Ok(SteWeightsQuantizer(Ste::new(config.clone().into())?))
    }
}

engine_quantizer! {
    /// Straight-through activation quantizer: per-tensor parameters from calibration, fixed
    /// during training.
    #[mark_quantizer(target = Activation, method = [Symmetric, PowerOfTwo, Uniform], id = Ste)]
    pub struct SteActivationQuantizer(Ste);
}

impl ActivationQuantizer for SteActivationQuantizer {
    fn from_config(config: &ActivationQuantizerConfig) -> Result<Self> {
        Ok(SteActivationQuantizer(Ste::new(config.clone().into())?))
    }
}
