#!/usr/bin/env python3
"""Writes the hostile-input corpus under tests/hostile/ and its manifest, expected.toml.

Every file (or export directory) is one hostile input for one loader; the manifest says which
loader reads it and which substrings its error message must contain (the file, key, tensor or
layer it names). tests/integration/hostile.rs feeds each to its loader and checks the error. Rerun after
editing: `python3 tools/gen_hostile_corpus.py` (standard library only).
"""

import gzip
import json
import os
import shutil
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "hostile")
CASES = []  # (relative path, loader, [substrings])


def case(path, loader, contains, data):
    full = os.path.join(ROOT, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    CASES.append((path, loader, contains))


# ----- policy files (quant_dfdx::policy::Policy::from_file) ------------------------------------

LSQ_W = '[weights]\ntraining_method = "Lsq"\nmethod = "Symmetric"\nbits = 4\n'
LSQ_I = '[input]\ntraining_method = "Lsq"\nmethod = "Uniform"\nbits = 4\n'

case("policy/not_utf8.toml", "policy", ["not_utf8.toml", "UTF-8"], b"\xff\xfe[weights]\nbits = 4\n\x80")
case("policy/syntax_error.toml", "policy", ["syntax_error.toml"], "[weights\nbits = 4\n")
case("policy/truncated.toml", "policy", ["truncated.toml"], LSQ_W[:-9])
case("policy/unknown_key.toml", "policy", ["unknown_key.toml", "`weights.bitz`", "unknown field"],
     '[weights]\ntraining_method = "Lsq"\nbitz = 4\n')
case("policy/negative_bits.toml", "policy", ["negative_bits.toml", "`weights.bits`"],
     LSQ_W.replace("bits = 4", "bits = -1"))
case("policy/huge_bits.toml", "policy", ["huge_bits.toml", "`weights.bits`", "line 4"],
     LSQ_W.replace("bits = 4", "bits = 99999999999999999999999999"))
case("policy/bits_out_of_range.toml", "policy", ["bits_out_of_range.toml", "`weights`", "bits = 40"],
     LSQ_W.replace("bits = 4", "bits = 40"))
case("policy/bits_as_float.toml", "policy", ["`weights.bits`"], LSQ_W.replace("bits = 4", "bits = 4.5"))
case("policy/nan_option.toml", "policy", ["nan_option.toml", "`input`", "alpha"],
     LSQ_W + '[input]\ntraining_method = "Pact"\nmethod = "Uniform"\nbits = 4\noptions = { alpha = nan }\n')
case("policy/inf_option.toml", "policy", ["`input`", "alpha"],
     LSQ_W + '[input]\ntraining_method = "Pact"\nmethod = "Uniform"\nbits = 4\noptions = { alpha = inf }\n')
case("policy/unknown_option.toml", "policy", ["`weights`", "colour"],
     LSQ_W + "options = { colour = 3.0 }\n")
case("policy/unknown_training_method.toml", "policy",
     ["`weights.training_method`", "Lqs", "Lsq"], LSQ_W.replace('"Lsq"', '"Lqs"'))
case("policy/unknown_platform.toml", "policy", ["`platform`", "NoSuchChip"],
     'platform = "NoSuchChip"\n' + LSQ_W)
case("policy/unsupported_combination.toml", "policy", ["`weights`", "Pact"],
     LSQ_W.replace('"Lsq"', '"Pact"'))
case("policy/missing_method.toml", "policy", ["`weights`", "method"],
     '[weights]\ntraining_method = "Lsq"\nbits = 4\n')
case("policy/bad_pattern.toml", "policy", ["`overrides[0].pattern`", "unclosed character class at byte 0"],
     LSQ_W + LSQ_I + '[[overrides]]\npattern = "[unclosed"\nweights = { bits = 8 }\n')
case("policy/weights_on_pool.toml", "policy", ["`kinds.MaxPool2d.weights`"],
     LSQ_W + LSQ_I + "[kinds.MaxPool2d]\nweights = { bits = 8 }\n")
case("policy/huge_histogram.toml", "policy", ["`weights.observer`", "bins"],
     LSQ_W + 'observer = { kind = "Percentile", bins = 1000000000000 }\n')
case("policy/wrong_type.toml", "policy", ["`weights`"], 'weights = 7\n')
case("policy/deep_nesting.toml", "policy", ["deep_nesting.toml"], "weights = " + "[" * 5000 + "]" * 5000 + "\n")
case("policy/deep_tables.toml", "policy", ["deep_tables.toml"], "weights = " + "{a=" * 5000 + "1" + "}" * 5000 + "\n")
case("policy/huge_string.toml", "policy", ["`platform`", "\u2026 (20000 bytes)"], 'platform = "' + "x" * 20000 + '"\n')
case("policy/duplicate_key.toml", "policy", ["duplicate_key.toml"], LSQ_W + "bits = 8\n")
# Issue 10: glob patterns are length-limited before they are matched (globset, our glob crate
# then, panicked on some huge ones; the 200 KB and 1 MB cases are generated at test time by tests/integration/safety.rs); long values
# and keys are quoted cut; a UTF-8 byte-order mark is accepted, a UTF-16 one named.
case("policy/pattern_too_long.toml", "policy",
     ["`overrides[0].pattern`", "at most 512 bytes", "\u2026 (600 bytes)"],
     LSQ_W + LSQ_I + '[[overrides]]\npattern = "' + "*?" * 300 + '"\nweights = { bits = 8 }\n')
case("policy/long_key.toml", "policy", ["long_key.toml", "unknown field", "\u2026 (5000 bytes)"],
     LSQ_W + "k" * 5000 + " = 1\n")
case("policy/long_option.toml", "policy", ["`weights`", "option names of at most 256 bytes", "\u2026 (3000 bytes)"],
     LSQ_W + 'options = { ' + "o" * 3000 + ' = 1.0 }\n')
case("policy/bom.toml", "policy", [], b"\xef\xbb\xbf" + (LSQ_W + LSQ_I).encode())
case("policy/utf16.toml", "policy", ["utf16.toml", "UTF-16"], b"\xff\xfe" + (LSQ_W + LSQ_I).encode("utf-16-le"))

# ----- run files (quant::pipeline::RunConfig::from_file) --------------------------------------

RUN = '[model]\nkind = "mlp"\n[quantization]\n' + LSQ_W.replace("[weights]", "[quantization.weights]") \
    + LSQ_I.replace("[input]", "[quantization.input]")
case("run/zero_batch.toml", "run", ["zero_batch.toml", "`float.batch_size`"], RUN + "[float]\nbatch_size = 0\n")
case("run/huge_batch.toml", "run", ["huge_batch.toml", "`qat.batch_size`", "an integer in 1..=4096"], RUN + "[qat]\nbatch_size = 18446744073709551615\n")
case("run/negative_epochs.toml", "run", ["`float.epochs`"], RUN + "[float]\nepochs = -3\n")
case("run/no_seeds.toml", "run", ["`run.seeds`"], RUN + "[run]\nseeds = []\n")
case("run/nan_lr.toml", "run", ["`qat.lr`", "NaN"], RUN + "[qat]\nlr = nan\n")
case("run/missing_model.toml", "run", ["missing_model.toml", "model"], RUN.replace('[model]\nkind = "mlp"\n', ""))
case("run/unknown_model.toml", "run", ["`model.kind`", "vgg", "resnet"], RUN.replace('"mlp"', '"vgg"'))
case("run/bad_policy.toml", "run", ["`quantization.weights`", "bits = 1"],
     RUN.replace("bits = 4", "bits = 1", 1))
case("run/truncated.toml", "run", ["truncated.toml"], RUN[: len(RUN) // 2])
case("run/not_utf8.toml", "run", ["not_utf8.toml"], b"[model]\nkind = \"\xc3\x28\"\n")
# Issue 10: every count has a documented limit, checked before anything is allocated.
case("run/huge_epochs.toml", "run", ["huge_epochs.toml", "`float.epochs`", "at most 10000 epochs"],
     RUN + "[float]\nepochs = 1000000000000\n")
case("run/huge_qat_epochs.toml", "run", ["`qat.epochs`", "at most 10000 epochs"],
     RUN + "[qat]\nepochs = 1000000000000\n")
case("run/many_epochs.toml", "run", ["`float.epochs`", "100000000"], RUN + "[float]\nepochs = 100000000\n")
case("run/too_many_seeds.toml", "run", ["`run.seeds`", "at most 1000 seeds", "1001 seeds"],
     RUN + "[run]\nseeds = [" + ", ".join(str(i) for i in range(1001)) + "]\n")
case("run/too_much_work.toml", "run", ["`run.seeds`", "100000 epochs in all", "20 seeds"],
     RUN + "[run]\nseeds = [" + ", ".join(str(i) for i in range(20)) + "]\n[float]\nepochs = 6000\n")
case("run/long_data_path.toml", "run", ["`data.path`", "\u2026 (5000 bytes)"],
     RUN + '[data]\npath = "' + "d" * 5000 + '"\n')
case("run/bom.toml", "run", [], b"\xef\xbb\xbf" + RUN.encode())

# Issue 25: numeric settings that would make training diverge are refused up front.
case("run/distillation_temperature_huge.toml", "run",
     ["distillation_temperature_huge.toml", "qat.distillation.temperature", "0.1..=100"],
     RUN + "[qat]\ndistillation = { weight = 0.5, temperature = 1e300 }\n")
case("run/distillation_temperature_tiny.toml", "run", ["qat.distillation.temperature"],
     RUN + "[qat]\ndistillation = { weight = 0.5, temperature = 1e-300 }\n")

# ----- inferable quantizers (serde_json::from_slice::<quant_core::InferableQuantizer>) -------


def inferable(method="Symmetric", bits=8, signed=True, scales=(0.5,), zps=(0,), axis=None, **extra):
    q = {"method": method, "grid": {"bits": bits, "signed": signed, "narrow_range": False},
         "rounding": "HalfEven", "qparams": {"scales": list(scales), "zero_points": list(zps), "axis": axis}}
    q.update(extra)
    return q


def jcase(name, contains, value):
    case("inferable/" + name, "inferable", contains, value if isinstance(value, (str, bytes)) else json.dumps(value))


jcase("zero_scale.json", ["scales[0]", "not a valid scale"], inferable(scales=(0.0,)))
jcase("negative_scale.json", ["scales[0]"], inferable(scales=(-0.5,)))
jcase("subnormal_scale.json", ["scales[0]"], inferable(scales=(1e-40,)))
jcase("infinite_scale.json", ["number out of range"], json.dumps(inferable()).replace("0.5", "1e999"))
jcase("nan_scale.json", ["expected value"], json.dumps(inferable()).replace("0.5", "NaN"))
jcase("null_scale.json", ["null"], json.dumps(inferable()).replace("0.5", "null"))
jcase("negative_bits.json", ["-3"], inferable(bits=-3))
jcase("bits_40.json", ["bits = 40"], inferable(bits=40))
jcase("huge_bits.json", ["expected u32"], json.dumps(inferable()).replace('"bits": 8', '"bits": 1e30'))
jcase("zero_point_off_grid.json", ["zero_points[0]", "[0, 255]"],
      inferable(method="Uniform", signed=False, zps=(300,)))
jcase("symmetric_zero_point.json", ["zero_points[0]", "must be 0"], inferable(zps=(3,)))
jcase("power_of_two_not_power.json", ["power of two"], inferable(method="PowerOfTwo", scales=(0.3,)))
jcase("lengths_mismatch.json", ["zero_points", "expected 2, got 1"], inferable(scales=(0.5, 0.25), zps=(0,), axis=0))
jcase("per_tensor_two_scales.json", ["per-tensor"], inferable(scales=(0.5, 0.25), zps=(0, 0)))
jcase("empty_scales.json", ["scales"], inferable(scales=(), zps=()))
jcase("huge_axis.json", ["expected usize"], json.dumps(inferable(axis=0)).replace('"axis": 0', '"axis": 1e20'))
jcase("unknown_field.json", ["unknown field", "colour"], inferable(colour="red"))
jcase("unknown_method.json", ["Asymmetric"], inferable(method="Asymmetric"))
jcase("unknown_rounding.json", ["HalfSideways"], inferable(rounding="HalfSideways"))
jcase("wrong_type.json", ["invalid type"], inferable(scales="0.5"))
jcase("truncated.json", ["EOF"], json.dumps(inferable())[:40])
jcase("not_json.json", ["expected"], b"\x00\x01\x02garbage")
jcase("deep_nesting.json", ["line 1"], "[" * 20000 + "]" * 20000)
jcase("empty.json", ["EOF"], "")

# ----- exports (quant_runtime::export::load, then IntegerModel::new) -----------------------------
# Format version 2: model.json holds a graph of named nodes (see quant_runtime::graph).


def quantizer(method, bits, signed, scales, zps, axis=None, training="Lsq"):
    return {"inferable": {"method": method, "grid": {"bits": bits, "signed": signed, "narrow_range": False},
                          "rounding": "HalfEven",
                          "qparams": {"scales": scales, "zero_points": zps, "axis": axis}},
            "origin": {"training_method": training, "quantizer": None, "bits": bits, "method": method}}


IN_Q = quantizer("Uniform", 8, False, [0.02], [10])


def weights_q(o):
    return quantizer("Symmetric", 8, True, [0.01] * o, [0] * o, axis=0)


def quantize(name, inp, q=None):
    return {"name": name, "inputs": [inp], "op": {"type": "QuantizeDequantize", "quantizer": q or IN_Q}}


def param(tensor, encoding, q=None):
    p = {"tensor": tensor, "encoding": encoding}
    if q is not None:
        p["quantizer"] = q
    return p


def linear(name, inp, i, o, w_q=None, weight=None):
    return {"name": name, "inputs": [inp],
            "op": {"type": "Linear", "in_features": i, "out_features": o,
                   "weight": param(weight or name + ".weight", "codes", w_q or weights_q(o)),
                   "bias": param(name + ".bias", "accumulator")}}


def conv(name, inp, c, o, k, s=1, p=0, groups=1):
    return {"name": name, "inputs": [inp],
            "op": {"type": "Conv2d",
                   "geometry": {"in_channels": c, "out_channels": o, "kernel": k, "stride": s, "padding": p,
                                "groups": groups},
                   "weight": param(name + ".weight", "codes", weights_q(o)),
                   "bias": param(name + ".bias", "accumulator")}}


def simple(name, inp, op, **fields):
    return {"name": name, "inputs": [inp], "op": dict({"type": op}, **fields)}


def meta(nodes, input_shape=(4,), output=None, **over):
    m = {"format": "quant-integer-model", "format_version": 2, "quant_version": "0.1.0",
         "graph": {"input": {"name": "input", "shape": list(input_shape)}, "nodes": nodes,
                   "output": output if output is not None else (nodes[-1]["name"] if nodes else "input"),
                   "info": {"model": "hostile"}}}
    m.update(over)
    return m


def st_bytes(tensors, header_override=None):
    """tensors: list of (name, dtype, shape, bytes). A safetensors file, offsets in order."""
    header, data, off = {}, b"", 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        data += raw
        off += len(raw)
    text = header_override if header_override is not None else json.dumps(header)
    text = text.encode()
    return struct.pack("<Q", len(text)) + text + data


def i8(vals):
    return struct.pack("<%db" % len(vals), *vals)


def i32(vals):
    return struct.pack("<%di" % len(vals), *vals)


W0 = [3, -7, 12, 0, 5, 1, -1, 9, -20, 4, 6, -2]  # [3, 4]
B0 = [100, -50, 7]
W1 = [10, -3, 5, -8, 2, 6]  # [2, 3]
B1 = [-4, 9]
# The MLP control: input -> 0.input -> 0 (Linear 4->3) -> 1 (ReLU) -> 2.input -> 2 (Linear 3->2).
VALID_NODES = [quantize("0.input", "input"), linear("0", "0.input", 4, 3), simple("1", "0", "Relu"),
               quantize("2.input", "1"), linear("2", "2.input", 3, 2)]
VALID_TENSORS = [("0.weight", "I8", [3, 4], i8(W0)), ("0.bias", "I32", [3], i32(B0)),
                 ("2.weight", "I8", [2, 3], i8(W1)), ("2.bias", "I32", [2], i32(B1))]


def with_node(i, node):
    """VALID_NODES with node i replaced."""
    return VALID_NODES[:i] + [node] + VALID_NODES[i + 1:]


def export(name, contains, metadata=None, tensors=None, raw_meta=None, raw_tensors=None, skip=()):
    d = os.path.join("export", name)
    if os.path.isdir(os.path.join(ROOT, d)):
        shutil.rmtree(os.path.join(ROOT, d))
    if "model.json" not in skip:
        text = raw_meta if raw_meta is not None else json.dumps(metadata if metadata is not None else meta(VALID_NODES), indent=1)
        full = os.path.join(ROOT, d, "model.json")
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(text.encode() if isinstance(text, str) else text)
    if "model.safetensors" not in skip:
        data = raw_tensors if raw_tensors is not None else st_bytes(tensors if tensors is not None else VALID_TENSORS)
        full = os.path.join(ROOT, d, "model.safetensors")
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(data)
    CASES.append((d, "export", contains))


# Exports of an older format of this generator are replaced whole.
if os.path.isdir(os.path.join(ROOT, "export")):
    shutil.rmtree(os.path.join(ROOT, "export"))

VALID_ST = st_bytes(VALID_TENSORS)
# The control: a valid export, which must load and run (tests/integration/hostile.rs checks it does).
export("valid", [])

# Files and the tensor file's header.
export("missing_metadata", ["model.json"], skip=("model.json",))
export("missing_tensors", ["model.safetensors"], skip=("model.safetensors",))
export("empty_tensors", ["model.safetensors", "too short"], raw_tensors=b"")
export("truncated_tensors", ["model.safetensors"], raw_tensors=VALID_ST[:-5])
export("truncated_header", ["model.safetensors", "header claims"], raw_tensors=VALID_ST[:20])
export("header_length_huge", ["model.safetensors", "header claims"],
       raw_tensors=struct.pack("<Q", 2**64 - 1) + VALID_ST[8:])
export("header_not_json", ["model.safetensors", "invalid header"],
       raw_tensors=struct.pack("<Q", 4) + b"{{{{")
export("header_not_utf8", ["model.safetensors", "UTF-8"], raw_tensors=struct.pack("<Q", 4) + b"{\xff\xfe}")
# A header claiming a 2^40-byte tensor in a small file.
export("huge_tensor_claim", ["model.safetensors", "0.weight", "outside"],
       raw_tensors=st_bytes([], header_override=json.dumps(
           {"0.weight": {"dtype": "I8", "shape": [2**40], "data_offsets": [0, 2**40]}})))
# An end offset near 2^64: safetensors 0.3 adds `end + 8 + n` unchecked, which overflows (a
# panic in debug builds) after its per-tensor checks pass (the shape matches the byte count).
_end = 2**64 - 1
_hdr = '{"0.weight":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}}' % (_end, _end)
_n = len(_hdr)
export("offset_wraparound", ["model.safetensors", "0.weight", "outside"],
       raw_tensors=struct.pack("<Q", _n) + _hdr.encode())
export("shape_overflow", ["model.safetensors", "0.weight"],
       raw_tensors=st_bytes([], header_override=json.dumps(
           {"0.weight": {"dtype": "I8", "shape": [2**32, 2**32, 16], "data_offsets": [0, 0]}})))
export("negative_offset", ["model.safetensors", "invalid header"],
       raw_tensors=st_bytes([], header_override='{"0.weight":{"dtype":"I8","shape":[1],"data_offsets":[-1,0]}}'))
_h = json.dumps({n: {"dtype": d, "shape": s, "data_offsets": [0, 0]} for n, d, s, _ in VALID_TENSORS})
export("duplicated_tensor", ["model.safetensors", "0.weight", "twice"],
       raw_tensors=st_bytes([], header_override=_h[:-1] + ', "0.weight": {"dtype": "I8", "shape": [3, 4], "data_offsets": [0, 12]}}'))
export("overlapping_tensors", ["model.safetensors", "contiguous"],
       raw_tensors=st_bytes([], header_override=json.dumps(
           {"a": {"dtype": "I8", "shape": [4], "data_offsets": [0, 4]},
            "b": {"dtype": "I8", "shape": [4], "data_offsets": [2, 6]}})) + b"\x00" * 6)

# Tensors against the graph.
export("missing_bias", ["model.safetensors", "`2.bias`", "missing"], tensors=VALID_TENSORS[:3])
export("wrong_dtype", ["model.safetensors", "`0.weight`", "F32"],
       tensors=[("0.weight", "F32", [3, 4], struct.pack("<12f", *W0))] + VALID_TENSORS[1:])
export("wrong_shape", ["model.safetensors", "`0.weight`", "[4, 3]"],
       tensors=[("0.weight", "I8", [4, 3], i8(W0))] + VALID_TENSORS[1:])
export("bias_wrong_dtype", ["model.safetensors", "`0.bias`", "I32"],
       tensors=[VALID_TENSORS[0], ("0.bias", "I8", [3], i8(B0))] + VALID_TENSORS[2:])
export("codes_off_grid", ["model.json", "node `0`", "code 100", "[-8, 7]"],
       metadata=meta(with_node(1, linear("0", "0.input", 4, 3,
                                        w_q=quantizer("Symmetric", 4, True, [0.1] * 3, [0] * 3, axis=0)))),
       tensors=[("0.weight", "I8", [3, 4], i8([100] + W0[1:]))] + VALID_TENSORS[1:])
export("tensor_shared", ["model.safetensors", "`0.weight`", "used twice"],
       metadata=meta(with_node(4, linear("2", "2.input", 3, 2, weight="0.weight"))))
export("accumulator_overflow", ["layer `0`", "overflow"],
       tensors=[VALID_TENSORS[0], ("0.bias", "I32", [3], i32([2**31 - 1, 0, 0]))] + VALID_TENSORS[2:])

# The metadata file.
export("not_json", ["model.json", "invalid export metadata"], raw_meta=b"\x89PNG\r\n")
export("metadata_truncated", ["model.json", "EOF"], raw_meta=json.dumps(meta(VALID_NODES))[:100])
export("wrong_format", ["model.json", "onnx"], metadata=meta(VALID_NODES, format="onnx"))
export("future_version", ["model.json", "format_version 99"], metadata=meta(VALID_NODES, format_version=99))
export("old_version", ["model.json", "format_version 1", "export the model again"],
       metadata=meta(VALID_NODES, format_version=1))
export("unknown_field", ["model.json", "unknown field", "extra"], metadata=meta(VALID_NODES, extra=1))
export("unknown_op", ["model.json", "Hardswish"], metadata=meta(VALID_NODES + [simple("3", "2", "Hardswish")]))
export("empty_input_shape", ["model.json", "input shape"], metadata=meta(VALID_NODES, input_shape=()))
export("input_shape_overflow", ["model.json", "input shape"],
       metadata=meta(VALID_NODES, input_shape=(2**40, 2**40)))
export("input_shape_zero", ["model.json", "input shape"], metadata=meta(VALID_NODES, input_shape=(0,)))
export("negative_bits", ["model.json", "-1"],
       metadata=meta(with_node(0, quantize("0.input", "input", quantizer("Uniform", -1, False, [0.02], [10])))))
export("zero_scale", ["model.json", "scales[0]"],
       metadata=meta(with_node(0, quantize("0.input", "input", quantizer("Uniform", 8, False, [0.0], [10])))))
export("huge_scale", ["model.json", "number out of range"],
       raw_meta=json.dumps(meta(VALID_NODES)).replace("0.02", "1e999", 1))
export("nan_scale", ["model.json", "invalid export metadata"],
       raw_meta=json.dumps(meta(VALID_NODES)).replace("0.02", "NaN", 1))
export("per_channel_input", ["model.json", "node `0.input`", "per tensor"],
       metadata=meta(with_node(0, quantize("0.input", "input",
                                           quantizer("Uniform", 8, False, [0.02] * 4, [10] * 4, axis=1)))))
export("weights_wrong_axis", ["model.json", "node `0`", "axis 1"],
       metadata=meta(with_node(1, linear("0", "0.input", 4, 3,
                                        w_q=quantizer("Symmetric", 8, True, [0.01] * 4, [0] * 4, axis=1)))))
export("weights_wrong_channels", ["model.json", "node `0`", "5 channels"],
       metadata=meta(with_node(1, linear("0", "0.input", 4, 3,
                                        w_q=quantizer("Symmetric", 8, True, [0.01] * 5, [0] * 5, axis=0)))))
export("geometry_overflow", ["model.json", "node `0`", "expects 4611686018427387904 features"],
       metadata=meta(with_node(1, linear("0", "0.input", 2**62, 3))))
export("geometry_zero", ["model.json", "node `0`", "weight [0, 4]"],
       metadata=meta(with_node(1, linear("0", "0.input", 4, 0, w_q=quantizer("Symmetric", 8, True, [0.01], [0])))))
export("geometry_negative", ["model.json", "invalid value"],
       raw_meta=json.dumps(meta(VALID_NODES)).replace('"in_features": 4', '"in_features": -4', 1))
export("layer_size_mismatch", ["model.json", "node `2`", "receives [3]; expects 5 features"],
       metadata=meta(with_node(4, linear("2", "2.input", 5, 2))),
       tensors=VALID_TENSORS[:2] + [("2.weight", "I8", [2, 5], i8(W1 + [0, 0, 0, 0])), VALID_TENSORS[3]])
export("input_size_mismatch", ["model.json", "node `0`", "receives [9]"],
       metadata=meta(VALID_NODES, input_shape=(9,)))

# The graph's structure.
export("dangling_input", ["model.json", "node `2`", "`nowhere`", "dangling"],
       metadata=meta(with_node(4, dict(linear("2", "2.input", 3, 2), inputs=["nowhere"]))))
export("cycle", ["model.json", "node `0.input`", "`2`", "cyclic"],
       metadata=meta(with_node(0, quantize("0.input", "2"))))
export("duplicate_node", ["model.json", "node `1`", "used twice"],
       metadata=meta(VALID_NODES[:3] + [simple("1", "1", "Relu")] + VALID_NODES[3:]))
export("output_missing", ["model.json", "output `logits`", "names no value"],
       metadata=meta(VALID_NODES, output="logits"))
export("too_many_inputs", ["model.json", "node `1`", "takes one input"],
       metadata=meta(with_node(2, dict(simple("1", "0", "Relu"), inputs=["0", "0.input"]))))
export("bias_without_quantized_input", ["model.json", "node `2`", "input is not quantized"],
       metadata=meta(VALID_NODES[:3] + [linear("2", "1", 3, 2)]))

# What the integer runtime refuses.
export("bits_16", ["layer `0.input`", "16 bits"],
       metadata=meta(with_node(0, quantize("0.input", "input", quantizer("Uniform", 16, False, [0.02], [10])))))
export("float_op_first", ["layer `r`", "reads float values"],
       metadata=meta([simple("r", "input", "Relu")] + VALID_NODES), tensors=VALID_TENSORS)
export("no_quantizer", ["layer `r`", "reads float values"], metadata=meta([simple("r", "input", "Relu")]),
       tensors=[])
export("extreme_scales", ["layer `2.input`", "2^31"],
       metadata=meta(VALID_NODES[:1]
                     + [linear("0", "0.input", 4, 3,
                               w_q=quantizer("Symmetric", 8, True, [3e38] * 3, [0] * 3, axis=0))]
                     + VALID_NODES[2:3]
                     + [quantize("2.input", "1", quantizer("Uniform", 8, False, [1e-30], [10]))]
                     + VALID_NODES[4:]))
export("logit_scale_overflow", ["layer `2`", "overflow f32"],
       metadata=meta(VALID_NODES[:3]
                     + [quantize("2.input", "1", quantizer("Uniform", 8, False, [3e38], [10])),
                        linear("2", "2.input", 3, 2,
                               w_q=quantizer("Symmetric", 8, True, [3e38] * 2, [0] * 2, axis=0))]))
export("logit_overflow", ["layer `2`", "overflow f32"],
       metadata=meta(VALID_NODES[:3]
                     + [quantize("2.input", "1", quantizer("Uniform", 8, False, [1.0], [10])),
                        linear("2", "2.input", 3, 2,
                               w_q=quantizer("Symmetric", 8, True, [1e36] * 2, [0] * 2, axis=0))]))
# Feature maps.
CONV_T = [("0.weight", "I8", [2, 1, 3, 3], i8(list(range(-9, 9)))), ("0.bias", "I32", [2], i32([1, -1]))]
HEAD_T = [("4.weight", "I8", [2, 8], i8(list(range(-8, 8)))), ("4.bias", "I32", [2], i32([0, 0]))]
# The CNN control: conv 1->2 3x3 (padding 1) on 4x4, ReLU, 2x2 max pool, flatten, linear head.
CNN_NODES = [quantize("0.input", "input"), conv("0", "0.input", 1, 2, 3, 1, 1), simple("1", "0", "Relu"),
             simple("2", "1", "MaxPool2d", kernel=2, stride=2, padding=0), simple("3", "2", "Flatten"),
             quantize("4.input", "3"), linear("4", "4.input", 8, 2)]
def with_cnn_node(i, node):
    return CNN_NODES[:i] + [node] + CNN_NODES[i + 1:]


export("valid_cnn", [], metadata=meta(CNN_NODES, input_shape=(1, 4, 4)), tensors=CONV_T + HEAD_T)
export("pool_zero_stride", ["model.json", "node `2`", "stride 0"],
       metadata=meta(with_cnn_node(3, simple("2", "1", "MaxPool2d", kernel=2, stride=0, padding=0)),
                     input_shape=(1, 4, 4)),
       tensors=CONV_T + HEAD_T)
export("conv_zero_stride", ["model.json", "node `0`", "stride 0"],
       metadata=meta([CNN_NODES[0], conv("0", "0.input", 1, 2, 3, 0, 1)], input_shape=(1, 4, 4)),
       tensors=CONV_T)
export("conv_kernel_larger_than_image", ["model.json", "node `0`", "smaller than its 3x3 kernel"],
       metadata=meta([CNN_NODES[0], conv("0", "0.input", 1, 2, 3)], input_shape=(1, 2, 2)), tensors=CONV_T)
export("conv_groups_not_dividing", ["model.json", "node `0`", "groups must divide"],
       metadata=meta([CNN_NODES[0], conv("0", "0.input", 1, 2, 3, 1, 1, groups=2)], input_shape=(1, 4, 4)),
       tensors=CONV_T)
export("pool_huge_kernel", ["layer `2`", "multiply-adds"],
       metadata=meta(CNN_NODES[:2] + [simple("1", "0", "Relu"),
                                      simple("2", "1", "MaxPool2d", kernel=2**27, stride=1, padding=2**26)],
                     input_shape=(1, 4, 4)),
       tensors=CONV_T)
export("activation_explosion", ["layer `0`", "values"],
       metadata=meta(CNN_NODES[:2], input_shape=(1, 8192, 8192)), tensors=CONV_T)
export("conv_on_flat_input", ["model.json", "node `0`", "receives [16]"],
       metadata=meta(CNN_NODES[:2], input_shape=(16,)), tensors=CONV_T)
# Residual graphs: an add of two branches on one grid, and what a hostile file can do to it.
RES_NODES = [quantize("0.input", "input"), linear("0", "0.input", 4, 3), simple("1", "0", "Relu"),
             quantize("2.input.0", "1"), quantize("2.input.1", "0"),
             simple("2", "2.input.0", "Add"), quantize("3.input", "2"), linear("3", "3.input", 3, 2)]
RES_NODES[5]["inputs"] = ["2.input.0", "2.input.1"]
RES_T = [VALID_TENSORS[0], VALID_TENSORS[1], ("3.weight", "I8", [2, 3], i8(W1)), ("3.bias", "I32", [2], i32(B1))]
export("valid_residual", [], metadata=meta(RES_NODES), tensors=RES_T)
export("add_shape_mismatch", ["model.json", "node `2`", "shapes [3] and [4]"],
       metadata=meta(RES_NODES[:5] + [dict(simple("2", "2.input.0", "Add"), inputs=["2.input.0", "0.input"])]
                     + RES_NODES[6:]),
       tensors=RES_T)
export("add_one_input", ["model.json", "node `2`", "takes two inputs"],
       metadata=meta(RES_NODES[:5] + [simple("2", "2.input.0", "Add")] + RES_NODES[6:]), tensors=RES_T)
export("add_on_two_grids", ["layer `2`", "one grid"],
       metadata=meta(RES_NODES[:4]
                     + [quantize("2.input.1", "0", quantizer("Uniform", 8, False, [0.05], [3]))]
                     + RES_NODES[5:]),
       tensors=RES_T)
export("add_cycle", ["model.json", "node `2.input.0`", "`2`", "cyclic"],
       metadata=meta(RES_NODES[:3] + [quantize("2.input.0", "2")] + RES_NODES[4:]), tensors=RES_T)
export("global_pool_on_features", ["model.json", "node `g`", "receives [3]"],
       metadata=meta(VALID_NODES[:3] + [simple("g", "1", "GlobalAvgPool")]), tensors=VALID_TENSORS[:2])
export("depthwise_valid", [],
       metadata=meta([CNN_NODES[0], conv("0", "0.input", 1, 2, 3, 1, 1), simple("1", "0", "Relu"),
                      quantize("2.input", "1"), conv("2", "2.input", 2, 2, 3, 1, 1, groups=2),
                      simple("3", "2", "GlobalAvgPool"), quantize("4.input", "3"), linear("4", "4.input", 2, 2)],
                     input_shape=(1, 4, 4)),
       tensors=CONV_T + [("2.weight", "I8", [2, 1, 3, 3], i8(list(range(-9, 9)))), ("2.bias", "I32", [2], i32([5, -5])),
                         ("4.weight", "I8", [2, 2], i8([3, -4, 5, 6])), ("4.bias", "I32", [2], i32([0, 1]))])
# An 80x80 kernel with padding 79 on an 8x8 image: 87x87 positions of 6400 values each. A valid
# model (the runtime bounds its memory by running a batch in chunks); a small file.
export("conv_kernel_80_padding_79", [],
       metadata=meta([CNN_NODES[0], conv("0", "0.input", 1, 1, 80, 1, 79)], input_shape=(1, 8, 8)),
       tensors=[("0.weight", "I8", [1, 1, 80, 80], i8([(i * 7) % 5 - 2 for i in range(6400)])),
                ("0.bias", "I32", [1], i32([3]))])

# Issue 24: windows per axis and values whose axes say what they are. A rectangular pool is a
# valid control; a size that is neither one number nor [height, width] is refused by name; a
# convolution over attention scores [heads, queries, keys] (rank 3, but not maps) is refused.
# Files written before the QDQ op was renamed call it `Quantize`: they still load.
export("valid_cnn_old_op_name", [],
       raw_meta=json.dumps(meta(CNN_NODES, input_shape=(1, 4, 4)), indent=1).replace(
           '"QuantizeDequantize"', '"Quantize"'),
       tensors=CONV_T + HEAD_T)
export("pool_rectangular_valid", [],
       metadata=meta(with_cnn_node(3, simple("2", "1", "MaxPool2d", kernel=[1, 4], stride=[1, 4], padding=0)),
                     input_shape=(1, 4, 4)),
       tensors=CONV_T + HEAD_T)
export("pool_window_not_a_pair", ["model.json", "[height, width]"],
       metadata=meta(with_cnn_node(3, simple("2", "1", "MaxPool2d", kernel=[2], stride=2, padding=0)),
                     input_shape=(1, 4, 4)),
       tensors=CONV_T + HEAD_T)
export("conv_on_attention_scores", ["model.json", "node `c`", "[heads, queries, keys]"],
       metadata=meta([quantize("q", "input"),
                      {"name": "s", "inputs": ["q", "q"], "op": {"type": "AttentionScores", "heads": 2}},
                      quantize("c.input", "s"), conv("c", "c.input", 2, 2, 1)],
                     input_shape=(4, 6)),
       tensors=[("c.weight", "I8", [2, 2, 1, 1], i8([1, 2, 3, 4])), ("c.bias", "I32", [2], i32([0, 0]))])

# Issue 25: values nothing reads are freed as soon as they are written, and one sample's
# working memory (the values alive at once) is bounded. A 1x1 conv to 32 channels padded to a
# 48x48 map (295 KB of accumulators), read by 30 ReLUs nothing reads: valid, and a sample
# needs about two such values at once, not 31 (tests/integration/hostile.rs checks).
# Padding at most kernel - 1: a 41x41 kernel with padding 40 grows a map by 40.
DEAD_RELUS = [CNN_NODES[0], conv("0", "0.input", 1, 32, 41, 1, 40)] + [simple("r%d" % i, "0", "Relu") for i in range(30)]
export("dead_relus_are_freed", [],
       metadata=meta(DEAD_RELUS + [simple("g", "0", "GlobalAvgPool")], input_shape=(1, 8, 8)),
       tensors=[("0.weight", "I8", [32, 1, 41, 41], i8([(i % 5) - 2 for i in range(32 * 1681)])),
                ("0.bias", "I32", [32], i32([1] * 32))])
# The same shape of graph as issue 25 found it: small convolutions padding the map up to
# 208x208, then a 1x1 conv to 1400 channels (242 MB of accumulators in one value) read by 30
# ReLUs: refused before anything runs.
GROW, GROW_T, last = [CNN_NODES[0]], [], "0.input"
for j in range(10):
    GROW += [conv("g%d" % j, last, 1, 1, 21, 1, 20), quantize("g%d.q" % j, "g%d" % j)]
    GROW_T += [("g%d.weight" % j, "I8", [1, 1, 21, 21], i8([(i % 3) - 1 for i in range(441)])),
               ("g%d.bias" % j, "I32", [1], i32([0]))]
    last = "g%d.q" % j
WIDE_RELUS = GROW + [conv("w", last, 1, 1400, 1)] + [simple("r%d" % i, "w", "Relu") for i in range(30)]
export("wide_value_read_by_dead_relus", ["one sample needs", "bytes of working memory"],
       metadata=meta(WIDE_RELUS + [simple("p", "w", "GlobalAvgPool")], input_shape=(1, 8, 8)),
       tensors=GROW_T + [("w.weight", "I8", [1400, 1, 1, 1], i8([(i % 5) - 2 for i in range(1400)])),
                         ("w.bias", "I32", [1400], i32([1] * 1400))])

# Transformers: self-attention of 2 heads over a sequence of 3 tokens of 4 features, integer
# softmax, LayerNorm, GELU, the mean of the tokens and a head; and ViT patch tokens.
def two(name, inputs, op, **fields):
    return {"name": name, "inputs": list(inputs), "op": dict({"type": op}, **fields)}


def layer_norm(name, inp, gamma=None):
    return {"name": name, "inputs": [inp],
            "op": {"type": "LayerNorm", "scale": param(gamma or name + ".gamma", "float"),
                   "shift": param(name + ".beta", "float"), "epsilon": 1e-5}}


PROBS_Q = quantizer("Uniform", 8, False, [1 / 255], [0])
TR_NODES = [quantize("0.input", "input"), linear("q", "0.input", 4, 4), linear("k", "0.input", 4, 4),
            linear("v", "0.input", 4, 4), quantize("s.query", "q"), quantize("s.key", "k"),
            quantize("c.value", "v"), two("s", ["s.query", "s.key"], "AttentionScores", heads=2),
            simple("p", "s", "Softmax"), quantize("c.probs", "p", PROBS_Q),
            two("c", ["c.probs", "c.value"], "AttentionContext", heads=2),
            quantize("n.input", "c"), layer_norm("n", "n.input"), quantize("g.input", "n"),
            simple("g", "g.input", "Gelu"), simple("m", "g", "MeanTokens"), quantize("h.input", "m"),
            linear("h", "h.input", 4, 2)]
WQ = [3, -7, 12, 0, 5, 1, -1, 9, -20, 4, 6, -2, 8, 0, -5, 2]
F32 = lambda vals: struct.pack("<%df" % len(vals), *vals)
TR_T = ([(f"{n}.weight", "I8", [4, 4], i8(WQ[k:] + WQ[:k])) for k, n in enumerate("qkv")]
        + [(f"{n}.bias", "I32", [4], i32([10, -20, 5, 0])) for n in "qkv"]
        + [("n.gamma", "F32", [4], F32([1.0, 0.5, -1.0, 2.0])), ("n.beta", "F32", [4], F32([0.0, 0.1, -0.1, 0.2])),
           ("h.weight", "I8", [2, 4], i8([3, -4, 5, 6, -7, 8, 1, 0])), ("h.bias", "I32", [2], i32([0, 1]))])
TR_SHAPE = (3, 4)


def with_tr_node(name, node):
    return [node if n["name"] == name else n for n in TR_NODES]


export("valid_attention", [], metadata=meta(TR_NODES, input_shape=TR_SHAPE), tensors=TR_T)
export("attention_heads_not_dividing", ["model.json", "node `s`", "3 heads", "4 features of the queries"],
       metadata=meta(with_tr_node("s", two("s", ["s.query", "s.key"], "AttentionScores", heads=3)),
                     input_shape=TR_SHAPE), tensors=TR_T)
export("attention_zero_heads", ["model.json", "node `c`", "0 heads"],
       metadata=meta(with_tr_node("c", two("c", ["c.probs", "c.value"], "AttentionContext", heads=0)),
                     input_shape=TR_SHAPE), tensors=TR_T)
# Heads that differ between the two products: the probabilities do not fit the values.
export("attention_heads_mismatch", ["model.json", "node `c`", "do not fit 4 heads"],
       metadata=meta(with_tr_node("c", two("c", ["c.probs", "c.value"], "AttentionContext", heads=4)),
                     input_shape=TR_SHAPE), tensors=TR_T)
# Keys of another embedding size than the queries.
export("attention_keys_wrong_size", ["model.json", "node `s`", "queries have 4 features and keys 2"],
       metadata=meta(TR_NODES[:7] + [linear("k2", "0.input", 4, 2), quantize("k2.q", "k2"),
                                       two("s", ["s.query", "k2.q"], "AttentionScores", heads=2)],
                     input_shape=TR_SHAPE),
       tensors=TR_T + [("k2.weight", "I8", [2, 4], i8(WQ[:8])), ("k2.bias", "I32", [2], i32([0, 0]))])
export("attention_on_features", ["model.json", "node `s`", "two [tokens, features] inputs"],
       metadata=meta(VALID_NODES + [two("s", ["2", "2"], "AttentionScores", heads=1)]), tensors=VALID_TENSORS)
export("layer_norm_wrong_size", ["model.json", "node `n`", "`n.gamma`", "3 values", "needs 4"],
       metadata=meta(TR_NODES, input_shape=TR_SHAPE),
       tensors=[t for t in TR_T if t[0] != "n.gamma"] + [("n.gamma", "F32", [3], F32([1.0, 0.5, -1.0]))])
# The softmax reads codes, not the accumulators of scores: the runtime refuses it.
export("softmax_on_codes", ["layer `p`", "accumulators"],
       metadata=meta(TR_NODES[:8] + [quantize("s.codes", "s"), simple("p", "s.codes", "Softmax")] + TR_NODES[9:],
                     input_shape=TR_SHAPE), tensors=TR_T)
export("layer_norm_on_accumulators", ["layer `n`", "LayerNorm needs its input quantized"],
       metadata=meta(with_tr_node("n", layer_norm("n", "c")), input_shape=TR_SHAPE), tensors=TR_T)
export("gelu_on_accumulators", ["layer `g`", "Gelu needs its input quantized"],
       metadata=meta(with_tr_node("g", simple("g", "n", "Gelu")), input_shape=TR_SHAPE), tensors=TR_T)
export("mean_tokens_on_features", ["model.json", "node `m`", "[tokens, features]", "receives [3]"],
       metadata=meta(VALID_NODES[:3] + [simple("m", "1", "MeanTokens")]), tensors=VALID_TENSORS[:2])
# ViT patch tokens: a 2x2-patch convolution of a 4x4 image gives 4 tokens of 2 channels plus positions.
VIT_NODES = [CNN_NODES[0], conv("0", "0.input", 1, 2, 2, 2, 0),
             {"name": "t", "inputs": ["0"], "op": {"type": "ImageTokens", "position": param("t.position", "float")}},
             quantize("n.input", "t"), layer_norm("n", "n.input"), simple("m", "n", "MeanTokens"),
             quantize("h.input", "m"), linear("h", "h.input", 2, 2)]
VIT_T = [("0.weight", "I8", [2, 1, 2, 2], i8([3, -1, 4, 1, -5, 9, 2, -6])), ("0.bias", "I32", [2], i32([1, -1])),
         ("t.position", "F32", [4, 2], F32([0.01, -0.02, 0.03, 0.0, -0.01, 0.02, 0.0, 0.01])),
         ("n.gamma", "F32", [2], F32([1.0, -0.5])), ("n.beta", "F32", [2], F32([0.1, 0.0])),
         ("h.weight", "I8", [2, 2], i8([3, -4, 5, 6])), ("h.bias", "I32", [2], i32([0, 1]))]
export("valid_image_tokens", [], metadata=meta(VIT_NODES, input_shape=(1, 4, 4)), tensors=VIT_T)
# A position embedding for another sequence length (a 3x3 map's 9 tokens) than the image gives.
export("image_tokens_wrong_length", ["model.safetensors", "node `t`", "`t.position`", "[9, 2]", "needs F32 [4, 2]"],
       metadata=meta(VIT_NODES, input_shape=(1, 4, 4)),
       tensors=[t for t in VIT_T if t[0] != "t.position"] + [("t.position", "F32", [9, 2], F32([0.0] * 18))])
export("image_tokens_on_features", ["model.json", "node `t`", "[channels, height, width]"],
       metadata=meta(VALID_NODES[:2] + [{"name": "t", "inputs": ["0"],
                                         "op": {"type": "ImageTokens", "position": param("t.position", "float")}}]),
       tensors=VALID_TENSORS[:2] + [("t.position", "F32", [3], F32([0.0] * 3))])

# ----- float checkpoints (quant_dfdx::checkpoint::load_checkpoint into Linear<4, 3>) -----------

W = struct.pack("<12f", *[0.1 * i for i in range(12)])
B = struct.pack("<3f", 0.5, -0.5, 0.25)
case("checkpoint/valid.safetensors", "checkpoint", [],
     st_bytes([("bias", "F32", [3], B), ("weight", "F32", [3, 4], W)]))
case("checkpoint/wrong_dtype.safetensors", "checkpoint", ["wrong_dtype.safetensors", "`weight`", "F32 [3, 4]"],
     st_bytes([("bias", "F32", [3], B), ("weight", "U8", [3, 4], bytes(12))]))
case("checkpoint/wrong_shape.safetensors", "checkpoint", ["`weight`", "[4, 3]"],
     st_bytes([("bias", "F32", [3], B), ("weight", "F32", [4, 3], W)]))
case("checkpoint/missing.safetensors", "checkpoint", ["`weight` is missing"], st_bytes([("bias", "F32", [3], B)]))
case("checkpoint/offset_wraparound.safetensors", "checkpoint", ["offset_wraparound.safetensors", "outside"],
     struct.pack("<Q", _n) + _hdr.encode())
case("checkpoint/truncated.safetensors", "checkpoint", ["truncated.safetensors"],
     st_bytes([("bias", "F32", [3], B), ("weight", "F32", [3, 4], W)])[:-7])
case("checkpoint/empty.safetensors", "checkpoint", ["empty.safetensors", "too short"], b"")
# Issue 10: a header claiming 79 MB (past the 16 MiB limit) is refused before it is parsed; the
# real 79 MB header of 1.2 million empty tensors is generated at test time (tests/integration/safety.rs).
case("checkpoint/header_79mb_claim.safetensors", "checkpoint", ["header claims 79000000 bytes", "16777216"],
     struct.pack("<Q", 79_000_000) + b"{" + b" " * 100)

# ----- digits data files (quant::digits::load) ------------------------------------------------

ROW = ",".join(["1"] * 64) + ",3\n"
case("data/short_row.csv", "data", ["short_row.csv", "line 2", "fields"], ROW + "1,2,3\n")
case("data/pixel_overflow.csv", "data", ["pixel_overflow.csv", "line 1", "pixel 0"], ROW.replace("1", "300", 1))
case("data/negative_label.csv", "data", ["line 1", "label is `-1`"], ROW.replace(",3\n", ",-1\n"))
case("data/not_utf8.csv", "data", ["not_utf8.csv"], b"\xff\xfe\x00" + ROW.encode())
case("data/too_few_rows.csv", "data", ["too_few_rows.csv", "3 rows"], ROW * 3)
case("data/not_gzip.csv.gz", "data", ["not_gzip.csv.gz"], ROW * 20)
case("data/huge_number.csv", "data", ["line 1", "pixel 5"], ROW.replace("1,", "1,", 5).replace(
    ",".join(["1"] * 6), ",".join(["1"] * 5) + ",99999999999999999999999", 1))
# Issue 10: a UTF-8 byte-order mark is accepted (controls); a UTF-16 one is named; lines and
# quoted values are bounded; CRLF line ends and multi-member gzip files load.
case("data/bom.csv", "data", [], b"\xef\xbb\xbf" + (ROW * 10).encode())
case("data/crlf.csv", "data", [], (ROW * 10).replace("\n", "\r\n"))
case("data/utf16_bom.csv", "data", ["utf16_bom.csv", "line 1", "UTF-16"], b"\xff\xfe" + (ROW * 10).encode("utf-16-le"))
case("data/long_line.csv", "data", ["long_line.csv", "line 2", "longer than 4096 bytes"], ROW + "1" * 5000 + "\n")
case("data/long_value.csv", "data", ["line 1", "pixel 3", "\u2026 (3000 bytes)"],
     ROW.replace("1,1,1,1,", "1,1,1," + "x" * 3000 + ",", 1))
case("data/gzip_members.csv.gz", "data", [],
     gzip.compress((ROW * 6).encode(), mtime=0) + gzip.compress((ROW * 6).encode(), mtime=0))


# ----- [data] sections of every format (quant::data::load) -----------------------------------
# Each case is a .toml file holding a [data] section's keys, its paths relative to the case's
# directory, beside the data files it names. Loader `data_section` loads it; `data_for_mnist`
# also checks it against a model of 28x28 inputs and 10 classes (labels, sample size).

def idx_bytes(dims, data, kind=0x08, magic_zero=b"\x00\x00"):
    return magic_zero + bytes([kind, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + bytes(data)

def npy_bytes(descr, shape, data, fortran="False", header_extra=""):
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), %s}" % (descr, fortran, dims, header_extra)
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + bytes(data)

def data_case(name, loader, contains, section, files):
    # The data files themselves are listed too (loader `data_file`: read by the cases that
    # name them), so that every file of the corpus is accounted for.
    for fname, data in files.items():
        case("data_formats/" + fname, "data_file", [], data)
    case("data_formats/%s.toml" % name, loader, contains, section)

IMAGES = idx_bytes([20, 28, 28], [(i * 7) % 256 for i in range(20 * 784)])
LABELS = idx_bytes([20], [i % 10 for i in range(20)])
IDX_OK = 'format = "idx"\nimages = "%s"\nlabels = "%s"\ntest = { from_row = 16 }\n'
data_case("idx_valid", "data_for_mnist", [], IDX_OK % ("images.idx", "labels.idx"),
          {"images.idx": IMAGES, "labels.idx": LABELS, "images.idx.gz": gzip.compress(IMAGES, mtime=0),
           "labels.idx.gz": gzip.compress(LABELS, mtime=0)})
data_case("idx_gzipped_valid", "data_for_mnist", [], IDX_OK % ("images.idx.gz", "labels.idx.gz"), {})
data_case("idx_wrong_magic", "data_section", ["bad_magic.idx", "not an IDX file"],
          IDX_OK % ("bad_magic.idx", "labels.idx"), {"bad_magic.idx": b"\x08\x03\x00\x00" + IMAGES[4:]})
data_case("idx_labels_with_three_dims", "data_section", ["images.idx", "a labels file has one dimension"],
          IDX_OK % ("images.idx", "images.idx"), {})
data_case("idx_counts_disagree", "data_section", ["images.idx", "labels19.idx", "20 images but 19 labels"],
          IDX_OK % ("images.idx", "labels19.idx"), {"labels19.idx": idx_bytes([19], [1] * 19)})
data_case("idx_truncated", "data_section", ["truncated.idx", "truncated"],
          IDX_OK % ("truncated.idx", "labels.idx"), {"truncated.idx": IMAGES[:-100]})
data_case("idx_billion_images", "data_section", ["billion.idx", "1000000000 samples"],
          IDX_OK % ("billion.idx", "labels.idx"), {"billion.idx": idx_bytes([10**9, 28, 28], [])})
data_case("idx_float_elements", "data_section", ["floats.idx", "element type 0x0d"],
          IDX_OK % ("floats.idx", "labels.idx"), {"floats.idx": idx_bytes([20, 28, 28], [0] * (20 * 784 * 4), kind=0x0D)})
data_case("idx_label_beyond_classes", "data_for_mnist", ["label 12", "10 classes"],
          IDX_OK % ("images.idx", "labels12.idx"), {"labels12.idx": idx_bytes([20], [12] + [1] * 19)})
data_case("idx_not_28x28", "data_for_mnist", ["[8, 8]", "the model takes [1, 28, 28]"],
          IDX_OK % ("small.idx", "labels.idx"), {"small.idx": idx_bytes([20, 8, 8], [1] * (20 * 64))})
data_case("idx_empty_test_split", "data_section", ["images.idx", "none for the test split"],
          IDX_OK.replace("from_row = 16", "from_row = 20") % ("images.idx", "labels.idx"), {})
data_case("idx_missing_file", "data_section", ["no_such_images.idx"],
          IDX_OK % ("no_such_images.idx", "labels.idx"), {})

CSV_OK = 'format = "csv"\npath = "%s"\ntest = { fraction = 0.25 }\n'
csv_rows = "".join(",".join(str((i * 3 + j) % 5) for j in range(6)) + ",%d\n" % (i % 3) for i in range(12))
data_case("csv_valid", "data_section", [], CSV_OK % "six.csv", {"six.csv": csv_rows.encode()})
data_case("csv_wrong_width", "data_section", ["ragged.csv", "line 4", "4 fields; the first row has 7"],
          CSV_OK % "ragged.csv", {"ragged.csv": (csv_rows[:42] + "1,2,3,0\n" + csv_rows[42:]).encode()})
data_case("csv_nan_feature", "data_section", ["nan.csv", "line 2", "feature 1 is `NaN`"],
          CSV_OK % "nan.csv", {"nan.csv": ("1,2,3,4,5,6,0\n1,NaN,3,4,5,6,1\n" + csv_rows).encode()})
data_case("csv_inf_feature", "data_section", ["inf.csv", "line 1", "feature 0 is `inf`"],
          CSV_OK % "inf.csv", {"inf.csv": ("inf,2,3,4,5,6,0\n" + csv_rows).encode()})
data_case("csv_label_not_a_class", "data_section", ["label.csv", "line 1", "label is `2.5`"],
          CSV_OK % "label.csv", {"label.csv": ("1,2,3,4,5,6,2.5\n" + csv_rows).encode()})
data_case("csv_header_not_declared", "data_section", ["header.csv", "line 1", "feature 0 is `a`"],
          CSV_OK % "header.csv", {"header.csv": ("a,b,c,d,e,f,label\n" + csv_rows).encode()})

NPY_OK = 'format = "npy"\nimages = "%s"\nlabels = "%s"\ntest = { every = 4 }\n'
NX = npy_bytes("|u1", [8, 28, 28], [i % 256 for i in range(8 * 784)])
NY = npy_bytes("<i8", [8], b"".join(struct.pack("<q", i % 10) for i in range(8)))
data_case("npy_valid", "data_for_mnist", [], NPY_OK % ("x.npy", "y.npy"), {"x.npy": NX, "y.npy": NY})
data_case("npy_complex_dtype", "data_section", ["complex.npy", "dtype `<c8`"],
          NPY_OK % ("complex.npy", "y.npy"), {"complex.npy": npy_bytes("<c8", [8, 4], [0] * 256)})
data_case("npy_float64_features", "data_section", ["f64.npy", "expected uint8 or float32"],
          NPY_OK % ("f64.npy", "y.npy"), {"f64.npy": npy_bytes("<f8", [8, 4], [0] * 256)})
data_case("npy_big_endian", "data_section", ["big.npy", "dtype `>f4`"],
          NPY_OK % ("big.npy", "y.npy"), {"big.npy": npy_bytes(">f4", [8, 4], [0] * 128)})
data_case("npy_lying_header", "data_section", ["lying.npy", "shape [9, 28, 28]"],
          NPY_OK % ("lying.npy", "y.npy"), {"lying.npy": npy_bytes("|u1", [9, 28, 28], [0] * (8 * 784))})
data_case("npy_huge_shape", "data_section", ["huge.npy", "samples of"],
          NPY_OK % ("huge.npy", "y.npy"), {"huge.npy": npy_bytes("|u1", [10**9, 10**6], [])})
data_case("npy_overflowing_shape", "data_section", ["overflow.npy", "overflows"],
          NPY_OK % ("overflow.npy", "y.npy"), {"overflow.npy": npy_bytes("|u1", [2, 2**40, 2**40], [])})
data_case("npy_fortran_order", "data_section", ["fortran.npy", "Fortran"],
          NPY_OK % ("fortran.npy", "y.npy"), {"fortran.npy": npy_bytes("|u1", [8, 28, 28], [0] * (8 * 784), fortran="True")})
data_case("npy_float_labels", "data_section", ["yf.npy", "one integer per sample"],
          NPY_OK % ("x.npy", "yf.npy"), {"yf.npy": npy_bytes("<f4", [8], [0] * 32)})
data_case("npy_negative_label", "data_section", ["yneg.npy", "label 0 is -3"],
          NPY_OK % ("x.npy", "yneg.npy"), {"yneg.npy": npy_bytes("<i8", [8], b"".join(struct.pack("<q", -3 if i == 0 else 1) for i in range(8)))})
data_case("npy_not_numpy", "data_section", ["text.npy", "not a .npy file"],
          NPY_OK % ("text.npy", "y.npy"), {"text.npy": b"x,y\n1,2\n"})
data_case("npy_header_longer_than_file", "data_section", ["short.npy", "claims"],
          NPY_OK % ("short.npy", "y.npy"), {"short.npy": b"\x93NUMPY\x01\x00\xff\x7f{'descr'"})

import io, zipfile
def npz(entries, method=zipfile.ZIP_DEFLATED):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as z:
        for name, data in entries:
            # A fixed date: the corpus is the same bytes every time it is generated.
            z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data, compress_type=method)
    return buf.getvalue()
NPZ_OK = 'format = "npz"\npath = "%s"\n'
data_case("npz_valid", "data_for_mnist", [], NPZ_OK % "keras.npz",
          {"keras.npz": npz([("x_train.npy", NX), ("y_train.npy", NY), ("x_test.npy", NX), ("y_test.npy", NY)])})
data_case("npz_missing_arrays", "data_section", ["other.npz", "no `x_train.npy`"], NPZ_OK % "other.npz",
          {"other.npz": npz([("a.npy", NX), ("b.npy", NY)])})
data_case("npz_not_zip", "data_section", ["notzip.npz", "not a .npz (zip) archive"], NPZ_OK % "notzip.npz",
          {"notzip.npz": NX})
data_case("npz_bad_entry", "data_section", ["badentry.npz", "x_train.npy", "dtype `<c8`"], NPZ_OK % "badentry.npz",
          {"badentry.npz": npz([("x_train.npy", npy_bytes("<c8", [8, 4], [0] * 256)), ("y_train.npy", NY)])})
data_case("npz_only_test_images", "data_section", ["half.npz", "only one of"], NPZ_OK % "half.npz",
          {"half.npz": npz([("x_train.npy", NX), ("y_train.npy", NY), ("x_test.npy", NX)])})
# The digits bundled data cannot feed a 28x28 model.
case("data_formats/digits_for_mnist_model.toml", "data_for_mnist", ["[1, 8, 8] (64 values each)", "the model takes [1, 28, 28]"], "")

# ----- manifest --------------------------------------------------------------------------------

with open(os.path.join(ROOT, "expected.toml"), "w") as f:
    f.write("# Generated by tools/gen_hostile_corpus.py: which loader reads each hostile input, and what\n"
            "# its error message must contain. An empty list marks a valid control that must load.\n\n")
    for path, loader, contains in CASES:
        f.write('["%s"]\nloader = "%s"\ncontains = [%s]\n\n' % (
            path, loader, ", ".join(json.dumps(c) for c in contains)))
print("%d cases under %s" % (len(CASES), os.path.normpath(ROOT)))
