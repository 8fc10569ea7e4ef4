//! `QEmbedding`: dfdx's `Embedding` with its table quantized per row.

use dfdx::nn::modules::Embedding;
use dfdx::nn::tensor_collection::{TensorCollection, TensorOptions};
use dfdx::prelude::*;

use quant_core::{QuantError, Result};

use super::fan_in_uniform;
use super::{
    visit_layer_slots, FakeQuantizer, QuantizedModule, Slot, SlotVisitor, TensorQuantizer,
};
use crate::convert::LayerKind;
use quant_runtime::graph::{GraphBuilder, ValueId};
use quant_runtime::GraphError;

/// An embedding table `[VOCAB, DIM]` whose rows pass through `weights_quantizer` (per row, or
/// per tensor) before the lookup: slot `weights`, kind [`LayerKind::Embedding`].
///
/// Its input is token ids, which the graph IR's float input does not carry: a model holding
/// one converts, calibrates and trains, and its export is a typed error.
#[derive(Debug, Clone)]
pub struct QEmbedding<
    const VOCAB: usize,
    const DIM: usize,
    WQ = TensorQuantizer<VOCAB>,
    E: Dtype = f32,
    D: Storage<E> = Cpu,
> {
    /// The table, as in dfdx's Embedding.
    pub weight: Tensor<Rank2<VOCAB, DIM>, E, D>,
    /// Quantizer of the table.
    pub weights_quantizer: WQ,
}

impl<const V: usize, const M: usize> QEmbedding<V, M> {
    /// Wraps a float embedding (table copied) with an unconfigured quantizer.
    pub fn from_embedding(e: &Embedding<V, M, f32, Cpu>) -> Self {
        QEmbedding {
            weight: e.weight.clone(),
            weights_quantizer: TensorQuantizer::new(e.weight.device()),
        }
    }
}

tensor_collection! {
    impl[
        const V: usize,
        const M: usize,
        WQ: TensorCollection<E, D>,
        E: Dtype + num_traits::Float + rand_distr::uniform::SampleUniform,
        D: Device<E>,
    ] QEmbedding<V, M, WQ, E, D> => QEmbedding<V, M, WQ::To<E2, D2>, E2, D2>;
    QEmbedding {
        weight: tensor(TensorOptions::reset_with(|t| t.try_fill_with_distr(fan_in_uniform(V)))),
        weights_quantizer,
    }
}

/// `Module` and `ModuleMut` for token ids of shape `$ids` giving `$out`: the (fake-quantized)
/// table on the ids' tape, then the lookup; a calibrating quantizer observes the table.
macro_rules! lookups {
    ($([$($dim:ident),+] $ids:ty => $out:ty;)+) => {
        $(
            impl<const V: usize, const M: usize, $($dim: Dim,)+ WQ: FakeQuantizer, T: Tape<f32, Cpu>>
                Module<Tensor<$ids, usize, Cpu, T>> for QEmbedding<V, M, WQ>
            {
                type Output = Tensor<$out, f32, Cpu, T>;
                type Error = QuantError;

                fn try_forward(&self, ids: Tensor<$ids, usize, Cpu, T>) -> Result<Self::Output> {
                    let (ids, tape) = ids.split_tape();
                    let table = self
                        .weights_quantizer
                        .fake_quantize(self.weight.clone().put_tape(tape))?;
                    Ok(table.try_gather(ids)?)
                }
            }

            impl<const V: usize, const M: usize, $($dim: Dim,)+ WQ: FakeQuantizer, T: Tape<f32, Cpu>>
                ModuleMut<Tensor<$ids, usize, Cpu, T>> for QEmbedding<V, M, WQ>
            {
                type Output = Tensor<$out, f32, Cpu, T>;
                type Error = QuantError;

                fn try_forward_mut(
                    &mut self,
                    ids: Tensor<$ids, usize, Cpu, T>,
                ) -> Result<Self::Output> {
                    let (ids, tape) = ids.split_tape();
                    let table = self
                        .weights_quantizer
                        .fake_quantize_mut(self.weight.clone().put_tape(tape))?;
                    Ok(table.try_gather(ids)?)
                }
            }
        )+
    };
}
lookups!(
    [SEQ] (SEQ,) => (SEQ, Const<M>);
    [B, SEQ] (B, SEQ) => (B, SEQ, Const<M>);
);

impl<const V: usize, const M: usize, WQ: FakeQuantizer> QuantizedModule for QEmbedding<V, M, WQ> {
    fn visit_slots(&mut self, name: &str, f: &mut SlotVisitor<'_>) -> Result<()> {
        visit_layer_slots(
            name,
            LayerKind::Embedding,
            [(Slot::WEIGHTS, &mut self.weights_quantizer)],
            f,
        )
    }

    fn lower(&self, name: &str, _g: &mut GraphBuilder, _x: ValueId) -> Result<ValueId, GraphError> {
        Err(GraphError::Unsupported {
            layer: name.to_string(),
            reason: "an Embedding looks up token ids, which the graph's float input does not carry; export the layers after it, or replace the lookup by a learned tensor added to the input".into(),
        })
    }
}
