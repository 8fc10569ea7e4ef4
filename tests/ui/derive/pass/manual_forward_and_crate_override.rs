use quant::dfdx::nn::modules::{Linear, ReLU};
use quant::dfdx::prelude::*;
use quant::prelude::*;
use quant::convert::{convert_model, LayerKind};
use quant::layers::{QuantizerSpec, Slot};
use quant::layers::QuantizedModuleExt;

/// A residual block: the forward pass is not the fields in order, so it is written by hand.
#[derive(Clone, Debug, QuantizedModel)]
#[quantized(forward = manual, name = QuantResidual, crate = ::quant)]
pub struct Residual<const N: usize> {
    pub fc: Linear<N, N, f32, Cpu>,
    pub act: ReLU,
}

impl<const N: usize, B: Dim> Module<Tensor<(B, Const<N>), f32, Cpu>> for Residual<N> {
    type Output = Tensor<(B, Const<N>), f32, Cpu>;
    type Error = CpuError;

    fn try_forward(&self, x: Tensor<(B, Const<N>), f32, Cpu>) -> Result<Self::Output, CpuError> {
        let y = self.act.try_forward(self.fc.try_forward(x.clone())?)?;
        y.try_add(x)
    }
}

impl<const N: usize, B: Dim> Module<Tensor<(B, Const<N>), f32, Cpu>> for QuantResidual<N> {
    type Output = Tensor<(B, Const<N>), f32, Cpu>;
    type Error = QuantError;

    fn try_forward(&self, x: Tensor<(B, Const<N>), f32, Cpu>) -> Result<Self::Output, QuantError> {
        let y = self.act.try_forward(self.fc.try_forward(x.clone())?)?;
        Ok(y.try_add(x)?)
    }
}

fn main() {
    let dev = Cpu::default();
    let float = Residual::<4>::build(&dev).unwrap();
    let policy = |_: &str, _: LayerKind, _: Slot| -> quant::Result<Option<QuantizerSpec>> {
        Ok(None)
    };
    let mut q = convert_model(&float, &policy).unwrap();
    assert!(q.quantizers().unwrap().is_empty());
    let x: Tensor<Rank2<2, 4>, f32, Cpu> = dev.sample_normal();
    assert_eq!(q.try_forward(x.clone()).unwrap().array(), float.forward(x).array());
}
