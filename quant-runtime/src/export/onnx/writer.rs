//! Writes a graph as an ONNX model: one method per graph op, each adding its ONNX nodes and
//! initializers. A new graph op gets one arm in [`Writer::node`] (and, when ONNX cannot
//! express it, that arm returns [`GraphError::Unsupported`] naming the node).

use std::collections::{HashMap, HashSet};

use prost::Message;

mod transformer;

use super::proto::{
    attribute_type, data_type, AttributeProto, Dimension, DimensionValue, GraphProto, ModelProto,
    NodeProto, OperatorSetIdProto, StringStringEntryProto, TensorProto, TensorShapeProto,
    TensorTypeProto, TypeProto, ValueInfoProto,
};
use super::{OnnxConvention, Role, IR_VERSION, OPSET};
use crate::graph::{
    Conv2dGeometry, ExportedQuantizer, Graph, Node, Op, ParamValues, Parameter, PoolGeometry,
    Shapes,
};
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
enum CodeType {
    Int8,
    Uint8,
}

impl CodeType {
    /// The storage type of a grid of at most 8 bits (checked by the convention before).
    fn of(q: &ExportedQuantizer) -> CodeType {
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

    fn range(self) -> (i32, i32) {
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
fn float_values<'p>(node: &Node, p: &'p Parameter) -> Result<&'p [f32], GraphError> {
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

fn int_attr(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INT,
        i,
        ints: Vec::new(),
    }
}

fn ints_attr(name: &str, ints: &[usize]) -> AttributeProto {
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

/// An ONNX model under construction.
struct Writer<'g> {
    graph: &'g Graph,
    shapes: &'g Shapes,
    convention: OnnxConvention,
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

    /// Writes one graph node: one arm per op.
    fn node(&mut self, node: &'g Node) -> Result<(), GraphError> {
        let out = self.value_of[node.name.as_str()].clone();
        let x = self.input(node, 0);
        let in_shape = self.input_shape(node, 0);
        match &node.op {
            Op::QuantizeDequantize { quantizer } => self.quantize(node, quantizer, x, out)?,
            Op::Linear {
                in_features,
                out_features,
                weight,
                bias,
            } => self.linear(
                node,
                [*in_features, *out_features],
                weight,
                bias,
                x,
                in_shape,
                out,
            )?,
            Op::Conv2d {
                geometry,
                weight,
                bias,
            } => self.conv(node, geometry, weight, bias, x, out)?,
            Op::ChannelAffine { scale, shift } => {
                self.channel_affine(node, scale, shift, x, in_shape, out)?
            }
            Op::Relu => self.op("Relu", &node.name, &[x], out, Vec::new()),
            Op::Tanh => self.op("Tanh", &node.name, &[x], out, Vec::new()),
            Op::Sigmoid => self.op("Sigmoid", &node.name, &[x], out, Vec::new()),
            Op::MaxPool2d(p) => self.pool("MaxPool", node, p, x, out, Vec::new()),
            Op::AvgPool2d(p) => {
                // Padding counts as zeros, as in the graph (and dfdx).
                let attrs = vec![int_attr("count_include_pad", 1)];
                self.pool("AveragePool", node, p, x, out, attrs)
            }
            Op::Flatten => self.op("Flatten", &node.name, &[x], out, vec![int_attr("axis", 1)]),
            Op::Add => {
                let y = self.input(node, 1);
                self.op("Add", &node.name, &[x, y], out, Vec::new())
            }
            // `[N, C, H, W]` → `[N, C, 1, 1]`, flattened to the graph's `[N, C]`.
            Op::GlobalAvgPool | Op::GlobalMaxPool => {
                let op_type = match node.op {
                    Op::GlobalAvgPool => "GlobalAveragePool",
                    _ => "GlobalMaxPool",
                };
                let pooled = self.step(node, op_type, &[x], Vec::new(), "pooled");
                self.op(
                    "Flatten",
                    &node.name,
                    &[pooled],
                    out,
                    vec![int_attr("axis", 1)],
                );
            }
            Op::LayerNorm {
                scale,
                shift,
                epsilon,
            } => self.layer_norm(node, [scale, shift], *epsilon, (x, in_shape), out)?,
            Op::Gelu => self.gelu(node, x, out),
            Op::Softmax => {
                let axis = in_shape.len() as i64;
                self.op(
                    "Softmax",
                    &node.name,
                    &[x],
                    out,
                    vec![int_attr("axis", axis)],
                )
            }
            Op::ImageTokens { position } => {
                self.image_tokens(node, position, (x, in_shape), out)?
            }
            Op::MeanTokens => self.mean_tokens(node, x, out),
            Op::AttentionScores { heads } | Op::AttentionContext { heads } => {
                let inputs = [x, self.input(node, 1)];
                let shapes = [in_shape, self.input_shape(node, 1)];
                self.attention(node, *heads, inputs, shapes, out)
            }
        }
        Ok(())
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
            Op::QuantizeDequantize { quantizer } => Some(quantizer),
            _ => None,
        }
    }

    /// Adds an ONNX node `op_type` (named after the graph node `owner`) reading `inputs` and
    /// writing `output`.
    fn op(
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
    fn step(
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
    fn initializer(&mut self, base: &str, data_type: i32, dims: &[usize], raw: Vec<u8>) -> String {
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
    fn floats(&mut self, base: &str, dims: &[usize], values: &[f32]) -> String {
        self.initializer(base, data_type::FLOAT, dims, f32_bytes(values))
    }

    /// A new intermediate value named after `base`.
    fn value(&mut self, base: &str) -> String {
        self.values.fresh(base)
    }

    /// Scale and zero point initializers of `q` (scalars per tensor, 1-D per channel) and the
    /// `axis` attribute a per-channel `DequantizeLinear` needs.
    fn qparams(
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

    /// `QuantizeDequantize`: `[Clip →] QuantizeLinear → DequantizeLinear`, per tensor.
    fn quantize(
        &mut self,
        node: &Node,
        q: &ExportedQuantizer,
        x: String,
        out: String,
    ) -> Result<(), GraphError> {
        self.convention.check(&node.name, Role::Activation, q)?;
        let code = CodeType::of(q);
        let grid = q.inferable.grid();
        let (scale, zero, _) = self.qparams(&node.name, q, code, 0);
        let s = q.inferable.qparams().scales()[0];
        let z = q.inferable.qparams().zero_points()[0];
        let mut x = x;
        if (grid.quant_min(), grid.quant_max()) != code.range() {
            // A narrow grid in wider storage: clip to the grid's real range, so that
            // QuantizeLinear yields codes on the grid ((q - z)·s divided by s rounds back to
            // q: the relative error of the two f32 operations is far below 0.5 / 2^8).
            let lo = (grid.quant_min() - z) as f32 * s;
            let hi = (grid.quant_max() - z) as f32 * s;
            let lo = self.floats(&format!("{}.min", node.name), &[], &[lo]);
            let hi = self.floats(&format!("{}.max", node.name), &[], &[hi]);
            x = self.step(node, "Clip", &[x, lo, hi], Vec::new(), "clipped");
        }
        let inputs = [x, scale.clone(), zero.clone()];
        let codes = self.step(node, "QuantizeLinear", &inputs, Vec::new(), "codes");
        self.op(
            "DequantizeLinear",
            &node.name,
            &[codes, scale, zero],
            out,
            Vec::new(),
        );
        Ok(())
    }

    /// A weight of `shape` (output channels first): a float initializer, or codes behind a
    /// `DequantizeLinear`. With `transpose`, a 2-D weight is stored `[in, out]` (for
    /// `MatMul`), its channels on axis 1.
    fn weight(
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
    fn bias(
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

    /// `Linear`: `Gemm` on `[N, in]`, `MatMul` + `Add` over the last axis of larger values.
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &mut self,
        node: &Node,
        [in_features, out_features]: [usize; 2],
        weight: &Parameter,
        bias: &Parameter,
        x: String,
        in_shape: &[usize],
        out: String,
    ) -> Result<(), GraphError> {
        let gemm = in_shape.len() == 1;
        let w = self.weight(node, weight, &[out_features, in_features], !gemm)?;
        let b = self.bias(node, bias, weight, out_features)?;
        if gemm {
            self.op(
                "Gemm",
                &node.name,
                &[x, w, b],
                out,
                vec![int_attr("transB", 1)],
            );
        } else {
            let product = self.step(node, "MatMul", &[x, w], Vec::new(), "matmul");
            self.op("Add", &node.name, &[product, b], out, Vec::new());
        }
        Ok(())
    }

    /// `Conv2d`: `Conv` with its groups, strides and zero padding.
    fn conv(
        &mut self,
        node: &Node,
        g: &Conv2dGeometry,
        weight: &Parameter,
        bias: &Parameter,
        x: String,
        out: String,
    ) -> Result<(), GraphError> {
        let w = self.weight(node, weight, &g.weight_shape(), false)?;
        let b = self.bias(node, bias, weight, g.out_channels)?;
        let attrs = vec![
            int_attr("group", g.groups as i64),
            ints_attr("kernel_shape", &[g.kernel, g.kernel]),
            ints_attr("strides", &[g.stride, g.stride]),
            ints_attr("pads", &[g.padding; 4]),
            ints_attr("dilations", &[1, 1]),
        ];
        self.op("Conv", &node.name, &[x, w, b], out, attrs);
        Ok(())
    }

    /// `ChannelAffine`: `Mul` and `Add` by per-channel factors shaped to broadcast over the
    /// first per-sample axis.
    fn channel_affine(
        &mut self,
        node: &Node,
        scale: &Parameter,
        shift: &Parameter,
        x: String,
        in_shape: &[usize],
        out: String,
    ) -> Result<(), GraphError> {
        let mut dims = vec![1usize; in_shape.len()];
        dims[0] = in_shape[0];
        let s = self.floats(&scale.tensor, &dims, float_values(node, scale)?);
        let t = self.floats(&shift.tensor, &dims, float_values(node, shift)?);
        let scaled = self.step(node, "Mul", &[x, s], Vec::new(), "scaled");
        self.op("Add", &node.name, &[scaled, t], out, Vec::new());
        Ok(())
    }

    /// `MaxPool` / `AveragePool` with the window's geometry (ceil_mode 0: the graph's floor).
    fn pool(
        &mut self,
        op_type: &str,
        node: &Node,
        p: &PoolGeometry,
        x: String,
        out: String,
        mut attrs: Vec<AttributeProto>,
    ) {
        attrs.extend([
            ints_attr("kernel_shape", &[p.kernel, p.kernel]),
            ints_attr("strides", &[p.stride, p.stride]),
            ints_attr("pads", &[p.padding; 4]),
        ]);
        self.op(op_type, &node.name, &[x], out, attrs);
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
