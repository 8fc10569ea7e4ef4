#!/usr/bin/env python3
"""Speed anchor: onnxruntime on an exported model.onnx against quant's integer runtime
(`quant eval DIR --repeat N`) on the same model and the same batch, one thread each, and the
ratio. tract (quant eval --onnx) is timed too, for reference.

    cargo build --release
    /tmp/ort/bin/python tools/bench_onnxruntime.py runs/mlp_w4a4/export --batch 360 --repeat 200

Each figure is the median of --repeat timed runs after warm-up. Not part of CI.
"""

import argparse
import os
import re
import statistics
import sys
import time

from onnx_common import ROOT, batch_input, digits_test_split, onnx_path_and_dir, quant, session


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("export", help="an export directory (model.onnx beside model.json)")
    p.add_argument("--batch", type=int, default=360, help="samples per batch (cycling through the test split)")
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument("--quant", default=os.path.join(ROOT, "target", "release", "quant"), help="the quant binary")
    args = p.parse_args()

    onnx_file, export_dir = onnx_path_and_dir(args.export)
    images, _ = digits_test_split()
    s = session(onnx_file, threads=1)
    inp = s.get_inputs()[0]
    x = batch_input(images, inp.shape[1:], args.batch)
    for _ in range(10):
        s.run(None, {inp.name: x})
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        s.run(None, {inp.name: x})
        times.append((time.perf_counter() - t) * 1e3)
    ort_ms = statistics.median(times)

    out = quant(
        args.quant,
        ["eval", export_dir, "--onnx", onnx_file, "--repeat", str(args.repeat), "--batch", str(args.batch)],
        threads=1,
    )
    def ms(label):
        m = re.search(rf"^{label}: ([0-9.]+) ms per batch", out, re.M)
        if not m:
            sys.exit(f"no `{label}` timing in quant's output:\n{out}")
        return float(m.group(1))
    integer_ms, tract_ms = ms("integer runtime"), ms("tract")

    print(f"{export_dir}: batch {args.batch}, one thread, median of {args.repeat} runs")
    print(f"  onnxruntime      {ort_ms:9.4f} ms")
    print(f"  quant integer    {integer_ms:9.4f} ms")
    print(f"  tract            {tract_ms:9.4f} ms")
    print(f"quant integer / onnxruntime = {integer_ms / ort_ms:.2f}x the time "
          f"(onnxruntime is {integer_ms / ort_ms:.2f}x as fast)")
    print(f"tract / onnxruntime = {tract_ms / ort_ms:.2f}x the time")


if __name__ == "__main__":
    main()
