//! Building a graph node by node, checking each node's shapes as it is added: what lowering a
//! model (quant-dfdx) and the tests use.

use std::collections::{BTreeMap, HashMap};

use crate::GraphError;

use super::{
    checked_numel, Axes, ExportedQuantizer, Graph, GraphInput, Node, Op, ParamValues, Parameter,
    INPUT,
};

/// A value of a graph under construction: the graph input or a node's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ValueId(usize);

/// Builds a [`Graph`] node by node, inferring and checking each value's shape as it goes, so
/// that a module that does not fit its input fails where it is added, naming it.
///
/// ```
/// use quant_runtime::graph::{GraphBuilder, Op};
///
/// let mut g = GraphBuilder::new(&[1, 4, 4])?;
/// let x = g.input();
/// let y = g.add("flat", Op::Flatten, &[x])?;
/// assert_eq!(g.shape(y), &[16]);
/// let graph = g.finish(y, Default::default())?;
/// assert_eq!(graph.nodes[0].inputs, ["input"]);
/// # Ok::<(), quant_runtime::GraphError>(())
/// ```
#[derive(Debug, Clone)]
pub struct GraphBuilder {
    input: GraphInput,
    nodes: Vec<Node>,
    /// Shape of each value: the input, then each node's output.
    shapes: Vec<Vec<usize>>,
    /// What the axes of each value mean.
    axes: Vec<Axes>,
    names: HashMap<String, usize>,
}

impl GraphBuilder {
    /// A graph whose float input has per-sample shape `input_shape`, its axes meaning
    /// features, tokens or maps by rank ([`Axes::of_input_rank`]).
    ///
    /// # Errors
    /// An empty or oversized shape, or one that is neither `[features]`,
    /// `[tokens, features]` nor `[channels, height, width]`.
    pub fn new(input_shape: &[usize]) -> Result<GraphBuilder, GraphError> {
        GraphBuilder::build(input_shape, None)
    }

    /// A graph whose float input has per-sample shape `input_shape` with axes meaning `axes`.
    ///
    /// # Errors
    /// As [`GraphBuilder::new`], or a shape whose rank is not that of `axes`.
    pub fn with_axes(input_shape: &[usize], axes: Axes) -> Result<GraphBuilder, GraphError> {
        GraphBuilder::build(input_shape, Some(axes))
    }

    fn build(input_shape: &[usize], axes: Option<Axes>) -> Result<GraphBuilder, GraphError> {
        let input = GraphInput {
            name: INPUT.to_string(),
            shape: input_shape.to_vec(),
            axes,
        };
        // The empty graph's check covers the input shape.
        let shapes = Graph {
            input: input.clone(),
            nodes: Vec::new(),
            output: INPUT.to_string(),
            info: BTreeMap::new(),
        }
        .check()?;
        let mut names = HashMap::new();
        names.insert(INPUT.to_string(), 0);
        Ok(GraphBuilder {
            input,
            nodes: Vec::new(),
            shapes: vec![input_shape.to_vec()],
            axes: shapes.axes,
            names,
        })
    }

    /// The float input.
    pub fn input(&self) -> ValueId {
        ValueId(0)
    }

    /// The per-sample shape of `v`.
    pub fn shape(&self, v: ValueId) -> &[usize] {
        &self.shapes[v.0]
    }

    /// What the axes of `v` mean.
    pub fn axes(&self, v: ValueId) -> Axes {
        self.axes[v.0]
    }

    /// The name of `v`.
    pub fn name(&self, v: ValueId) -> &str {
        match v.0 {
            0 => &self.input.name,
            i => &self.nodes[i - 1].name,
        }
    }

    /// The op producing `v` (`None` for the input).
    pub fn producer(&self, v: ValueId) -> Option<&Op> {
        v.0.checked_sub(1).map(|i| &self.nodes[i].op)
    }

    /// Adds a node named `name` running `op` on `inputs`, and returns its output.
    ///
    /// # Errors
    /// [`GraphError::Invalid`] naming the node: a name already used, or an op that does not fit
    /// its inputs' shapes.
    pub fn add(
        &mut self,
        name: impl Into<String>,
        op: Op,
        inputs: &[ValueId],
    ) -> Result<ValueId, GraphError> {
        let name = name.into();
        let invalid = |reason: String| GraphError::Invalid {
            node: name.clone(),
            reason,
        };
        if self.names.contains_key(&name) {
            return Err(invalid("the name is already used by another node".into()));
        }
        let shapes: Vec<&[usize]> = inputs.iter().map(|v| self.shape(*v)).collect();
        let shape = op.output_shape(&shapes).map_err(&invalid)?;
        let input_axes: Vec<Axes> = inputs.iter().map(|v| self.axes(*v)).collect();
        let axes = op.output_axes(&input_axes).map_err(&invalid)?;
        if checked_numel(&shape).is_none() {
            return Err(invalid(format!(
                "output shape {shape:?} is empty or too large"
            )));
        }
        let id = ValueId(self.shapes.len());
        self.names.insert(name.clone(), id.0);
        self.nodes.push(Node {
            inputs: inputs.iter().map(|v| self.name(*v).to_string()).collect(),
            name,
            op,
        });
        self.shapes.push(shape);
        self.axes.push(axes);
        Ok(id)
    }

    /// The graph returning `output`, checked as a whole ([`Graph::check`]).
    ///
    /// # Errors
    /// See [`Graph::check`].
    pub fn finish(
        self,
        output: ValueId,
        info: BTreeMap<String, String>,
    ) -> Result<Graph, GraphError> {
        let graph = Graph {
            output: match output.0 {
                0 => self.input.name.clone(),
                i => self.nodes[i - 1].name.clone(),
            },
            input: self.input,
            nodes: self.nodes,
            info,
        };
        graph.check()?;
        Ok(graph)
    }
}

/// The bias of a layer whose input goes through `input` (already lowered to `x`) and whose
/// weight is `weight`: int32 at the accumulator's scale `s_input · s_weight[o]` when both are
/// quantized (what the fake-quantized forward pass of a quantized layer adds), float
/// otherwise.
///
/// # Errors
/// A bias that does not fit its scales.
pub fn bias_parameter(
    tensor: &str,
    values: &[f32],
    input: Option<&ExportedQuantizer>,
    weight: &Parameter,
    layer: &str,
) -> Result<Parameter, GraphError> {
    let values = match (input, weight.values.quantizer()) {
        // Integer deployment (quant's runtime, ONNX QDQ) takes codes of at most 8 bits: a
        // wider input is a model that trains and exports its graph, but has no int32 bias.
        (Some(qi), Some(_)) if qi.inferable.grid().bits() > crate::integer::MAX_BITS => {
            return Err(GraphError::Unsupported {
                layer: layer.to_string(),
                reason: format!(
                    "its input is quantized to {} bits; integer deployment (quant's integer runtime, ONNX QDQ) takes activations of at most {} bits, whose accumulators hold the bias in int32: use 8 bits or fewer for integer inference",
                    qi.inferable.grid().bits(),
                    crate::integer::MAX_BITS
                ),
            })
        }
        (Some(qi), Some(qw)) => ParamValues::Accumulator(
            quant_core::accumulator::quantize_bias(
                values,
                qi.inferable.qparams().scales()[0],
                qw.inferable.qparams().scales(),
            )
            .map_err(|e| e.at(format!("layer `{layer}`")))?,
        ),
        _ => ParamValues::Float(values.to_vec()),
    };
    Ok(Parameter {
        tensor: tensor.to_string(),
        values,
    })
}
