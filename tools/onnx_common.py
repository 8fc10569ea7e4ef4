"""Shared by tools/check_onnx.py and tools/bench_onnxruntime.py: the digits test split exactly as
quant reads it, and the `quant` binary."""

import gzip
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def digits_test_split(path=None):
    """The test split of a digits file (default: the bundled one): every fifth row, pixels / 16.

    Returns (images float32 [n, 64], labels int64 [n]), as quant::digits splits the file."""
    path = path or os.path.join(ROOT, "data", "digits.csv.gz")
    opener = gzip.open if path.endswith(".gz") else open
    images, labels = [], []
    row = 0
    with opener(path, "rt", encoding="utf-8-sig") as f:
        for line in f:
            if not line.strip():
                continue
            fields = line.strip().split(",")
            if row % 5 == 0:
                images.append([int(v) / 16.0 for v in fields[:64]])
                labels.append(int(fields[64]))
            row += 1
    return np.asarray(images, dtype=np.float32), np.asarray(labels, dtype=np.int64)


def onnx_path_and_dir(target):
    """`target` is an export directory or a model.onnx: returns (model.onnx, export dir)."""
    if os.path.isdir(target):
        return os.path.join(target, "model.onnx"), target
    return target, os.path.dirname(os.path.abspath(target))


def quant(binary, args, threads=None):
    """Runs the quant binary and returns its stdout (exits with its stderr on failure)."""
    if not os.path.exists(binary):
        sys.exit(f"{binary} not found: build it with `cargo build --release` (or pass --quant)")
    env = dict(os.environ)
    if threads is not None:
        env["RAYON_NUM_THREADS"] = str(threads)
    done = subprocess.run([binary, *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"quant {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def session(onnx_file, threads=1):
    """An onnxruntime session on the CPU with `threads` threads and every graph optimisation."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(onnx_file, options, providers=["CPUExecutionProvider"])


def batch_input(images, shape, batch=None):
    """`batch` samples cycling through `images` (default: all), shaped [n, *shape]."""
    if batch is not None:
        images = images[np.arange(batch) % len(images)]
    return np.ascontiguousarray(images.reshape((len(images), *shape)))
