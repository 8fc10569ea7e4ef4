//! PACT (Choi et al. 2018): activations clipped to a learned `[0, α]`, then quantized on an
//! unsigned grid.

use quant_core::{
    kernels, ActivationQuantizer, ActivationQuantizerConfig, IntegerGrid, ParamBank, ParamBankMut,
    ParamDecl, QParams, QuantError, QuantizerConfig, QuantizerInput, Result, TrainableQuantizer,
};
use quant_macros::mark_quantizer;

use super::optional_positive_option;

/// PACT activation quantizer: slot 0 is the clip value α (trainable). Uniform over `[0, α]`:
/// `scale = α / (2^b - 1)`, zero point 0. Gradients: `dx = dy·[0 ≤ x < α]`,
/// `dα = Σ dy·[x ≥ α]`. Option `alpha` fixes the initial α (otherwise calibration's maximum).
#[mark_quantizer(target = Activation, method = [Uniform], id = Pact)]
#[derive(Debug, Clone)]
pub struct PactActivationQuantizer {
    config: QuantizerConfig,
    initial_alpha: Option<f32>,
}

impl ActivationQuantizer for PactActivationQuantizer {
    fn from_config(config: &ActivationQuantizerConfig) -> Result<Self> {
        let config: QuantizerConfig = config.clone().into();
        config.check_option_keys("Pact", &["alpha"])?;
        config.grid(false)?;
        let initial_alpha = optional_positive_option(
            &config,
            "alpha",
            "a finite clip value > 0 (0 or absent: from calibration)",
        )?;
        Ok(PactActivationQuantizer {
            config,
            initial_alpha,
        })
    }
}

impl TrainableQuantizer for PactActivationQuantizer {
    fn config(&self) -> &QuantizerConfig {
        &self.config
    }

    fn parameters(&self) -> Vec<ParamDecl> {
        vec![ParamDecl {
            name: "alpha",
            trainable: true,
        }]
    }

    fn set_qparams(
        &self,
        qparams: &QParams,
        grid: IntegerGrid,
        params: &mut ParamBankMut<'_>,
    ) -> Result<()> {
        if qparams.is_per_channel() {
            return Err(QuantError::ConfigMismatch {
                quantizer: "Pact".into(),
                reason: "PACT keeps one clip value per tensor; got per-channel parameters".into(),
            });
        }
        let alpha = match self.initial_alpha {
            Some(a) => a,
            None => (grid.quant_max() - qparams.zero_points()[0]) as f32 * qparams.scales()[0],
        };
        params.fill(0, alpha);
        Ok(())
    }

    fn qparams(
        &self,
        params: &ParamBank<'_>,
        grid: IntegerGrid,
        _axis: Option<usize>,
    ) -> Result<QParams> {
        let alpha = kernels::pact_alpha(params.scalar(0), grid);
        QParams::per_tensor(alpha / grid.quant_max() as f32, 0)
    }

    fn forward(&self, x: QuantizerInput<'_>, params: &ParamBank<'_>, y: &mut [f32]) -> Result<()> {
        kernels::pact_forward_into(
            x.data,
            y,
            x.layout,
            params.scalar(0),
            x.grid,
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
        let dalpha = kernels::pact_backward_into(x.data, dy, dx, params.scalar(0), x.grid);
        dparams.slot_mut(0)[0] += dalpha;
    }
}
