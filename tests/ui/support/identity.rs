//! A minimal quantizer (identity, no parameters) for UI tests that need a struct which really
//! implements the quantizer traits.

/// Implements `TrainableQuantizer` and the named target traits for a struct holding a
/// `QuantizerConfig` as its first field.
#[macro_export]
macro_rules! identity_quantizer {
    ($name:ident: $($target:ident),+) => {
        impl quant::TrainableQuantizer for $name {
            fn config(&self) -> &quant::QuantizerConfig {
                &self.0
            }
            fn parameters(&self) -> Vec<quant::ParamDecl> {
                Vec::new()
            }
            fn set_qparams(
                &self,
                _: &quant::QParams,
                _: quant::IntegerGrid,
                _: &mut quant::ParamBankMut<'_>,
            ) -> Result<(), quant::QuantError> {
                Ok(())
            }
            fn qparams(
                &self,
                _: &quant::ParamBank<'_>,
                _: quant::IntegerGrid,
                _: Option<usize>,
            ) -> Result<quant::QParams, quant::QuantError> {
                quant::QParams::per_tensor(1.0, 0)
            }
            fn forward(
                &self,
                x: quant::QuantizerInput<'_>,
                _: &quant::ParamBank<'_>,
                y: &mut [f32],
            ) -> Result<(), quant::QuantError> {
                y.copy_from_slice(x.data);
                Ok(())
            }
            fn backward(
                &self,
                _: quant::QuantizerInput<'_>,
                _: &quant::ParamBank<'_>,
                dy: &[f32],
                dx: &mut [f32],
                _: &mut quant::ParamBankMut<'_>,
            ) {
                for (g, d) in dx.iter_mut().zip(dy) {
                    *g += d;
                }
            }
        }
        $($crate::identity_quantizer!(@target $name $target);)+
    };
    (@target $name:ident Weights) => {
        impl quant::WeightsQuantizer for $name {
            fn from_config(config: &quant::WeightsQuantizerConfig) -> Result<Self, quant::QuantError> {
                Ok($name(config.clone().into()))
            }
        }
    };
    (@target $name:ident Activation) => {
        impl quant::ActivationQuantizer for $name {
            fn from_config(config: &quant::ActivationQuantizerConfig) -> Result<Self, quant::QuantError> {
                Ok($name(config.clone().into()))
            }
        }
    };
}
