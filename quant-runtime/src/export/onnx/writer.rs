//! Writes a graph as an ONNX model: each op's `write_onnx` (in its file under `graph/ops/`)
//! adds its ONNX nodes and initializers through the [`Writer`] here (or returns
//! [`GraphError::Unsupported`] naming the node when ONNX cannot express it).

use std::collections::{HashMap, HashSet};

use prost::Message;

mod transformer;

use super::proto::{
    attribute_type, data_type, AttributeProto, Dimension, DimensionValue, GraphProto, ModelProto,
    NodeProto, OperatorSetIdProto, StringStringEntryProto, TensorProto, TensorShapeProto,
    TensorTypeProto, TypeProto, ValueInfoProto,
};
use super::{OnnxConvention, Role, IR_VERSION, OPSET};
use crate::graph::{ExportedQuantizer, Graph, Node, Op, ParamValues, Parameter, Shapes};
use crate::GraphError;

/// Name of the ONNX model's input.
const INPUT: &str = "input";
/// Name of the ONNX model's output.
const OUTPUT: &str = "logits";
/// Name of the symbolic batch dimension.
const BATCH: &str = "N";
/// Largest message protobuf readers accept (2 GiB - 1).
const MAX_MODEL_BYTES: usize = i32::MAX as usize;

/// Serialises `graph` as an ONNX model following `convention`.
pub(super) fn write(graph: &Graph, convention: OnnxConvention) -> Result<Vec<u8>, GraphError> {
    let shapes = graph.check()?;
    let mut w = Writer::new(graph, &shapes, convention);
    for node in &graph.nodes {
        w.node(node)?;
    }
    if graph.output == graph.input.name {
        // A graph that returns its input: ONNX outputs need a node of their own.
        w.op(
            "Identity",
            &graph.output,
            &[INPUT.into()],
            OUTPUT.into(),
            Vec::new(),
        );
    }
    let model = w.finish();
    let len = model.encoded_len();
    if len > MAX_MODEL_BYTES {
        return Err(GraphError::Unsupported {
            layer: "(graph)".into(),
            reason: format!(
                "the ONNX model would take {len} bytes; protobuf readers accept at most {MAX_MODEL_BYTES}"
            ),
        });
    }
    Ok(model.encode_to_vec())
}

/// An integer tensor type ONNX stores codes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CodeType {
    Int8,
    Uint8,
}

impl CodeType {
    /// The storage type of a grid of at most 8 bits (checked by the convention before).
    pub(crate) fn of(q: &ExportedQuantizer) -> CodeType {
        if q.inferable.grid().signed() {
            CodeType::Int8
        } else {
            CodeType::Uint8
        }
    }

    fn data_type(self) -> i32 {
        match self {
            CodeType::Int8 => data_type::INT8,
            CodeType::Uint8 => data_type::UINT8,
        }
    }

    pub(crate) fn range(self) -> (i32, i32) {
        match self {
            CodeType::Int8 => (-128, 127),
            CodeType::Uint8 => (0, 255),
        }
    }

    /// Codes as raw bytes (each fits: the graph checked codes against their grid).
    fn bytes(self, codes: &[i32]) -> Vec<u8> {
        match self {
            CodeType::Int8 => codes.iter().map(|c| *c as i8 as u8).collect(),
            CodeType::Uint8 => codes.iter().map(|c| *c as u8).collect(),
        }
    }
}

/// The `cols × rows` transpose of a row-major `rows × cols` matrix.
fn transposed<T: Copy>(v: &[T], rows: usize, cols: usize) -> Vec<T> {
    (0..rows * cols)
        .map(|k| v[(k % rows) * cols + k / rows])
        .collect()
}

/// The values of a parameter that must hold floats (a scale, shift or position embedding).
pub(crate) fn float_values<'p>(node: &Node, p: &'p Parameter) -> Result<&'p [f32], GraphError> {
    match &p.values {
        ParamValues::Float(v) => Ok(v),
        _ => Err(GraphError::Invalid {
            node: node.name.clone(),
            reason: format!("`{}` must hold float values", p.tensor),
        }),
    }
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub(crate) fn int_attr(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INT,
        i,
        ints: Vec::new(),
    }
}

pub(crate) fn ints_attr(name: &str, ints: &[usize]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INTS,
        i: 0,
        ints: ints.iter().map(|v| *v as i64).collect(),
    }
}

fn tensor_type(shape: &[usize]) -> TypeProto {
    let mut dim = vec![Dimension {
        value: Some(DimensionValue::DimParam(BATCH.into())),
    }];
    dim.extend(shape.iter().map(|d| Dimension {
        value: Some(DimensionValue::DimValue(*d as i64)),
    }));
    TypeProto {
        tensor_type: Some(TensorTypeProto {
            elem_type: data_type::FLOAT,
            shape: Some(TensorShapeProto { dim }),
        }),
    }
}

/// Distinct names: the first request for a name gets it, later ones a numbered variant.
#[derive(Default)]
struct Names(HashSet<String>);

impl Names {
    fn fresh(&mut self, base: &str) -> String {
        // An empty name means "no value" to ONNX (a tensor name read from a file may be empty).
        let base = if base.is_empty() { "value" } else { base };
        let mut name = base.to_string();
        let mut k = 1;
        while !self.0.insert(name.clone()) {
            k += 1;
            name = format!("{base}_{k}");
        }
        name
    }
}

/// A graph node as its op's `OpRules::write_onnx` sees it: the ONNX
/// values of its inputs, their per-sample shapes and the ONNX value it must write.
pub(crate) struct OnnxNode<'g> {
    /// The graph node.
    pub node: &'g Node,
    /// The ONNX value of each input.
    pub inputs: Vec<String>,
    /// Each input's per-sample shape.
    pub shapes: Vec<&'g [usize]>,
    /// The ONNX value the node writes.
    pub out: String,
}

/// An ONNX model under construction.
pub(crate) struct Writer<'g> {
    graph: &'g Graph,
    shapes: &'g Shapes,
    pub(crate) convention: OnnxConvention,
    /// ONNX value names in use (values and initializers share one namespace).
    values: Names,
    /// ONNX node names in use.
    node_names: Names,
    /// The ONNX value holding each graph value.
    value_of: HashMap<&'g str, String>,
    /// The index of the node producing each graph value.
    producer: HashMap<&'g str, usize>,
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
}

impl<'g> Writer<'g> {
    fn new(graph: &'g Graph, shapes: &'g Shapes, convention: OnnxConvention) -> Writer<'g> {
        let mut values = Names::default();
        values.fresh(INPUT);
        values.fresh(OUTPUT);
        let mut value_of = HashMap::new();
        value_of.insert(graph.input.name.as_str(), INPUT.to_string());
        let producer = graph
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i))
            .collect();
        // Graph values keep their names (the layer or slot they come from) where they can.
        for node in &graph.nodes {
            let name = if node.name == graph.output {
                OUTPUT.to_string()
            } else {
                values.fresh(&node.name)
            };
            value_of.insert(node.name.as_str(), name);
        }
        Writer {
            graph,
            shapes,
            convention,
            values,
            node_names: Names::default(),
            value_of,
            producer,
            nodes: Vec::new(),
            initializers: Vec::new(),
        }
    }

    /// Writes one graph node, as its op's rules say.
    fn node(&mut self, node: &'g Node) -> Result<(), GraphError> {
        let onnx_node = OnnxNode {
            node,
            inputs: (0..node.inputs.len())
                .map(|k| self.input(node, k))
                .collect(),
            shapes: (0..node.inputs.len())
                .map(|k| self.input_shape(node, k))
                .collect(),
            out: self.value_of[node.name.as_str()].clone(),
        };
        node.op.rules().write_onnx(self, &onnx_node)
    }

    /// The ONNX value of the node's `k`-th input.
    fn input(&self, node: &Node, k: usize) -> String {
        node.inputs
            .get(k)
            .and_then(|name| self.value_of.get(name.as_str()))
            .cloned()
            .unwrap_or_default()
    }

    /// The per-sample shape of the node's `k`-th input (the graph was checked).
    fn input_shape(&self, node: &Node, k: usize) -> &'g [usize] {
        let name = node.inputs.get(k).map(String::as_str).unwrap_or_default();
        match self.producer.get(name) {
            Some(&i) => &self.shapes.nodes[i],
            None => &self.shapes.input,
        }
    }

    /// The quantizer of the `QuantizeDequantize` node producing the node's first input, if any.
    fn input_quantizer(&self, node: &Node) -> Option<&'g ExportedQuantizer> {
        let i = *self.producer.get(node.inputs.first()?.as_str())?;
        match &self.graph.nodes[i].op {
            Op::QuantizeDequantize(q) => Some(&q.quantizer),
            _ => None,
        }
    }

    /// Adds an ONNX node `op_type` (named after the graph node `owner`) reading `inputs` and
    /// writing `output`.
    pub(crate) fn op(
        &mut self,
        op_type: &str,
        owner: &str,
        inputs: &[String],
        output: String,
        attribute: Vec<AttributeProto>,
    ) {
        let name = self.node_names.fresh(&format!("{owner}/{op_type}"));
        self.nodes.push(NodeProto {
            input: inputs.to_vec(),
            output: vec![output],
            name,
            op_type: op_type.into(),
            domain: String::new(),
            attribute,
        });
    }

    /// Adds `op_type(inputs)` writing a new value named `<node>.<what>`, and returns that value.
    pub(crate) fn step(
        &mut self,
        node: &Node,
        op_type: &str,
        inputs: &[String],
        attribute: Vec<AttributeProto>,
        what: &str,
    ) -> String {
        let out = self.value(&format!("{}.{what}", node.name));
        self.op(op_type, &node.name, inputs, out.clone(), attribute);
        out
    }

    /// Adds an initializer named after `base` and returns its name.
    pub(crate) fn initializer(
        &mut self,
        base: &str,
        data_type: i32,
        dims: &[usize],
        raw: Vec<u8>,
    ) -> String {
        let name = self.values.fresh(base);
        self.initializers.push(TensorProto {
            dims: dims.iter().map(|d| *d as i64).collect(),
            data_type,
            name: name.clone(),
            raw_data: raw,
        });
        name
    }

    /// A float initializer.
    pub(crate) fn floats(&mut self, base: &str, dims: &[usize], values: &[f32]) -> String {
        self.initializer(base, data_type::FLOAT, dims, f32_bytes(values))
    }

    /// A new intermediate value named after `base`.
    pub(crate) fn value(&mut self, base: &str) -> String {
        self.values.fresh(base)
    }

    /// Scale and zero point initializers of `q` (scalars per tensor, 1-D per channel) and the
    /// `axis` attribute a per-channel `DequantizeLinear` needs.
    pub(crate) fn qparams(
        &mut self,
        base: &str,
        q: &ExportedQuantizer,
        code: CodeType,
        axis: usize,
    ) -> (String, String, Vec<AttributeProto>) {
        let qp = q.inferable.qparams();
        let per_channel = qp.scales().len() > 1;
        let dims: Vec<usize> = if per_channel {
            vec![qp.scales().len()]
        } else {
            Vec::new()
        };
        let zero_points: &[i32] = if per_channel {
            qp.zero_points()
        } else {
            &qp.zero_points()[..1]
        };
        let scales: &[f32] = if per_channel {
            qp.scales()
        } else {
            &qp.scales()[..1]
        };
        let scale = self.floats(&format!("{base}.scale"), &dims, scales);
        let zero = self.initializer(
            &format!("{base}.zero_point"),
            code.data_type(),
            &dims,
            code.bytes(zero_points),
        );
        let attrs = if per_channel {
            vec![int_attr("axis", axis as i64)]
        } else {
            Vec::new()
        };
        (scale, zero, attrs)
    }

    /// A weight of `shape` (output channels first): a float initializer, or codes behind a
    /// `DequantizeLinear`. With `transpose`, a 2-D weight is stored `[in, out]` (for
    /// `MatMul`), its channels on axis 1.
    pub(crate) fn weight(
        &mut self,
        node: &Node,
        p: &Parameter,
        shape: &[usize],
        transpose: bool,
    ) -> Result<String, GraphError> {
        let stored_shape: Vec<usize> = if transpose {
            vec![shape[1], shape[0]]
        } else {
            shape.to_vec()
        };
        match &p.values {
            ParamValues::Float(v) => {
                let values = if transpose {
                    transposed(v, shape[0], shape[1])
                } else {
                    v.clone()
                };
                Ok(self.floats(&p.tensor, &stored_shape, &values))
            }
            ParamValues::Codes { codes, quantizer } => {
                self.convention
                    .check(&node.name, Role::Weights, quantizer)?;
                let code = CodeType::of(quantizer);
                let stored = if transpose {
                    transposed(codes, shape[0], shape[1])
                } else {
                    codes.clone()
                };
                let codes = self.initializer(
                    &format!("{}.codes", p.tensor),
                    code.data_type(),
                    &stored_shape,
                    code.bytes(&stored),
                );
                let axis = usize::from(transpose);
                let (scale, zero, attrs) = self.qparams(&p.tensor, quantizer, code, axis);
                let out = self.value(&p.tensor);
                self.op(
                    "DequantizeLinear",
                    &node.name,
                    &[codes, scale, zero],
                    out.clone(),
                    attrs,
                );
                Ok(out)
            }
            ParamValues::Accumulator(_) => Err(GraphError::Invalid {
                node: node.name.clone(),
                reason: format!("weight `{}` holds accumulator values", p.tensor),
            }),
        }
    }

    /// A bias of `out` values: float, or an accumulator bias at `s_input · s_weight[o]`
    /// (int32 behind a `DequantizeLinear`, or its float values, by convention).
    pub(crate) fn bias(
        &mut self,
        node: &Node,
        bias: &Parameter,
        weight: &Parameter,
        out: usize,
    ) -> Result<String, GraphError> {
        let acc = match &bias.values {
            ParamValues::Float(v) => return Ok(self.floats(&bias.tensor, &[out], v)),
            ParamValues::Accumulator(acc) => acc,
            ParamValues::Codes { .. } => {
                return Err(GraphError::Invalid {
                    node: node.name.clone(),
                    reason: format!("bias `{}` holds codes", bias.tensor),
                })
            }
        };
        let (Some(input), Some(w)) = (self.input_quantizer(node), weight.values.quantizer()) else {
            return Err(GraphError::Invalid {
                node: node.name.clone(),
                reason: "an accumulator bias needs a quantized input and quantized weights".into(),
            });
        };
        let s_in = input.inferable.qparams().scales()[0];
        let s_w = w.inferable.qparams().scales();
        if !self.convention.int32_bias() {
            let values = quant_core::accumulator::accumulator_to_float(acc, s_in, s_w);
            return Ok(self.floats(&bias.tensor, &[out], &values));
        }
        // The scale of each output's accumulator, rounded once to f32 (the float reference
        // computes `acc · (s_in · s_w)` in f64).
        let scales: Vec<f32> = s_w
            .iter()
            .map(|s| (s_in as f64 * *s as f64) as f32)
            .collect();
        let per_channel = scales.len() > 1;
        let dims: Vec<usize> = if per_channel { vec![out] } else { Vec::new() };
        let zeros = vec![0i32; dims.first().copied().unwrap_or(1)];
        let int32 = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let codes = self.initializer(
            &format!("{}.codes", bias.tensor),
            data_type::INT32,
            &[out],
            int32(acc),
        );
        let scale = self.floats(&format!("{}.scale", bias.tensor), &dims, &scales);
        let zero = self.initializer(
            &format!("{}.zero_point", bias.tensor),
            data_type::INT32,
            &dims,
            int32(&zeros),
        );
        let attrs = if per_channel {
            vec![int_attr("axis", 0)]
        } else {
            Vec::new()
        };
        let value = self.value(&bias.tensor);
        self.op(
            "DequantizeLinear",
            &node.name,
            &[codes, scale, zero],
            value.clone(),
            attrs,
        );
        Ok(value)
    }

    fn finish(self) -> ModelProto {
        let output_shape = match self.producer.get(self.graph.output.as_str()) {
            Some(&i) => &self.shapes.nodes[i],
            None => &self.shapes.input,
        };
        let mut metadata: Vec<StringStringEntryProto> = self
            .graph
            .info
            .iter()
            .map(|(k, v)| StringStringEntryProto {
                key: k.clone(),
                value: v.clone(),
            })
            .collect();
        metadata.push(StringStringEntryProto {
            key: "quant.onnx_convention".into(),
            value: self.convention.name().into(),
        });
        ModelProto {
            ir_version: IR_VERSION,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: OPSET,
            }],
            producer_name: "quant".into(),
            producer_version: env!("CARGO_PKG_VERSION").into(),
            doc_string: format!(
                "A quantized model exported by quant as QDQ ONNX ({} convention).",
                self.convention.name()
            ),
            graph: Some(GraphProto {
                node: self.nodes,
                name: "quant".into(),
                initializer: self.initializers,
                doc_string: String::new(),
                input: vec![ValueInfoProto {
                    name: INPUT.into(),
                    r#type: Some(tensor_type(&self.shapes.input)),
                }],
                output: vec![ValueInfoProto {
                    name: OUTPUT.into(),
                    r#type: Some(tensor_type(output_shape)),
                }],
            }),
            metadata_props: metadata,
        }
    }
}
