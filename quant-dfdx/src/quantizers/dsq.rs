//! DSQ (Gong et al. 2019): differentiable soft quantization. The forward pass is exact affine
//! quantization over the learned range; the backward pass follows the tanh-shaped surrogate,
//! so the sharpness α and the range `[l, u]` all learn.

use quant_core::{
    kernels, ActivationQuantizer, ActivationQuantizerConfig, IntegerGrid, ParamBank, ParamBankMut,
    ParamDecl, QParams, QuantizerConfig, QuantizerInput, Result, TrainableQuantizer,
    WeightsQuantizer, WeightsQuantizerConfig,
};
use quant_macros::mark_quantizer;

use super::{add_param_grads, affine_range, axis_of, engine_quantizer};

/// The shared engine: slot 0 α, slot 1 the lower end `l`, slot 2 the upper end `u`, all
/// trainable. The grid is Uniform over `[l, u]` nudged so 0 is on it
/// ([`kernels::dsq_qparams`]); the surrogate is documented at [`kernels::dsq_backward_into`].
#[derive(Debug, Clone)]
pub(crate) struct Dsq {
    config: QuantizerConfig,
    initial_alpha: f32,
}

impl Dsq {
    fn new(config: QuantizerConfig) -> Result<Dsq> {
        config.check_option_keys("Dsq", &["alpha"])?;
        config.grid(false)?;
        let (lo, hi) = kernels::DSQ_ALPHA_RANGE;
        let alpha = config.option("alpha", 0.2, |v| {
            if v >= lo as f64 && v <= hi as f64 {
                Ok(())
            } else {
                Err(format!(
                    "a sharpness in [{lo}, {hi}] (DSQ's paper uses 0.2)"
                ))
            }
        })?;
        Ok(Dsq {
            config,
            initial_alpha: alpha as f32,
        })
    }
}

impl TrainableQuantizer for Dsq {
    fn config(&self) -> &QuantizerConfig {
        &self.config
    }

    fn parameters(&self) -> Vec<ParamDecl> {
        ["alpha", "lower", "upper"]
            .into_iter()
            .map(|name| ParamDecl {
                name,
                trainable: true,
            })
            .collect()
    }

    fn set_qparams(
        &self,
        qparams: &QParams,
        grid: IntegerGrid,
        params: &mut ParamBankMut<'_>,
    ) -> Result<()> {
        qparams.check_zero_points(grid)?;
        let (lower, upper): (Vec<f32>, Vec<f32>) = qparams
            .scales()
            .iter()
            .zip(qparams.zero_points())
            .map(|(s, z)| affine_range(*s, *z, grid))
            .unzip();
        params.fill(0, self.initial_alpha);
        params.set(1, &lower)?;
        params.set(2, &upper)
    }

    fn qparams(
        &self,
        params: &ParamBank<'_>,
        grid: IntegerGrid,
        axis: Option<usize>,
    ) -> Result<QParams> {
        let (mut scales, mut zero_points) = (Vec::new(), Vec::new());
        for (l, u) in params.values(1, axis).iter().zip(params.values(2, axis)) {
            let (s, z) = kernels::dsq_qparams(*l, *u, grid)?;
            scales.push(s);
            zero_points.push(z);
        }
        QParams::new(scales, zero_points, axis)
    }

    fn forward(&self, x: QuantizerInput<'_>, params: &ParamBank<'_>, y: &mut [f32]) -> Result<()> {
        let axis = axis_of(&x);
        kernels::dsq_forward_into(
            x.data,
            y,
            x.layout,
            params.values(1, axis),
            params.values(2, axis),
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
        let axis = axis_of(&x);
        let n = params.values(0, axis).len();
        let (mut da, mut dl, mut du) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        kernels::dsq_backward_into(
            x.data,
            dy,
            dx,
            x.layout,
            params.values(0, axis),
            params.values(1, axis),
            params.values(2, axis),
            x.grid,
            &mut da,
            &mut dl,
            &mut du,
        );
        add_param_grads(dparams, &[(0, &da), (1, &dl), (2, &du)]);
    }
}

engine_quantizer! {
    /// DSQ weights quantizer (per channel by default). Option `alpha` sets the initial sharpness
    /// (default 0.2).
    #[mark_quantizer(target = Weights, method = [Uniform], id = Dsq)]
    pub struct DsqWeightsQuantizer(Dsq);
}

impl WeightsQuantizer for DsqWeightsQuantizer {
    fn from_config(config: &WeightsQuantizerConfig) -> Result<Self> {
        Ok(DsqWeightsQuantizer(Dsq::new(config.clone().into())?))
    }
}

engine_quantizer! {
    /// DSQ activation quantizer (per tensor). Option `alpha` as for weights.
    #[mark_quantizer(target = Activation, method = [Uniform], id = Dsq)]
    pub struct DsqActivationQuantizer(Dsq);
}

impl ActivationQuantizer for DsqActivationQuantizer {
    fn from_config(config: &ActivationQuantizerConfig) -> Result<Self> {
        Ok(DsqActivationQuantizer(Dsq::new(config.clone().into())?))
    }
}
