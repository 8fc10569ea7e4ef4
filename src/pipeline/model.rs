//! What the pipeline needs to know about a model: the shape of its input batches, its classes,
//! and three dfdx forms of it (as trained, as deployed, quantized), tied together by [`Model`].
//!
//! Any dfdx model that converts ([`Convert`]: tuples, dfdx's composites, `#[derive(QuantizedModel)]`
//! structs) and maps a batch of samples to one logit per class is a classifier here; the traits
//! below are implemented for every such type, so a user writes none of them.

use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;

use dfdx::prelude::*;

use quant_core::QuantError;
use quant_dfdx::convert::Convert;
use quant_dfdx::layers::QuantizedModule;

/// The training tape.
pub type Taped = OwnedTape<f32, Cpu>;

/// A batch's logits: one row of `C` per sample.
pub type Logits<const C: usize, T = NoneTape> = Tensor<(usize, Const<C>), f32, Cpu, T>;

/// The shape of a batch of samples: the batch size, then one sample's dimensions, each a
/// `Const` (`(usize, Const<784>)`, `(usize, Const<1>, Const<28>, Const<28>)`). Implemented for
/// every such shape of rank 2 to 4.
pub trait BatchShape: Shape {
    /// One sample's dimensions.
    fn sample_shape() -> Vec<usize>;
    /// The shape of a batch of `n` samples.
    fn batch(n: usize) -> Self;
}

impl<const A: usize> BatchShape for (usize, Const<A>) {
    fn sample_shape() -> Vec<usize> {
        vec![A]
    }
    fn batch(n: usize) -> Self {
        (n, Const)
    }
}

impl<const A: usize, const B: usize> BatchShape for (usize, Const<A>, Const<B>) {
    fn sample_shape() -> Vec<usize> {
        vec![A, B]
    }
    fn batch(n: usize) -> Self {
        (n, Const, Const)
    }
}

impl<const A: usize, const B: usize, const C: usize> BatchShape
    for (usize, Const<A>, Const<B>, Const<C>)
{
    fn sample_shape() -> Vec<usize> {
        vec![A, B, C]
    }
    fn batch(n: usize) -> Self {
        (n, Const, Const, Const)
    }
}

/// A float model the pipeline trains and evaluates: batches of `S` in, `C` logits per sample
/// out, with and without a tape; saved and loaded with safetensors.
pub trait FloatModel<S: BatchShape, const C: usize>:
    TensorCollection<f32, Cpu, To<f32, Cpu> = Self>
    + Clone
    + Send
    + Sync
    + ModuleMut<Tensor<S, f32, Cpu, Taped>, Output = Logits<C, Taped>, Error: Into<QuantError>>
    + Module<Tensor<S, f32, Cpu>, Output = Logits<C>, Error: Into<QuantError>>
{
}

impl<S: BatchShape, const C: usize, M> FloatModel<S, C> for M where
    M: TensorCollection<f32, Cpu, To<f32, Cpu> = M>
        + Clone
        + Send
        + Sync
        + ModuleMut<Tensor<S, f32, Cpu, Taped>, Output = Logits<C, Taped>, Error: Into<QuantError>>
        + Module<Tensor<S, f32, Cpu>, Output = Logits<C>, Error: Into<QuantError>>
{
}

/// A quantized model (a [`Convert`]ed model's twin): trained with fake quantization, run in
/// evaluation, walked by name for policies and reports, lowered to the graph for export.
pub trait QuantizedModel<S: BatchShape, const C: usize>:
    TensorCollection<f32, Cpu>
    + Clone
    + Send
    + Sync
    + QuantizedModule
    + ModuleMut<Tensor<S, f32, Cpu, Taped>, Output = Logits<C, Taped>, Error: Into<QuantError>>
    + ModuleMut<Tensor<S, f32, Cpu>, Output = Logits<C>, Error: Into<QuantError>>
    + Module<Tensor<S, f32, Cpu>, Output = Logits<C>, Error: Into<QuantError>>
{
}

impl<S: BatchShape, const C: usize, M> QuantizedModel<S, C> for M where
    M: TensorCollection<f32, Cpu>
        + Clone
        + Send
        + Sync
        + QuantizedModule
        + ModuleMut<Tensor<S, f32, Cpu, Taped>, Output = Logits<C, Taped>, Error: Into<QuantError>>
        + ModuleMut<Tensor<S, f32, Cpu>, Output = Logits<C>, Error: Into<QuantError>>
        + Module<Tensor<S, f32, Cpu>, Output = Logits<C>, Error: Into<QuantError>>
{
}

/// The float model as it is quantized (BatchNorm folded, say): it converts to a
/// [`QuantizedModel`].
pub trait DeployModel<S: BatchShape, const C: usize>:
    Convert<Quantized: QuantizedModel<S, C>> + Send + Sync
{
}

impl<S: BatchShape, const C: usize, M> DeployModel<S, C> for M where
    M: Convert<Quantized: QuantizedModel<S, C>> + Send + Sync
{
}

/// Where a run's float weights come from.
#[derive(Clone)]
pub enum FloatWeights<F> {
    /// Trained by the run (`[float]`), from the model's initialisation with each seed.
    Train,
    /// A model trained elsewhere (the user's own loop): every seed quantizes these weights.
    Given(F),
    /// A safetensors file of the model's tensors (names as dfdx saves them): every seed
    /// quantizes these weights.
    Safetensors(PathBuf),
}

/// A model the pipeline runs: how to build it, how to prepare it for quantization, and where
/// its float weights come from, for batches of `S` and `C` classes.
///
/// ```
/// use quant::dfdx::prelude::*;
/// use quant::pipeline::Model;
///
/// type Mlp = (Linear<784, 64>, ReLU, Linear<64, 5>);
/// let model: Model<(usize, Const<784>), 5, _> =
///     Model::new("mlp-784-64-5", |dev| dev.build_module::<Mlp, f32>());
/// assert_eq!(model.name(), "mlp-784-64-5");
/// assert_eq!(model.sample_shape(), vec![784]);
/// ```
pub struct Model<S, const C: usize, F, D = F> {
    name: String,
    build: Arc<dyn Fn(&Cpu) -> F + Send + Sync>,
    deploy: Arc<dyn Fn(&F) -> D + Send + Sync>,
    weights: FloatWeights<F>,
    input: PhantomData<fn() -> S>,
}

impl<S, const C: usize, F: Clone + 'static> Model<S, C, F, F> {
    /// A model named `name` (reports, the float cache) built by `build` from a device whose
    /// generator the run seeds; quantized as it is trained, and trained by the run.
    pub fn new(name: impl Into<String>, build: impl Fn(&Cpu) -> F + Send + Sync + 'static) -> Self {
        Model {
            name: name.into(),
            build: Arc::new(build),
            deploy: Arc::new(F::clone),
            weights: FloatWeights::Train,
            input: PhantomData,
        }
    }
}

impl<S, const C: usize, F, D> Model<S, C, F, D> {
    /// Prepares the trained model for quantization with `deploy` (fold BatchNorm into the
    /// convolutions, say: [`quant_dfdx::fold::fold_batchnorm`]).
    pub fn with_deploy<D2>(
        self,
        deploy: impl Fn(&F) -> D2 + Send + Sync + 'static,
    ) -> Model<S, C, F, D2> {
        Model {
            name: self.name,
            build: self.build,
            deploy: Arc::new(deploy),
            weights: self.weights,
            input: PhantomData,
        }
    }

    /// Starts every seed from these trained weights instead of training.
    pub fn with_weights(mut self, weights: FloatWeights<F>) -> Self {
        self.weights = weights;
        self
    }

    /// The model's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the float weights come from.
    pub fn weights(&self) -> &FloatWeights<F> {
        &self.weights
    }

    /// A freshly initialised float model (weights from `dev`'s generator).
    pub fn build(&self, dev: &Cpu) -> F {
        (self.build)(dev)
    }

    /// The float model prepared for quantization.
    pub fn deploy(&self, float: &F) -> D {
        (self.deploy)(float)
    }
}

impl<S: BatchShape, const C: usize, F, D> Model<S, C, F, D> {
    /// One sample's shape.
    pub fn sample_shape(&self) -> Vec<usize> {
        S::sample_shape()
    }

    /// The number of classes.
    pub const CLASSES: usize = C;
}

impl<S, const C: usize, F, D> Clone for Model<S, C, F, D>
where
    F: Clone,
{
    fn clone(&self) -> Self {
        Model {
            name: self.name.clone(),
            build: self.build.clone(),
            deploy: self.deploy.clone(),
            weights: self.weights.clone(),
            input: PhantomData,
        }
    }
}
