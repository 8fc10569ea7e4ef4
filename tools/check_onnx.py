#!/usr/bin/env python3
"""Runs an exported model.onnx with onnxruntime on the digits test split and prints its accuracy
and its agreement with quant's integer model of the same export (`quant eval DIR`).

    cargo build --release
    python3 -m venv /tmp/ort && /tmp/ort/bin/pip install onnxruntime numpy
    /tmp/ort/bin/python tools/check_onnx.py runs/mlp_w2a2/export

Exits non-zero when the agreement is below --min-agreement (default 0.997). Not part of CI.
"""

import argparse
import os
import re
import sys

import numpy as np

from onnx_common import ROOT, digits_test_split, onnx_path_and_dir, quant, session


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("export", help="an export directory (model.onnx beside model.json) or a model.onnx")
    p.add_argument("--data", help="a digits data file (default: data/digits.csv.gz)")
    p.add_argument("--quant", default=os.path.join(ROOT, "target", "release", "quant"), help="the quant binary")
    p.add_argument("--min-agreement", type=float, default=0.997)
    args = p.parse_args()

    onnx_file, export_dir = onnx_path_and_dir(args.export)
    images, labels = digits_test_split(args.data)
    s = session(onnx_file)
    inp = s.get_inputs()[0]
    shape = [d for d in inp.shape[1:]]
    logits = s.run(None, {inp.name: images.reshape((len(images), *shape))})[0]
    predicted = logits.argmax(axis=1)
    accuracy = float((predicted == labels).mean())
    print(f"{onnx_file}: onnxruntime accuracy {100 * accuracy:.2f}% on {len(labels)} test samples")

    quant_args = ["eval", export_dir, "--predictions"]
    if args.data:
        quant_args += ["--data", args.data]
    out = quant(args.quant, quant_args)
    line = re.search(r"^integer predictions: (.*)$", out, re.M)
    if not line:
        sys.exit(f"no integer predictions in quant's output:\n{out}")
    integer = np.asarray([int(v) for v in line.group(1).split()])
    integer_accuracy = float((integer == labels).mean())
    agreement = float((integer == predicted).mean())
    print(f"quant integer model accuracy {100 * integer_accuracy:.2f}%")
    print(f"onnxruntime = quant integer model on {100 * agreement:.2f}% of the test samples")
    if agreement < args.min_agreement:
        sys.exit(f"agreement {agreement:.4f} is below {args.min_agreement}")


if __name__ == "__main__":
    main()
