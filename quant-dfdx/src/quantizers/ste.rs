//! Straight-through-estimator quantizers: fixed quantization parameters (from calibration),
//! gradient `dy` inside the grid and 0 outside.

use quant_core::{
    ActivationQuantizer, ActivationQuantizerConfig, Result, WeightsQuantizer,
    WeightsQuantizerConfig,
};
use quant_macros::mark_quantizer;

use super::affine::Affine;
use super::engine_quantizer;

engine_quantizer! {
    /// Straight-through weights quantizer (MCT's STE): quantization parameters come from
    /// calibration (min/max of the weights by default, per channel unless configured per tensor)
    /// and stay fixed; the gradient passes through inside the grid.
    #[mark_quantizer(target = Weights, method = [Symmetric, PowerOfTwo, Uniform], id = Ste)]
    pub struct SteWeightsQuantizer(Affine);
}

impl WeightsQuantizer for SteWeightsQuantizer {
    fn from_config(config: &WeightsQuantizerConfig) -> Result<Self> {
        Ok(SteWeightsQuantizer(Affine::fixed(config.clone().into())?))
    }
}

engine_quantizer! {
    /// Straight-through activation quantizer: per-tensor parameters from calibration, fixed
    /// during training.
    #[mark_quantizer(target = Activation, method = [Symmetric, PowerOfTwo, Uniform], id = Ste)]
    pub struct SteActivationQuantizer(Affine);
}

impl ActivationQuantizer for SteActivationQuantizer {
    fn from_config(config: &ActivationQuantizerConfig) -> Result<Self> {
        Ok(SteActivationQuantizer(Affine::fixed(
            config.clone().into(),
        )?))
    }
}
