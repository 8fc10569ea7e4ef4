//! Learned step size quantization (Esser et al. 2020): the scale, and for Uniform the zero
//! point, are trained with the gradient of PyTorch's `_fake_quantize_learnable_*_affine`.

use quant_core::{
    ActivationQuantizer, ActivationQuantizerConfig, Result, WeightsQuantizer,
    WeightsQuantizerConfig,
};
use quant_macros::mark_quantizer;

use super::affine::Affine;
use super::engine_quantizer;

engine_quantizer! {
    /// LSQ weights quantizer: per-channel (default) or per-tensor learned step sizes, initialised
    /// from the weights (min/max, or the `LsqInit` observer `2·mean|w|/sqrt(qmax)` when the policy
    /// says so). Option `grad_factor` overrides LSQ's gradient scale `1/sqrt(numel·qmax)`.
    #[mark_quantizer(target = Weights, method = [Symmetric, Uniform], id = Lsq)]
    pub struct LsqWeightsQuantizer(Affine);
}

impl WeightsQuantizer for LsqWeightsQuantizer {
    fn from_config(config: &WeightsQuantizerConfig) -> Result<Self> {
        Ok(LsqWeightsQuantizer(Affine::learned(config.clone().into())?))
    }
}

engine_quantizer! {
    /// LSQ activation quantizer: a per-tensor learned step size (and zero point for Uniform),
    /// initialised from the first batch. Option `grad_factor` as for weights.
    #[mark_quantizer(target = Activation, method = [Symmetric, Uniform], id = Lsq)]
    pub struct LsqActivationQuantizer(Affine);
}

impl ActivationQuantizer for LsqActivationQuantizer {
    fn from_config(config: &ActivationQuantizerConfig) -> Result<Self> {
        Ok(LsqActivationQuantizer(Affine::learned(
            config.clone().into(),
        )?))
    }
}
