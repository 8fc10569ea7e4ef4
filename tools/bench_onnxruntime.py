#!/usr/bin/env python3
"""Speed anchor: onnxruntime on an exported model.onnx against quant's integer runtime
(`quant eval DIR --repeat N`) on the same model and the same batch, one thread each, and the
ratio. tract (quant eval --onnx) is timed too, for reference.

    cargo build --release
    /tmp/ort/bin/python tools/bench_onnxruntime.py runs/mlp_w4a4/export --batch 360 --repeat 200

The runs alternate between the two in --rounds rounds (a shared machine's load then falls on
both alike); each figure is the median of the rounds' medians. Not part of CI.
"""

import argparse
import os
import re
import statistics
import sys
import time

import numpy as np

from onnx_common import ROOT, batch_input, digits_test_split, onnx_path_and_dir, quant, session


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("export", help="an export directory (model.onnx beside model.json)")
    p.add_argument("--batch", type=int, default=360, help="samples per batch (cycling through the test split)")
    p.add_argument("--repeat", type=int, default=200, help="timed runs of each side, in all")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds the runs are split into")
    p.add_argument("--quant", default=os.path.join(ROOT, "target", "release", "quant"), help="the quant binary")
    p.add_argument("--config", help="the run file of a model on other data (MNIST): quant eval reads its test "
                   "split; onnxruntime gets uniform random pixels of the same shape (neither's speed depends "
                   "on the values)")
    p.add_argument("--max-isa", help="quant's kernels on no path newer than this one (avx2: what an AVX2-only "
                   "CPU runs); onnxruntime picks its own")
    args = p.parse_args()

    onnx_file, export_dir = onnx_path_and_dir(args.export)
    s = session(onnx_file, threads=1)
    inp = s.get_inputs()[0]
    if args.config:
        shape = [args.batch, *inp.shape[1:]]
        x = np.random.default_rng(0).random(shape, dtype=np.float32)
    else:
        images, _ = digits_test_split()
        x = batch_input(images, inp.shape[1:], args.batch)
    for _ in range(10):
        s.run(None, {inp.name: x})

    def ms(out, label):
        m = re.search(rf"^{label}: ([0-9.]+) ms per batch", out, re.M)
        if not m:
            sys.exit(f"no `{label}` timing in quant's output:\n{out}")
        return float(m.group(1))

    # Rounds alternate between onnxruntime and quant, so that a change in the machine's load
    # (other tenants of a shared CPU) falls on both sides alike; each side's figure is the median
    # of its per-round medians. tract, far slower, runs in the first round only.
    per_round = max(1, args.repeat // args.rounds)
    ort_rounds, integer_rounds, tract_ms = [], [], None
    for r in range(args.rounds):
        times = []
        for _ in range(per_round):
            t = time.perf_counter()
            s.run(None, {inp.name: x})
            times.append((time.perf_counter() - t) * 1e3)
        ort_rounds.append(statistics.median(times))
        onnx = ["--onnx", onnx_file] if r == 0 else []
        out = quant(
            args.quant,
            ["eval", export_dir, *onnx, "--repeat", str(per_round), "--batch", str(args.batch)]
            + (["--config", args.config] if args.config else [])
            + (["--max-isa", args.max_isa] if args.max_isa else []),
            threads=1,
        )
        integer_rounds.append(ms(out, "integer runtime"))
        if r == 0:
            tract_ms = ms(out, "tract")
    ort_ms, integer_ms = statistics.median(ort_rounds), statistics.median(integer_rounds)

    paths = f", quant's kernels on {args.max_isa} or older" if args.max_isa else ""
    print(f"{export_dir}: batch {args.batch}, one thread, {args.rounds} alternating rounds of {per_round} runs{paths}")
    print(f"  onnxruntime      {ort_ms:9.4f} ms")
    print(f"  quant integer    {integer_ms:9.4f} ms")
    print(f"  tract            {tract_ms:9.4f} ms")
    print(f"quant integer / onnxruntime = {integer_ms / ort_ms:.2f}x the time "
          f"(onnxruntime is {integer_ms / ort_ms:.2f}x as fast)")
    print(f"tract / onnxruntime = {tract_ms / ort_ms:.2f}x the time")


if __name__ == "__main__":
    main()
