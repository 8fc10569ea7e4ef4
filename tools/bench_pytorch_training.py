#!/usr/bin/env python3
"""Training speed against PyTorch: the MNIST CNN and ViT of `quant run`, one training step
(forward, cross-entropy, backward, Adam, gradients zeroed) at batch 64, in PyTorch eager and in
quant, float and W4A4 LSQ QAT, on one thread and on every core; prints both and the ratios.

    cargo build --release --example bench_models
    python3 -m venv /tmp/torch && /tmp/torch/bin/pip install torch numpy
    /tmp/torch/bin/python tools/bench_pytorch_training.py

The PyTorch models are the same networks (layer for layer, same sizes). quant's float model
trains with BatchNorm in training mode, as does PyTorch's; quant's QAT model has BatchNorm
folded, and so has PyTorch's. PyTorch's QAT is LSQ through its own learnable fake-quantize
ops (`torch._fake_quantize_learnable_per_channel_affine` for the weights, 4-bit symmetric per
channel; `..._per_tensor_affine` for every Linear's and Conv's input, 4-bit); quant's ViT QAT
also runs its integer softmax, GELU and LayerNorm kernels in the forward pass, which PyTorch has
no counterpart for (its QAT model runs them in float). Not part of CI.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class LsqInput(nn.Module):
    """A learnable per-tensor 4-bit fake quantizer of activations (PyTorch's LSQ op)."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([0.1]))
        self.zero = nn.Parameter(torch.tensor([8.0]))

    def forward(self, x):
        g = 1.0 / (x.numel() * 15) ** 0.5
        return torch._fake_quantize_learnable_per_tensor_affine(x, self.scale, self.zero, 0, 15, g)


def lsq_weight(w, scale, zero):
    g = 1.0 / (w[0].numel() * 7) ** 0.5
    return torch._fake_quantize_learnable_per_channel_affine(w, scale, zero, 0, -8, 7, g)


class QLinear(nn.Linear):
    """Linear with LSQ on its input (per tensor) and weights (per output channel)."""

    def __init__(self, i, o):
        super().__init__(i, o)
        self.input_quantizer = LsqInput()
        self.w_scale = nn.Parameter(torch.full((o,), 0.05))
        self.register_buffer("w_zero", torch.zeros(o))

    def forward(self, x):
        return F.linear(self.input_quantizer(x), lsq_weight(self.weight, self.w_scale, self.w_zero), self.bias)


class QConv(nn.Conv2d):
    """Conv2d with LSQ on its input (per tensor) and weights (per output channel)."""

    def __init__(self, i, o, k, stride=1, padding=0):
        super().__init__(i, o, k, stride=stride, padding=padding)
        self.input_quantizer = LsqInput()
        self.w_scale = nn.Parameter(torch.full((o,), 0.05))
        self.register_buffer("w_zero", torch.zeros(o))

    def forward(self, x):
        w = lsq_weight(self.weight, self.w_scale, self.w_zero)
        return F.conv2d(self.input_quantizer(x), w, self.bias, self.stride, self.padding)


def cnn(qat):
    """Three conv-BatchNorm-ReLU-maxpool stages of 16, 32, 64 channels, Linear head on 576;
    the QAT model has BatchNorm folded (no BatchNorm layer), as quant's."""
    layers, c = [], 1
    for o in (16, 32, 64):
        if qat:
            layers += [QConv(c, o, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        else:
            layers += [nn.Conv2d(c, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(2)]
        c = o
    layers += [nn.Flatten(), QLinear(576, 10) if qat else nn.Linear(576, 10)]
    return nn.Sequential(*layers)


class Attention(nn.Module):
    """4-head self-attention with separate query, key, value and output projections (dfdx's
    MultiHeadAttention); in QAT, the inputs of both attention products are quantized too."""

    def __init__(self, width, heads, qat):
        super().__init__()
        lin = QLinear if qat else nn.Linear
        self.q, self.k, self.v, self.o = (lin(width, width) for _ in range(4))
        self.heads = heads
        self.quantizers = nn.ModuleList(LsqInput() for _ in range(4)) if qat else None

    def forward(self, x):
        b, t, w = x.shape
        split = lambda y: y.view(b, t, self.heads, w // self.heads).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        if self.quantizers is not None:
            q, k = self.quantizers[0](q), self.quantizers[1](k)
        scores = q @ k.transpose(-1, -2) / (w // self.heads) ** 0.5
        probs = scores.softmax(-1)
        if self.quantizers is not None:
            probs, v = self.quantizers[2](probs), self.quantizers[3](v)
        context = (probs @ v).transpose(1, 2).reshape(b, t, w)
        return self.o(context)


class Block(nn.Module):
    def __init__(self, width, hidden, qat):
        super().__init__()
        lin = QLinear if qat else nn.Linear
        self.norm1, self.attention = nn.LayerNorm(width), Attention(width, 4, qat)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(lin(width, hidden), nn.GELU(), lin(hidden, width))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Vit(nn.Module):
    """7x7 patches by a strided convolution (16 tokens of 64), a learned position embedding,
    four pre-norm blocks (4-head attention, GELU MLP 64-128-64), LayerNorm, the mean of the
    tokens, a Linear head."""

    def __init__(self, qat):
        super().__init__()
        self.patches = QConv(1, 64, 7, stride=7) if qat else nn.Conv2d(1, 64, 7, stride=7)
        self.position = nn.Parameter(torch.zeros(16, 64))
        self.blocks = nn.Sequential(*(Block(64, 128, qat) for _ in range(4)))
        self.norm = nn.LayerNorm(64)
        self.head = QLinear(64, 10) if qat else nn.Linear(64, 10)

    def forward(self, x):
        tokens = self.patches(x).flatten(2).transpose(1, 2) + self.position
        return self.head(self.norm(self.blocks(tokens)).mean(1))


def step_time(model, threads, steps, batch=64):
    """The median time of one training step, in µs."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    x, y = torch.rand(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()

    def step():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    for _ in range(5):
        step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def quant_steps(binary):
    """quant's `train28` figures: {(model, threads): (float µs, QAT µs)}."""
    if not os.path.exists(binary):
        sys.exit(f"{binary} not found: cargo build --release --example bench_models")
    out = subprocess.run([binary, "train28"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    found = {}
    for m in re.finditer(r"^train28 (\w+) (\d+) ([0-9.]+) ([0-9.]+)$", out, re.M):
        found[(m.group(1), int(m.group(2)))] = (float(m.group(3)), float(m.group(4)))
    if not found:
        sys.exit(f"no train28 lines in bench_models' output:\n{out}")
    return found


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30, help="timed steps per figure (median)")
    p.add_argument("--bench", default=os.path.join(ROOT, "target", "release", "examples", "bench_models"))
    args = p.parse_args()

    ours = quant_steps(args.bench)
    print(f"torch {torch.__version__}; batch 64; median of {args.steps} steps; µs per step")
    print("model threads | PyTorch float  quant float  ratio | PyTorch QAT  quant QAT  ratio")
    for name, build in (("cnn", cnn), ("vit", lambda qat: Vit(qat))):
        for threads in sorted({t for (m, t) in ours if m == name}):
            torch_float = step_time(build(False), threads, args.steps)
            torch_qat = step_time(build(True), threads, args.steps)
            q_float, q_qat = ours[(name, threads)]
            print(f"{name:5} {threads:7} | {torch_float:13.0f}  {q_float:11.0f}  {q_float / torch_float:4.2f}x |"
                  f" {torch_qat:11.0f}  {q_qat:9.0f}  {q_qat / torch_qat:4.2f}x")
    print("ratio: quant's time / PyTorch's (below 1: quant is faster)")


if __name__ == "__main__":
    main()
