//! `Float<M>`: a float module inside a quantized model.

use dfdx::nn::tensor_collection::TensorCollection;
use dfdx::prelude::*;

use quant_core::{QuantError, Result};

use super::{join_name, QuantizedModule, SlotVisitor};
use crate::convert::GraphOp;
use quant_runtime::graph::{GraphBuilder, ValueId};
use quant_runtime::GraphError;

/// A module that stays float inside a quantized model (activations, normalisation, ...).
///
/// dfdx chains tuple modules only when they share one error type; quantized layers report
/// [`QuantError`], so the float modules of a converted model are wrapped to report it too. The
/// wrapped module's tensors appear under `inner` in save files.
#[derive(Debug, Clone, Default)]
pub struct Float<M>(pub M);

tensor_collection! {
    impl[E: Dtype, D: Device<E>, M: TensorCollection<E, D>] Float<M> => Float<M::To<E2, D2>>;
    Float(0 as "inner")
}

impl<X, M: Module<X>> Module<X> for Float<M>
where
    M::Error: Into<QuantError>,
{
    type Output = M::Output;
    type Error = QuantError;

    fn try_forward(&self, x: X) -> Result<Self::Output> {
        self.0.try_forward(x).map_err(Into::into)
    }
}

impl<X, M: ModuleMut<X>> ModuleMut<X> for Float<M>
where
    M::Error: Into<QuantError>,
{
    type Output = M::Output;
    type Error = QuantError;

    fn try_forward_mut(&mut self, x: X) -> Result<Self::Output> {
        self.0.try_forward_mut(x).map_err(Into::into)
    }
}

impl<M: GraphOp> QuantizedModule for Float<M> {
    fn visit_slots(&mut self, _name: &str, _f: &mut SlotVisitor<'_>) -> Result<()> {
        Ok(())
    }

    fn lower(&self, name: &str, g: &mut GraphBuilder, x: ValueId) -> Result<ValueId, GraphError> {
        lower_op(&self.0, name, g, x)
    }
}

/// Adds `m`'s op on `x` as node `name` (its parameters' tensors named under `name`).
pub(crate) fn lower_op<M: GraphOp>(
    m: &M,
    name: &str,
    g: &mut GraphBuilder,
    x: ValueId,
) -> Result<ValueId, GraphError> {
    match m.graph_op() {
        Ok(None) => Ok(x),
        Ok(Some(mut op)) => {
            // Only the names change: the shapes do not matter here.
            for (p, _) in op.parameters_mut(&[]) {
                p.tensor = join_name(name, &p.tensor);
            }
            g.add(name, op, &[x])
        }
        Err(reason) => Err(GraphError::Unsupported {
            layer: name.to_string(),
            reason,
        }),
    }
}
