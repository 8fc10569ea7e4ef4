//! The engine of the Ste and Lsq quantizers. Both keep affine parameters (slot 0 the scale,
//! slot 1 the zero point), store and read them the same way and fake-quantize the same way;
//! they differ only in whether the parameters learn, so one engine serves both.

use quant_core::{
    kernels, power_of_two_scale, IntegerGrid, ParamBank, ParamBankMut, ParamDecl, QParams,
    QuantizationMethod, QuantizerConfig, QuantizerInput, Result, TrainableQuantizer, MIN_SCALE,
};

use super::{add_param_grads, axis_of, optional_positive_option};

/// Whether the affine parameters learn, and how.
#[derive(Debug, Clone)]
enum Step {
    /// Ste: fixed parameters (from calibration); gradient `dy` inside the grid, 0 outside.
    Fixed,
    /// Lsq: the scale, and for Uniform the zero point (a learnable float, rounded before use as
    /// PyTorch does), train with the gradient of PyTorch's `_fake_quantize_learnable_*_affine`.
    /// `grad_factor` overrides LSQ's gradient scale `1/sqrt(numel·qmax)`.
    Learned { grad_factor: Option<f32> },
}

/// The shared engine: slot 0 the scale, slot 1 the zero point, fixed or learned.
#[derive(Debug, Clone)]
pub(crate) struct Affine {
    config: QuantizerConfig,
    step: Step,
}

impl Affine {
    /// The Ste engine (no options).
    pub(crate) fn fixed(config: QuantizerConfig) -> Result<Affine> {
        config.check_option_keys("Ste", &[])?;
        config.grid(false)?;
        Ok(Affine {
            config,
            step: Step::Fixed,
        })
    }

    /// The Lsq engine (option `grad_factor`).
    pub(crate) fn learned(config: QuantizerConfig) -> Result<Affine> {
        config.check_option_keys("Lsq", &["grad_factor"])?;
        config.grid(false)?;
        let grad_factor = optional_positive_option(
            &config,
            "grad_factor",
            "a finite value >= 0 (0 = LSQ's 1/sqrt(numel * quant_max))",
        )?;
        Ok(Affine {
            config,
            step: Step::Learned { grad_factor },
        })
    }

    fn learns(&self) -> bool {
        matches!(self.step, Step::Learned { .. })
    }

    fn learns_zero_point(&self) -> bool {
        self.learns() && self.config.method() == QuantizationMethod::Uniform
    }

    /// The scales; learned ones floored at `MIN_SCALE` (a step may push a scale to or below
    /// zero).
    fn scales(&self, params: &ParamBank<'_>, axis: Option<usize>) -> Vec<f32> {
        let scales = params.values(0, axis);
        match self.step {
            Step::Fixed => scales.to_vec(),
            Step::Learned { .. } => scales.iter().map(|s| s.max(MIN_SCALE)).collect(),
        }
    }
}

impl TrainableQuantizer for Affine {
    fn config(&self) -> &QuantizerConfig {
        &self.config
    }

    fn parameters(&self) -> Vec<ParamDecl> {
        vec![
            ParamDecl {
                name: "scale",
                trainable: self.learns(),
            },
            ParamDecl {
                name: "zero_point",
                trainable: self.learns_zero_point(),
            },
        ]
    }

    /// Stores `qparams` as (scale, zero point) slots, adjusted to the method: Symmetric zeroes
    /// the zero point, PowerOfTwo also rounds the threshold up to a power of two.
    fn set_qparams(
        &self,
        qparams: &QParams,
        grid: IntegerGrid,
        params: &mut ParamBankMut<'_>,
    ) -> Result<()> {
        qparams.check_zero_points(grid)?;
        let method = self.config.method();
        let scales: Vec<f32> = match method {
            QuantizationMethod::PowerOfTwo => qparams
                .scales()
                .iter()
                .map(|s| power_of_two_scale(s * grid.power_of_two_divisor(), grid))
                .collect::<Result<Vec<f32>>>()?,
            _ => qparams.scales().to_vec(),
        };
        let zero_points: Vec<f32> = match method {
            QuantizationMethod::Uniform => {
                qparams.zero_points().iter().map(|z| *z as f32).collect()
            }
            _ => vec![0.0; qparams.channels()],
        };
        params.set(0, &scales)?;
        params.set(1, &zero_points)
    }

    /// The zero points are kept in slot 1 as floats and rounded onto `grid`.
    fn qparams(
        &self,
        params: &ParamBank<'_>,
        grid: IntegerGrid,
        axis: Option<usize>,
    ) -> Result<QParams> {
        let zero_points =
            kernels::round_zero_points(params.values(1, axis), grid.quant_min(), grid.quant_max())?;
        QParams::new(self.scales(params, axis), zero_points, axis)
    }

    /// [`qparams`](TrainableQuantizer::qparams)' scales and zero points, handed to the kernel
    /// without building a `QParams`: the kernel checks them as `QParams` would (this runs for
    /// every quantizer on every training step).
    fn forward(&self, x: QuantizerInput<'_>, params: &ParamBank<'_>, y: &mut [f32]) -> Result<()> {
        let axis = axis_of(&x);
        let (quant_min, quant_max) = (x.grid.quant_min(), x.grid.quant_max());
        let zero_points = kernels::round_zero_points(params.values(1, axis), quant_min, quant_max)?;
        kernels::fake_quantize_affine_into(
            x.data,
            y,
            x.layout,
            &self.scales(params, axis),
            &zero_points,
            quant_min,
            quant_max,
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
        match self.step {
            Step::Fixed => {
                // Cannot fail: the forward pass validated the same arguments.
                if let Ok(q) = self.qparams(params, x.grid, axis) {
                    let _ = kernels::fake_quantize_affine_backward_into(
                        x.data,
                        dy,
                        dx,
                        x.layout,
                        q.scales(),
                        q.zero_points(),
                        x.grid.quant_min(),
                        x.grid.quant_max(),
                        self.config.rounding(),
                    );
                }
            }
            Step::Learned { grad_factor } => {
                let scales = self.scales(params, axis);
                let zero_points = params.values(1, axis).to_vec();
                let g = grad_factor.unwrap_or_else(|| {
                    quant_core::dfdx_ops::lsq_grad_factor(x.layout.numel(), x.grid)
                });
                let mut ds = vec![0.0; scales.len()];
                let mut dz = vec![0.0; scales.len()];
                // A zero point that does not learn (Symmetric) needs no gradient.
                let learns_zero_point = self.learns_zero_point();
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
                    learns_zero_point.then_some(&mut dz[..]),
                )
                .is_ok()
                {
                    add_param_grads(dparams, &[(0, &ds)]);
                    if learns_zero_point {
                        add_param_grads(dparams, &[(1, &dz)]);
                    }
                }
            }
        }
    }
}
