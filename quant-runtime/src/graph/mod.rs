//! The graph IR of a quantized model: what export formats write, what the integer runtime and
//! the float reference interpreter run, and what reports read.
//!
//! A [`Graph`] has one float input, a list of [`Node`]s in execution order and one output. Each
//! node runs an [`Op`] on the values its `inputs` name and produces one value, named like the
//! node: the dotted name of the layer (or quantizer slot) it comes from. A node may only read
//! the graph's input and the values of nodes before it, so a graph is acyclic by construction
//! and every value is defined once.
//!
//! Quantization is explicit. A quantized activation is the output of a [`Op::QuantizeDequantize`] node,
//! which carries its quantizer's inferable form and is named after the quantizer's slot
//! (`fc1.input`); a quantized weight is a [`Parameter`] holding integer codes and its quantizer;
//! a bias that deployment holds in int32 at the accumulator's scale `s_input · s_weight[o]` is
//! a [`ParamValues::Accumulator`] parameter. A model lowered with some quantizers disabled
//! simply lacks those nodes and holds float parameters: the float reference of a report is the
//! same model lowered with every quantizer disabled.
//!
//! Shapes are per sample (no batch axis) and follow dfdx and ONNX: `[features]`,
//! `[tokens, features]`, `[channels, height, width]` or attention's `[heads, queries, keys]`;
//! what a value's axes mean is its [`Axes`], not its rank. Each op lives in one file under
//! `graph/ops/` with everything it means (shape, axes, float reference, integer preparation and
//! kernel, ONNX form). [`Graph::check`] infers every value's shape and checks every
//! op against it, every parameter against its op, and every size against the limits below, so
//! that a graph read from a hostile file is rejected with a typed error before anything is
//! allocated for it.

mod builder;
mod eval;
mod ops;
mod params;

pub use builder::{bias_parameter, GraphBuilder, ValueId};
pub use eval::{evaluate, evaluate_rewriting, Evaluation, NodeInput};
pub use ops::{
    out_len, AttentionContext, AttentionScores, AvgPool2d, ChannelAffine, Conv2d, Conv2dGeometry,
    ImageTokens, LayerNorm, Linear, MaxPool2d, Op, PoolGeometry, QuantizeDequantize,
};
pub use params::{ExportedQuantizer, ParamValues, Parameter, QuantizerOrigin};

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::GraphError;

/// Name of the graph's float input value.
pub const INPUT: &str = "input";

/// Largest element count of any one value (per sample) or parameter of a graph. Guards every
/// allocation a hostile graph could ask for.
pub const MAX_ELEMENTS: usize = 1 << 28;

/// Most nodes a graph may hold.
pub const MAX_NODES: usize = 1 << 16;

/// Longest node name, in bytes.
pub const MAX_NAME_LEN: usize = 1024;

/// What the axes of a per-sample value mean. Every value has one meaning, which its producer's
/// rule gives ([`Op::output_axes`]) and each op checks of its inputs: a rank alone does not say
/// whether `[a, b, c]` are feature maps or attention heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Axes {
    /// `[features]`.
    Features,
    /// `[tokens, features]`: a sequence, whose row-wise ops (Linear, LayerNorm) act on each
    /// token.
    Tokens,
    /// `[channels, height, width]` feature maps.
    Maps,
    /// `[heads, queries, keys]`: attention scores or probabilities.
    Heads,
}

impl Axes {
    /// The rank of a value with these axes.
    pub fn rank(self) -> usize {
        match self {
            Axes::Features => 1,
            Axes::Tokens => 2,
            Axes::Maps | Axes::Heads => 3,
        }
    }

    /// The meaning of a graph input of rank `rank` whose file does not say: features, tokens or
    /// maps.
    pub fn of_input_rank(rank: usize) -> Option<Axes> {
        match rank {
            1 => Some(Axes::Features),
            2 => Some(Axes::Tokens),
            3 => Some(Axes::Maps),
            _ => None,
        }
    }

    /// How messages name them.
    pub fn describe(self) -> &'static str {
        match self {
            Axes::Features => "[features]",
            Axes::Tokens => "[tokens, features]",
            Axes::Maps => "[channels, height, width] maps",
            Axes::Heads => "[heads, queries, keys] attention scores",
        }
    }
}

/// The float input of a graph.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphInput {
    /// The input value's name ([`INPUT`]).
    pub name: String,
    /// Shape of one sample: `[features]`, `[tokens, features]` or `[channels, height, width]`
    /// (or `[heads, queries, keys]` when `axes` says so).
    pub shape: Vec<usize>,
    /// What the shape's axes mean; files that do not say (every file written before axes were
    /// named) mean features, tokens or maps by rank ([`Axes::of_input_rank`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub axes: Option<Axes>,
}

impl GraphInput {
    /// What the input's axes mean: as given, or by rank.
    pub fn axes(&self) -> Option<Axes> {
        self.axes.or_else(|| Axes::of_input_rank(self.shape.len()))
    }
}

/// One node: an op on named values, producing the value named `name`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    /// The node's name, also the name of the value it produces: the dotted name of the layer or
    /// quantizer slot it comes from (`0`, `fc1`, `fc1.input`).
    pub name: String,
    /// The values it reads, by name: the graph input or earlier nodes.
    pub inputs: Vec<String>,
    /// What it computes.
    pub op: Op,
}

/// A quantized model as a graph; see the module docs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Graph {
    /// The float input.
    pub input: GraphInput,
    /// The nodes, in execution order.
    pub nodes: Vec<Node>,
    /// The name of the value the model returns (float logits).
    pub output: String,
    /// What produced it (model name, policy, seed, ...).
    #[serde(default)]
    pub info: BTreeMap<String, String>,
}

/// The shape of every value of a checked graph, and what its axes mean.
#[derive(Debug, Clone, PartialEq)]
pub struct Shapes {
    /// Per-sample shape of the input.
    pub input: Vec<usize>,
    /// Per-sample shape of each node's output, in node order.
    pub nodes: Vec<Vec<usize>>,
    /// What the axes of each value mean: the input's, then each node's output's.
    pub axes: Vec<Axes>,
}

impl Shapes {
    /// What the axes of value `v` mean, numbered as [`Graph::value_numbers`] does.
    pub(crate) fn axes_of_value(&self, v: usize) -> Axes {
        self.axes[v]
    }

    /// The per-sample shape of value `v`, numbered as [`Graph::value_numbers`] does.
    pub(crate) fn of_value(&self, v: usize) -> &[usize] {
        if v == 0 {
            &self.input
        } else {
            &self.nodes[v - 1]
        }
    }
}

/// A problem with one node (or the graph as a whole, named `(graph)`), as text.
pub(crate) type NodeError = (String, String);

/// Per-sample element count of `shape`, when within [`MAX_ELEMENTS`] and non-zero.
pub(crate) fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape
        .iter()
        .try_fold(1usize, |a, d| a.checked_mul(*d))
        .filter(|n| *n > 0 && *n <= MAX_ELEMENTS)
}

impl Graph {
    /// Infers every value's shape and checks the graph: a valid input shape; at most
    /// [`MAX_NODES`] nodes with distinct names of at most [`MAX_NAME_LEN`] bytes; every input
    /// naming the graph input or an earlier node; every op's arity, geometry and parameters
    /// (codes on their grid, quantizers per tensor or per output channel, lengths matching the
    /// geometry); every value and parameter within [`MAX_ELEMENTS`]; an output that names a
    /// value.
    ///
    /// # Errors
    /// [`GraphError::Invalid`] naming the node and what is wrong.
    pub fn check(&self) -> Result<Shapes, GraphError> {
        self.infer(true)
            .map_err(|(node, reason)| GraphError::Invalid { node, reason })
    }

    /// [`Graph::check`] without the parameters' values (before a loader reads them): the
    /// structure, every op's geometry and every shape.
    pub(crate) fn check_structure(&self) -> Result<Shapes, GraphError> {
        self.infer(false)
            .map_err(|(node, reason)| GraphError::Invalid { node, reason })
    }

    fn infer(&self, values: bool) -> Result<Shapes, NodeError> {
        let graph = |m: String| ("(graph)".to_string(), m);
        if checked_numel(&self.input.shape).is_none() || self.input.shape.is_empty() {
            return Err(graph(format!(
                "input shape {:?} is not a valid sample shape (non-empty, no zero, at most {MAX_ELEMENTS} elements)",
                self.input.shape
            )));
        }
        let input_axes = match self.input.axes() {
            Some(axes) if axes.rank() == self.input.shape.len() => axes,
            Some(axes) => {
                return Err(graph(format!(
                    "input shape {:?} does not have the rank of {}",
                    self.input.shape,
                    axes.describe()
                )))
            }
            None => {
                return Err(graph(format!(
                    "input shape {:?}: expected [features], [tokens, features] or [channels, height, width]",
                    self.input.shape
                )))
            }
        };
        if self.nodes.len() > MAX_NODES {
            return Err(graph(format!(
                "{} nodes; at most {MAX_NODES} are supported",
                self.nodes.len()
            )));
        }
        let mut index: HashMap<&str, usize> = HashMap::with_capacity(self.nodes.len() + 1);
        index.insert(self.input.name.as_str(), 0);
        let mut shapes: Vec<Vec<usize>> = Vec::with_capacity(self.nodes.len() + 1);
        shapes.push(self.input.shape.clone());
        let mut axes = vec![input_axes];
        // The op producing each value (`None` for the input).
        let mut producers: Vec<Option<&Op>> = vec![None];
        for node in &self.nodes {
            let at = |m: String| (short(&node.name), m);
            if node.name.is_empty() || node.name.len() > MAX_NAME_LEN {
                return Err(at(format!(
                    "a node name must have 1..={MAX_NAME_LEN} bytes"
                )));
            }
            let mut inputs = Vec::with_capacity(node.inputs.len());
            let mut input_axes = Vec::with_capacity(node.inputs.len());
            let mut quantized_input = false;
            for (k, name) in node.inputs.iter().enumerate() {
                match index.get(name.as_str()) {
                    Some(&i) => {
                        inputs.push(shapes[i].as_slice());
                        input_axes.push(axes[i]);
                        if k == 0 {
                            quantized_input =
                                matches!(producers[i], Some(Op::QuantizeDequantize(_)));
                        }
                    }
                    None => {
                        return Err(at(format!(
                        "input `{}` is not the graph input or an earlier node (dangling or cyclic)",
                        short(name)
                    )))
                    }
                }
            }
            let shape = node.op.shape(&inputs, values).map_err(&at)?;
            let output_axes = node.op.output_axes(&input_axes).map_err(&at)?;
            debug_assert_eq!(output_axes.rank(), shape.len(), "{}", node.op.name());
            if values && node.op.accumulator_bias() && !quantized_input {
                return Err(at(
                    "its bias is held at the accumulator's scale s_input · s_weight, but its input is not quantized"
                        .into(),
                ));
            }
            if checked_numel(&shape).is_none() {
                return Err(at(format!(
                    "output shape {shape:?} is empty or holds more than {MAX_ELEMENTS} values"
                )));
            }
            if index.insert(node.name.as_str(), shapes.len()).is_some() {
                return Err(at("the name is used twice".into()));
            }
            shapes.push(shape);
            axes.push(output_axes);
            producers.push(Some(&node.op));
        }
        if !index.contains_key(self.output.as_str()) {
            return Err(graph(format!(
                "output `{}` names no value",
                short(&self.output)
            )));
        }
        let input = shapes.remove(0);
        Ok(Shapes {
            input,
            nodes: shapes,
            axes,
        })
    }

    /// The index of the node producing `name` (`None` for the graph input or an unknown name).
    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// The values numbered as the interpreters number them (0 the input, `i + 1` the output of
    /// node `i`): each node's inputs, and the graph's output. For a checked graph, where every
    /// name resolves (an unknown one would read as the input).
    pub(crate) fn value_numbers(&self) -> (Vec<Vec<usize>>, usize) {
        // One map, built once: a linear search per name made long chains quadratic.
        let mut numbers: HashMap<&str, usize> = HashMap::with_capacity(self.nodes.len());
        for (i, node) in self.nodes.iter().enumerate().rev() {
            numbers.insert(node.name.as_str(), i + 1);
        }
        let number = |name: &str| -> usize {
            if name == self.input.name {
                0
            } else {
                numbers.get(name).copied().unwrap_or(0)
            }
        };
        let inputs = self
            .nodes
            .iter()
            .map(|node| node.inputs.iter().map(|s| number(s)).collect())
            .collect();
        (inputs, number(&self.output))
    }
}

/// `s`, cut to 200 bytes (at a character boundary) with its length, for messages about names
/// read from files.
pub(crate) fn short(s: &str) -> String {
    const LIMIT: usize = 200;
    if s.len() <= LIMIT {
        return s.to_string();
    }
    let mut end = LIMIT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> Op {
        Op::MaxPool2d(MaxPool2d {
            window: PoolGeometry {
                kernel: [2, 2],
                stride: [2, 2],
                padding: [0, 0],
            },
        })
    }

    /// Attention scores `[heads, queries, keys]` have the rank of feature maps; their axes say
    /// they are not, so a pooling or convolution over them is refused where it is added and
    /// where a file is checked.
    #[test]
    fn axes_say_what_a_rank_cannot() {
        let mut g = GraphBuilder::new(&[4, 6]).unwrap();
        let x = g.input();
        assert_eq!(g.axes(x), Axes::Tokens);
        let scores = Op::AttentionScores(AttentionScores { heads: 2 });
        let s = g.add("scores", scores, &[x, x]).unwrap();
        assert_eq!((g.shape(s), g.axes(s)), (&[2, 4, 4][..], Axes::Heads));
        let e = g.add("pool", pool(), &[s]).unwrap_err().to_string();
        let wanted = "needs [channels, height, width] maps; it receives [heads, queries, keys]";
        assert!(e.contains("pool") && e.contains(wanted), "{e}");

        let mut graph = g.finish(s, BTreeMap::new()).unwrap();
        graph.nodes.push(Node {
            name: "pool".into(),
            inputs: vec!["scores".into()],
            op: pool(),
        });
        graph.output = "pool".into();
        let e = graph.check().unwrap_err().to_string();
        assert!(e.contains(wanted), "{e}");
    }

    /// A graph input says what its axes mean, or means features, tokens or maps by rank (every
    /// file written before axes were named); a meaning of another rank is refused.
    #[test]
    fn an_input_says_its_axes_or_its_rank_does() {
        let g = GraphBuilder::new(&[3, 4, 4]).unwrap();
        assert_eq!(g.axes(g.input()), Axes::Maps);
        let heads = GraphBuilder::with_axes(&[2, 4, 4], Axes::Heads).unwrap();
        assert_eq!(heads.axes(heads.input()), Axes::Heads);
        let e = GraphBuilder::with_axes(&[4, 6], Axes::Maps)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[4, 6]") && e.contains("rank of [channels, height, width]"),
            "{e}"
        );

        let by_rank = GraphBuilder::new(&[5]).unwrap();
        let x = by_rank.input();
        let json = serde_json::to_string(&by_rank.finish(x, BTreeMap::new()).unwrap());
        assert!(!json.unwrap().contains("axes"));
        let declared = GraphBuilder::with_axes(&[2, 4, 4], Axes::Heads).unwrap();
        let x = declared.input();
        let graph = declared.finish(x, BTreeMap::new()).unwrap();
        let json = serde_json::to_string(&graph).unwrap();
        assert!(json.contains(r#""axes":"Heads""#), "{json}");
        assert_eq!(
            serde_json::from_str::<Graph>(&json).unwrap().input,
            graph.input
        );
    }
}
