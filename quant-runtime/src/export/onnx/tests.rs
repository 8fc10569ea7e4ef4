//! The ONNX writer: the operators, initializers and attributes each graph op becomes (decoded
//! back with the writer's own messages), the conventions, and bad input. tests/integration/onnx.rs runs
//! the files in tract and checks the numbers.

use std::path::PathBuf;

use prost::Message;
use quant_core::{InferableQuantizer, IntegerGrid, QParams, QuantizationMethod, RoundingPolicy};

use super::proto::{data_type, DimensionValue, ModelProto, NodeProto, TensorProto};
use super::{OnnxConvention, OnnxFormat, ONNX_FILE, OPSET};
use crate::export::{save, save_with_optional, ExportFormat, QuantFormat};
use crate::graph::{
    Conv2dGeometry, ExportedQuantizer, Graph, GraphBuilder, Op, ParamValues, Parameter,
    PoolGeometry, QuantizerOrigin,
};
use crate::GraphError;

fn quantizer(
    method: QuantizationMethod,
    grid: IntegerGrid,
    rounding: RoundingPolicy,
    qparams: QParams,
) -> ExportedQuantizer {
    ExportedQuantizer {
        inferable: InferableQuantizer::new(method, grid, rounding, qparams).unwrap(),
        origin: QuantizerOrigin {
            training_method: "Ste".into(),
            quantizer: None,
            bits: grid.bits(),
            method,
        },
    }
}

/// Symmetric signed `bits`-bit, per tensor.
fn symmetric(bits: u32, narrow: bool, scale: f32) -> ExportedQuantizer {
    quantizer(
        QuantizationMethod::Symmetric,
        IntegerGrid::new(bits, true, narrow).unwrap(),
        RoundingPolicy::HalfEven,
        QParams::per_tensor(scale, 0).unwrap(),
    )
}

/// Uniform unsigned `bits`-bit with zero point `z`, per tensor.
fn uniform(bits: u32, scale: f32, z: i32) -> ExportedQuantizer {
    quantizer(
        QuantizationMethod::Uniform,
        IntegerGrid::new(bits, false, false).unwrap(),
        RoundingPolicy::HalfEven,
        QParams::per_tensor(scale, z).unwrap(),
    )
}

/// Codes of `weight_q` for a weight of `n` values: a ramp over the grid.
fn codes(q: &ExportedQuantizer, n: usize) -> Vec<i32> {
    let g = q.inferable.grid();
    let span = (g.quant_max() - g.quant_min() + 1) as usize;
    (0..n)
        .map(|i| g.quant_min() + (i * 7 % span) as i32)
        .collect()
}

/// A quantized MLP layer: input quantizer `act`, per-channel int8 weights, int32 bias.
fn mlp(act: ExportedQuantizer) -> Graph {
    let mut g = GraphBuilder::new(&[4]).unwrap();
    let x = g.input();
    let q = g
        .add(
            "fc.input",
            Op::QuantizeDequantize(crate::graph::QuantizeDequantize { quantizer: act }),
            &[x],
        )
        .unwrap();
    let wq = quantizer(
        QuantizationMethod::Symmetric,
        IntegerGrid::new(8, true, true).unwrap(),
        RoundingPolicy::HalfEven,
        QParams::per_channel(0, vec![0.01, 0.02, 0.03], vec![0; 3]).unwrap(),
    );
    let weight = Parameter {
        tensor: "fc.weight".into(),
        values: ParamValues::Codes {
            codes: codes(&wq, 12),
            quantizer: wq,
        },
    };
    let bias = Parameter {
        tensor: "fc.bias".into(),
        values: ParamValues::Accumulator(vec![5, -7, 100]),
    };
    let op = Op::Linear(crate::graph::Linear {
        in_features: 4,
        out_features: 3,
        weight,
        bias,
    });
    let y = g.add("fc", op, &[q]).unwrap();
    let y = g.add("act", Op::Relu, &[y]).unwrap();
    g.finish(y, Default::default()).unwrap()
}

fn decode(graph: &Graph, convention: OnnxConvention) -> ModelProto {
    let bytes = OnnxFormat::new(convention).to_bytes(graph).unwrap();
    ModelProto::decode(bytes.as_slice()).unwrap()
}

fn ops(m: &ModelProto) -> Vec<&str> {
    let g = m.graph.as_ref().unwrap();
    g.node.iter().map(|n| n.op_type.as_str()).collect()
}

fn initializer<'m>(m: &'m ModelProto, name: &str) -> &'m TensorProto {
    let g = m.graph.as_ref().unwrap();
    g.initializer
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no initializer `{name}`"))
}

fn node<'m>(m: &'m ModelProto, op_type: &str, output: &str) -> &'m NodeProto {
    let g = m.graph.as_ref().unwrap();
    g.node
        .iter()
        .find(|n| n.op_type == op_type && n.output[0] == output)
        .unwrap_or_else(|| panic!("no {op_type} writing `{output}`"))
}

#[test]
fn an_mlp_layer_is_qdq_gemm_with_int8_weights_and_an_int32_bias() {
    let m = decode(&mlp(uniform(8, 0.05, 3)), OnnxConvention::Standard);
    assert_eq!(m.opset_import[0].version, OPSET);
    assert_eq!(
        ops(&m),
        [
            "QuantizeLinear",
            "DequantizeLinear",
            "DequantizeLinear",
            "DequantizeLinear",
            "Gemm",
            "Relu"
        ]
    );
    let g = m.graph.as_ref().unwrap();
    // Input `input` [N, 4] and output `logits` [N, 3], N symbolic.
    let dims = |v: &super::proto::ValueInfoProto| -> Vec<DimensionValue> {
        let t = v.r#type.as_ref().unwrap().tensor_type.as_ref().unwrap();
        t.shape
            .as_ref()
            .unwrap()
            .dim
            .iter()
            .map(|d| d.value.clone().unwrap())
            .collect()
    };
    assert_eq!(g.input[0].name, "input");
    assert_eq!(
        dims(&g.input[0]),
        [
            DimensionValue::DimParam("N".into()),
            DimensionValue::DimValue(4)
        ]
    );
    assert_eq!(g.output[0].name, "logits");
    assert_eq!(
        dims(&g.output[0]),
        [
            DimensionValue::DimParam("N".into()),
            DimensionValue::DimValue(3)
        ]
    );
    // The activation: uint8, zero point 3, per tensor (scalars), no Clip (full uint8 grid).
    let zp = initializer(&m, "fc.input.zero_point");
    assert_eq!(
        (zp.data_type, zp.dims.as_slice(), zp.raw_data.as_slice()),
        (data_type::UINT8, &[][..], &[3u8][..])
    );
    // Weights: int8 codes [3, 4] behind a per-axis DequantizeLinear on axis 0.
    let w = initializer(&m, "fc.weight.codes");
    assert_eq!(
        (w.data_type, w.dims.as_slice()),
        (data_type::INT8, &[3i64, 4][..])
    );
    let dq = node(&m, "DequantizeLinear", "fc.weight");
    assert_eq!(dq.attribute[0].name, "axis");
    assert_eq!(dq.attribute[0].i, 0);
    assert_eq!(initializer(&m, "fc.weight.scale").dims, [3]);
    // Bias: int32 at s_in · s_w[o], zero point 0.
    let b = initializer(&m, "fc.bias.codes");
    assert_eq!(b.data_type, data_type::INT32);
    assert_eq!(&b.raw_data[8..12], &100i32.to_le_bytes());
    let s: Vec<f32> = initializer(&m, "fc.bias.scale")
        .raw_data
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(
        s,
        [0.01f32, 0.02, 0.03].map(|w| (0.05f32 as f64 * w as f64) as f32)
    );
    let gemm = node(&m, "Gemm", "fc");
    assert_eq!(gemm.input, ["fc.input", "fc.weight", "fc.bias"]);
    assert_eq!(
        (gemm.attribute[0].name.as_str(), gemm.attribute[0].i),
        ("transB", 1)
    );
    assert_eq!(node(&m, "Relu", "logits").input, ["fc"]);
}

#[test]
fn narrow_grids_are_clipped_to_their_real_range_before_quantize_linear() {
    // 4-bit uniform (codes 0..15) with zero point 2, and 8-bit symmetric narrow (-127..127).
    for (q, lo, hi) in [
        (uniform(4, 0.5, 2), -1.0f32, 6.5),
        (symmetric(8, true, 0.25), -31.75, 31.75),
    ] {
        let m = decode(&mlp(q), OnnxConvention::Standard);
        assert_eq!(ops(&m)[..2], ["Clip", "QuantizeLinear"]);
        let clip = node(&m, "Clip", "fc.input.clipped");
        let scalar = |name: &str| {
            f32::from_le_bytes(initializer(&m, name).raw_data[..4].try_into().unwrap())
        };
        assert_eq!((scalar(&clip.input[1]), scalar(&clip.input[2])), (lo, hi));
        assert_eq!(
            node(&m, "QuantizeLinear", "fc.input.codes").input[0],
            "fc.input.clipped"
        );
    }
    // The full int8 grid needs no clip.
    assert_eq!(
        ops(&decode(
            &mlp(symmetric(8, false, 0.25)),
            OnnxConvention::Standard
        ))[0],
        "QuantizeLinear"
    );
}

#[test]
fn tensorrt_and_openvino_write_float_biases_and_refuse_what_their_runtimes_do_not_run() {
    for convention in [OnnxConvention::TensorRt, OnnxConvention::OpenVino] {
        let m = decode(&mlp(symmetric(8, true, 0.05)), convention);
        let bias = initializer(&m, "fc.bias");
        assert_eq!(
            (bias.data_type, bias.dims.as_slice()),
            (data_type::FLOAT, &[3i64][..])
        );
        let b: Vec<f32> = bias
            .raw_data
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let expected =
            quant_core::accumulator::accumulator_to_float(&[5, -7, 100], 0.05, &[0.01, 0.02, 0.03]);
        assert_eq!(b, expected);
    }
    // TensorRT: every Q/DQ is int8 with zero point 0, so an unsigned activation is refused.
    let (layer, reason) = refusal(OnnxConvention::TensorRt, &mlp(uniform(8, 0.05, 3)));
    assert_eq!(layer, "fc.input");
    assert!(
        reason.contains("unsigned with zero point 3") && reason.contains("TensorRT"),
        "{reason}"
    );
    // OpenVINO runs such activations.
    decode(&mlp(uniform(8, 0.05, 3)), OnnxConvention::OpenVino);
    // Both refuse asymmetric weights.
    let mut graph = mlp(symmetric(8, false, 0.05));
    let Op::Linear(crate::graph::Linear { weight, .. }) = &mut graph.nodes[1].op else {
        unreachable!()
    };
    let wq = quantizer(
        QuantizationMethod::Uniform,
        IntegerGrid::new(8, true, false).unwrap(),
        RoundingPolicy::HalfEven,
        QParams::per_tensor(0.01, 4).unwrap(),
    );
    weight.values = ParamValues::Codes {
        codes: codes(&wq, 12),
        quantizer: wq,
    };
    decode(&graph, OnnxConvention::Standard);
    for convention in [OnnxConvention::TensorRt, OnnxConvention::OpenVino] {
        let (layer, reason) = refusal(convention, &graph);
        assert_eq!(layer, "fc");
        assert!(
            reason.contains("weights quantizer is signed with zero point 4"),
            "{reason}"
        );
    }
}

#[test]
fn every_op_has_its_onnx_form() {
    let mut g = GraphBuilder::new(&[2, 5, 5]).unwrap();
    let x = g.input();
    let q = g
        .add(
            "conv.input",
            Op::QuantizeDequantize(crate::graph::QuantizeDequantize {
                quantizer: uniform(8, 0.1, 0),
            }),
            &[x],
        )
        .unwrap();
    let wq = symmetric(4, false, 0.1);
    let geometry = Conv2dGeometry {
        in_channels: 2,
        out_channels: 4,
        kernel: [3, 3],
        stride: [2, 2],
        padding: [1, 1],
        groups: 2,
    };
    let conv = Op::Conv2d(crate::graph::Conv2d {
        geometry,
        weight: Parameter {
            tensor: "conv.weight".into(),
            values: ParamValues::Codes {
                codes: codes(&wq, 36),
                quantizer: wq,
            },
        },
        bias: Parameter::float("conv.bias", vec![0.1, 0.2, 0.3, 0.4]),
    });
    let y = g.add("conv", conv, &[q]).unwrap();
    let affine = Op::ChannelAffine(crate::graph::ChannelAffine {
        scale: Parameter::float("bn.scale", vec![1.0, 2.0, 3.0, 4.0]),
        shift: Parameter::float("bn.shift", vec![0.0; 4]),
    });
    let y = g.add("bn", affine, &[y]).unwrap();
    let y = g.add("tanh", Op::Tanh, &[y]).unwrap();
    let a = g
        .add(
            "max",
            Op::MaxPool2d(crate::graph::MaxPool2d {
                window: PoolGeometry {
                    kernel: [2, 2],
                    stride: [1, 1],
                    padding: [1, 1],
                },
            }),
            &[y],
        )
        .unwrap();
    let b = g
        .add(
            "avg",
            Op::AvgPool2d(crate::graph::AvgPool2d {
                window: PoolGeometry {
                    kernel: [2, 2],
                    stride: [1, 1],
                    padding: [1, 1],
                },
            }),
            &[y],
        )
        .unwrap();
    let y = g.add("sum", Op::Add, &[a, b]).unwrap();
    let lin = Op::Linear(crate::graph::Linear {
        in_features: 4,
        out_features: 2,
        weight: Parameter::float("rows.weight", (0..8).map(|v| v as f32).collect()),
        bias: Parameter::float("rows.bias", vec![0.0, 1.0]),
    });
    let y = g.add("rows", lin, &[y]).unwrap();
    let y = g.add("sig", Op::Sigmoid, &[y]).unwrap();
    let y = g.add("flat", Op::Flatten, &[y]).unwrap();
    let graph = g.finish(y, Default::default()).unwrap();
    let m = decode(&graph, OnnxConvention::Standard);
    assert_eq!(
        ops(&m),
        [
            "QuantizeLinear",
            "DequantizeLinear",
            "DequantizeLinear",
            "Conv",
            "Mul",
            "Add",
            "Tanh",
            "MaxPool",
            "AveragePool",
            "Add",
            "MatMul",
            "Add",
            "Sigmoid",
            "Flatten"
        ]
    );
    let conv = node(&m, "Conv", "conv");
    let attr = |n: &NodeProto, name: &str| {
        n.attribute
            .iter()
            .find(|a| a.name == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(attr(conv, "group").i, 2);
    assert_eq!(attr(conv, "pads").ints, [1, 1, 1, 1]);
    assert_eq!(attr(conv, "strides").ints, [2, 2]);
    assert_eq!(attr(conv, "kernel_shape").ints, [3, 3]);
    // Per-tensor weights: a scalar scale, no axis.
    assert!(initializer(&m, "conv.weight.scale").dims.is_empty());
    assert!(node(&m, "DequantizeLinear", "conv.weight")
        .attribute
        .is_empty());
    assert_eq!(initializer(&m, "bn.scale").dims, [4, 1, 1]);
    assert_eq!(
        attr(node(&m, "AveragePool", "avg"), "count_include_pad").i,
        1
    );
    // Linear over the last axis of [4, 3, 3] maps: MatMul by the [in, out] transpose.
    let w = initializer(&m, "rows.weight");
    assert_eq!(w.dims, [4, 2]);
    let w: Vec<f32> = w
        .raw_data
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(w, [0.0, 4.0, 1.0, 5.0, 2.0, 6.0, 3.0, 7.0]);
    assert_eq!(attr(node(&m, "Flatten", "logits"), "axis").i, 1);
}

#[test]
fn names_stay_unique_and_a_graph_returning_its_input_gets_an_identity() {
    // A node named like a generated value, and one named `logits` that is not the output.
    let mut g = GraphBuilder::new(&[3]).unwrap();
    let x = g.input();
    let a = g.add("logits", Op::Relu, &[x]).unwrap();
    let b = g.add("q.codes", Op::Tanh, &[a]).unwrap();
    let c = g
        .add(
            "q",
            Op::QuantizeDequantize(crate::graph::QuantizeDequantize {
                quantizer: uniform(8, 0.1, 0),
            }),
            &[b],
        )
        .unwrap();
    let graph = g.finish(c, Default::default()).unwrap();
    let m = decode(&graph, OnnxConvention::Standard);
    let gr = m.graph.as_ref().unwrap();
    let mut outputs: Vec<&str> = gr.node.iter().map(|n| n.output[0].as_str()).collect();
    outputs.extend(gr.initializer.iter().map(|t| t.name.as_str()));
    let count = outputs.len();
    outputs.sort_unstable();
    outputs.dedup();
    assert_eq!(outputs.len(), count, "{outputs:?}");
    assert_eq!(gr.node.last().unwrap().output[0], "logits");
    assert_eq!(node(&m, "Tanh", "q.codes").input[0], "logits_2");

    // Parameters with empty tensor names (ONNX reads an empty name as "no input").
    let mut g = GraphBuilder::new(&[2]).unwrap();
    let x = g.input();
    let op = Op::Linear(crate::graph::Linear {
        in_features: 2,
        out_features: 1,
        weight: Parameter::float("", vec![1.0, 2.0]),
        bias: Parameter::float("", vec![0.5]),
    });
    let y = g.add("fc", op, &[x]).unwrap();
    let m = decode(
        &g.finish(y, Default::default()).unwrap(),
        OnnxConvention::Standard,
    );
    assert_eq!(
        node(&m, "Gemm", "logits").input,
        ["input", "value", "value_2"]
    );

    let graph = GraphBuilder::new(&[3]).unwrap();
    let x = graph.input();
    let m = decode(
        &graph.finish(x, Default::default()).unwrap(),
        OnnxConvention::Standard,
    );
    assert_eq!(ops(&m), ["Identity"]);
    assert_eq!(node(&m, "Identity", "logits").input, ["input"]);
}

/// The layer and reason with which the writer of `convention` refuses `graph`.
fn refusal(convention: OnnxConvention, graph: &Graph) -> (String, String) {
    match OnnxFormat::new(convention).to_bytes(graph) {
        Err(GraphError::Unsupported { layer, reason }) => (layer, reason),
        other => panic!("expected the export to be refused, got {other:?}"),
    }
}

fn scratch(name: &str) -> PathBuf {
    crate::fs::scratch_dir(&format!("onnx-{name}"))
}

#[test]
fn rounding_onnx_cannot_express_is_refused_naming_the_node_and_nothing_is_written() {
    for rounding in [
        RoundingPolicy::HalfUp,
        RoundingPolicy::HalfAwayFromZero,
        RoundingPolicy::Floor,
    ] {
        let act = quantizer(
            QuantizationMethod::Uniform,
            IntegerGrid::UINT8,
            rounding,
            QParams::per_tensor(0.05, 0).unwrap(),
        );
        let graph = mlp(act);
        let err = OnnxFormat::default().to_bytes(&graph).unwrap_err();
        let GraphError::Unsupported { layer, reason } = &err else {
            panic!("{err}")
        };
        assert_eq!(layer, "fc.input");
        assert!(
            reason.contains(&format!("rounds {rounding}")) && reason.contains("HalfEven"),
            "{reason}"
        );
        assert!(err.to_string().starts_with("layer `fc.input`: "), "{err}");

        let dir = scratch("rounding").join("export");
        let err = save(&graph, &dir, &[&QuantFormat, &OnnxFormat::default()]).unwrap_err();
        assert!(matches!(err, GraphError::Unsupported { .. }), "{err}");
        assert!(!dir.exists(), "nothing is written");
        // As an optional format: quant's files are written, model.onnx is not, and why is said.
        let skipped =
            save_with_optional(&graph, &dir, &[&QuantFormat], &[&OnnxFormat::default()]).unwrap();
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].0, "ONNX");
        assert!(skipped[0].1.to_string().contains("fc.input"));
        assert!(dir.join("model.json").is_file() && !dir.join(ONNX_FILE).exists());
        std::fs::remove_dir_all(dir.parent().unwrap()).ok();
    }
    // Weights are stored as codes: their rounding is already applied and is accepted.
    let mut graph = mlp(uniform(8, 0.05, 0));
    let Op::Linear(crate::graph::Linear { weight, .. }) = &mut graph.nodes[1].op else {
        unreachable!()
    };
    let ParamValues::Codes { quantizer: q, .. } = &mut weight.values else {
        unreachable!()
    };
    q.inferable = InferableQuantizer::new(
        q.inferable.method(),
        q.inferable.grid(),
        RoundingPolicy::HalfUp,
        q.inferable.qparams().clone(),
    )
    .unwrap();
    decode(&graph, OnnxConvention::Standard);
}

#[test]
fn grids_wider_than_8_bits_are_refused_naming_the_node() {
    let (layer, reason) = refusal(OnnxConvention::Standard, &mlp(uniform(12, 0.01, 0)));
    assert_eq!(layer, "fc.input");
    assert!(
        reason.contains("12 bits") && reason.contains("at most 8"),
        "{reason}"
    );
}

#[test]
fn a_directory_that_cannot_be_written_is_an_io_error_naming_it_and_nothing_is_written() {
    let root = scratch("unwritable");
    let file = root.join("a-file");
    std::fs::write(&file, b"user data").unwrap();
    // Below a regular file: no directory can be made there (whatever the user's rights).
    let dir = file.join("export");
    let err = save(
        &mlp(uniform(8, 0.05, 0)),
        &dir,
        &[&QuantFormat, &OnnxFormat::default()],
    )
    .unwrap_err();
    assert!(matches!(err, GraphError::Io { .. }), "{err}");
    assert!(err.to_string().contains("a-file"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"user data");
    // A directory of the user's: refused, left as it was.
    let user = root.join("photos");
    std::fs::create_dir(&user).unwrap();
    std::fs::write(user.join("cat.jpg"), b"meow").unwrap();
    let err = save(&mlp(uniform(8, 0.05, 0)), &user, &[&OnnxFormat::default()]).unwrap_err();
    assert!(err.to_string().contains("photos"), "{err}");
    let entries: Vec<_> = std::fs::read_dir(&user)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries, ["cat.jpg"]);
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn the_format_writes_model_onnx_with_the_graphs_info() {
    let mut graph = mlp(uniform(8, 0.05, 0));
    graph.info.insert("model".into(), "mlp".into());
    let files = OnnxFormat::new(OnnxConvention::TensorRt)
        .encode(&mlp(symmetric(8, true, 0.05)))
        .unwrap();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].0, "model.onnx");
    let m = decode(&graph, OnnxConvention::Standard);
    assert_eq!(m.producer_name, "quant");
    let props: Vec<(&str, &str)> = m
        .metadata_props
        .iter()
        .map(|p| (p.key.as_str(), p.value.as_str()))
        .collect();
    assert_eq!(
        props,
        [("model", "mlp"), ("quant.onnx_convention", "Standard")]
    );
}
