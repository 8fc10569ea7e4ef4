#!/usr/bin/env python3
"""Writes PyTorch reference vectors for quant-core's fake-quantization kernels.

Run by hand (CI never runs Python; the output is committed):

    pip install torch numpy
    python3 tools/gen_pytorch_fixtures.py      # writes quant-core/tests/integration/fixtures/pytorch_fake_quant.json

The outputs come from real PyTorch on the CPU, single-threaded:

* ``torch.fake_quantize_per_tensor_affine`` and its straight-through gradient (autograd);
* ``torch.fake_quantize_per_channel_affine`` on 2-D to 4-D tensors, several axes, and its
  gradient;
* ``torch._fake_quantize_learnable_per_tensor_affine`` (LSQ) forward and backward (autograd,
  with ``grad_factor``), and ``torch._fake_quantize_learnable_per_channel_affine``.

Every f32 is stored losslessly as its IEEE-754 bit pattern (an unsigned 32-bit integer), so
the Rust test can demand bit-identical forward values. Inputs include exact ties
(``x * (1/s) == k + 0.5`` in f32, found by search, not assumed), their one-ulp neighbours,
values on the grid, at and just past the ends of the range, far outside it (up to ±1e9, so
``x/s`` stays well inside int64: beyond it PyTorch's float-to-int64 cast is undefined
behaviour), signed zeros and subnormals. NaN and ±Inf are left out for the same reason.

PyTorch dispatches these CPU kernels to a build for the CPU's capability (DEFAULT, AVX2,
AVX512). In its AVX2/AVX512 builds the compiler contracts the LSQ backward's
``zero_point + x * inv_scale`` into one fused multiply-add, so near a tie (one ulp away) the
rounded code, hence ``dx`` and the scale gradient, depend on the machine. This script pins
``ATEN_CPU_CAPABILITY=default`` (no FMA: the portable C++ semantics, ``x * (1/s)`` rounded to
f32 and then ``+ z``), which is what quant-core computes on every CPU. The forward kernels
round before adding the zero point, so they do not depend on the capability.

PyTorch's per-tensor LSQ backward rounds the (float) zero point as ``trunc(clamp(z + 0.5))``
where its forward uses ``round_half_even(clamp(z))``: they differ for negative and for half-way
zero points (z = -5 becomes -4 in the backward). quant-core uses the forward's rounding in both
passes, so each case records ``zero_point_backward``, the value PyTorch's backward really used,
and the Rust test passes that one to our backward.

For LSQ, ``l1_dscale`` / ``l1_dzero_point`` record the sum of the absolute values of the
per-element terms (computed here in float64): the scale gradient is a sum of terms of both
signs, so the Rust test measures its error relative to ``max(|expected|, 1e-3 * l1)``.
"""

import json
import math
import os
import sys

import numpy as np

# Before torch loads: see the module docstring.
os.environ["ATEN_CPU_CAPABILITY"] = "default"

import torch  # noqa: E402

F32 = np.float32
OUT = os.path.join(os.path.dirname(__file__), "..", "quant-core", "tests", "integration", "fixtures", "pytorch_fake_quant.json")
RNG = np.random.default_rng(20240611)


def bits(values):
    """f32 bit patterns of `values`, as a list of ints."""
    return np.ascontiguousarray(np.asarray(values, dtype=F32)).view(np.uint32).ravel().tolist()


def f32bits(v):
    return int(np.asarray([v], dtype=F32).view(np.uint32)[0])


def inv_of(scale):
    # PyTorch: `float inv_scale = 1.0f / scale;`
    return F32(1.0) / F32(scale)


def ties(scale, ks, limit=None):
    """Inputs x with f32(x * inv) == k + 0.5 exactly, plus their one-ulp neighbours."""
    inv = inv_of(scale)
    exact, near = [], []
    for k in ks:
        target = F32(k + 0.5)
        x0 = target / inv
        for j in range(-6, 7):
            x = x0
            step = np.inf if j > 0 else -np.inf
            for _ in range(abs(j)):
                x = np.nextafter(x, F32(step), dtype=F32)
            if F32(x * inv) == target:
                exact.append(x)
                near.append(np.nextafter(x, F32(np.inf), dtype=F32))
                near.append(np.nextafter(x, F32(-np.inf), dtype=F32))
                break
    out = exact + near
    if limit is not None and len(out) > limit:
        idx = np.linspace(0, len(out) - 1, limit).round().astype(int)
        out = [out[i] for i in sorted(set(idx))]
    return out


def tie_ks(lo, hi, count):
    """Integers k near both ends of [lo, hi] and spread over it: ties at k + 0.5."""
    ks = set(range(lo - 3, lo + 3)) | set(range(hi - 3, hi + 3)) | {-1, 0, 1, 2}
    ks |= set(np.linspace(lo, hi, count).round().astype(int).tolist())
    return sorted(ks)


def grid_points(scale, lo, hi):
    ks = sorted({lo - 1, lo, lo + 1, hi - 1, hi, hi + 1, 0, (lo + hi) // 2})
    return [F32(k) * F32(scale) for k in ks]


def inputs(scale, zero_point, qmin, qmax, n_random=96, n_ties=24):
    """A test vector for one (scale, zero point, range)."""
    lo, hi = qmin - zero_point, qmax - zero_point
    xs = []
    xs += ties(scale, tie_ks(lo, hi, n_ties), limit=3 * (n_ties + 16))
    xs += grid_points(scale, lo, hi)
    span = float(hi - lo + 6) * scale
    centre = float(lo + hi) / 2 * scale
    xs += list((centre + span * (RNG.random(n_random) - 0.5)).astype(F32))
    xs += list((RNG.standard_normal(n_random // 2) * span / 4).astype(F32))
    far = [1e6, -1e6, 3.0e4, -3.0e4, 1e9, -1e9]
    # Keep |x / s| far inside int64 (PyTorch's cast to int64 is undefined beyond it).
    xs += [F32(v) for v in far if abs(v / scale) < 1e17]
    xs += [F32(0.0), F32(-0.0), F32(1e-30), F32(-1e-30), F32(1e-40), F32(-1e-40)]
    x = np.asarray(xs, dtype=F32)
    RNG.shuffle(x)
    return x


PER_TENSOR = [
    # (name, scale, zero_point, quant_min, quant_max)
    ("int8 symmetric s=0.5", 0.5, 0, -128, 127),
    ("int8 odd zero point", 0.5, 3, -128, 127),
    ("int8 s=0.1 z=-5", 0.1, -5, -128, 127),
    ("int8 narrow s=1/3", 1.0 / 3.0, 0, -127, 127),
    ("uint8 s=0.1 z=128", 0.1, 128, 0, 255),
    ("uint8 z=0", 0.0173, 0, 0, 255),
    ("uint8 z=255", 0.05, 255, 0, 255),
    ("int4 s=0.0173 z=1", 0.0173, 1, -8, 7),
    ("uint4 s=0.7 z=9", 0.7, 9, 0, 15),
    ("uint2 s=0.7 z=1", 0.7, 1, 0, 3),
    ("int16 s=2^-10 z=-7", 2.0**-10, -7, -32768, 32767),
    ("uint16 s=1e-3 z=32768", 1e-3, 32768, 0, 65535),
    ("int8 tiny scale 1e-5", 1e-5, 2, -128, 127),
    ("int8 large scale 300", 300.0, -1, -128, 127),
    ("wide [-2^24, 2^24] (slow path)", 1.0, 5, -(2**24), 2**24),
    ("int32 range (slow path)", 1e-3, 0, -(2**31), 2**31 - 1),
]

PER_CHANNEL = [
    # (name, shape, axis, quant_min, quant_max)
    ("int8 [6,5] axis 0", [6, 5], 0, -128, 127),
    ("int8 [4,5,6] axis 0", [4, 5, 6], 0, -128, 127),
    ("int8 [4,5,6] axis 1", [4, 5, 6], 1, -128, 127),
    ("uint8 [4,5,6] axis 2", [4, 5, 6], 2, 0, 255),
    ("int4 [3,4,7] axis 1", [3, 4, 7], 1, -8, 7),
    ("int8 [3,2,3,3] axis 0 (conv weight)", [3, 2, 3, 3], 0, -127, 127),
    ("uint8 [2,3,2,70] axis 1 (long rows)", [2, 3, 2, 70], 1, 0, 255),
]

LEARNABLE_PER_TENSOR = [
    # (name, scale, zero_point (float), quant_min, quant_max)
    ("lsq int8 s=0.5 z=0", 0.5, 0.0, -128, 127),
    ("lsq int8 odd z=3", 0.5, 3.0, -128, 127),
    ("lsq int8 s=0.0173 z=-5", 0.0173, -5.0, -128, 127),
    ("lsq uint8 s=0.1 z=128", 0.1, 128.0, 0, 255),
    ("lsq uint8 z=0", 0.05, 0.0, 0, 255),
    ("lsq int4 s=0.1 z=1", 0.1, 1.0, -8, 7),
    ("lsq uint4 s=0.7 z=9", 0.7, 9.0, 0, 15),
    ("lsq int16 s=2^-10 z=-7", 2.0**-10, -7.0, -32768, 32767),
    ("lsq zero point clamped into range", 0.25, 300.0, -128, 127),
    ("lsq fractional z=2.5", 0.5, 2.5, -128, 127),
    ("lsq fractional z=-3.7", 0.1, -3.7, -128, 127),
    ("lsq wide range (slow path)", 1e-3, 7.0, -(2**24), 2**24),
]

LEARNABLE_PER_CHANNEL = [
    # (name, shape, axis, quant_min, quant_max, fractional zero points)
    ("lsq int8 [6,40] axis 0", [6, 40], 0, -128, 127, False),
    ("lsq uint8 [3,4,5] axis 1", [3, 4, 5], 1, 0, 255, False),
    ("lsq int4 [5,3,3] axis 0, fractional zero points", [5, 3, 3], 0, -8, 7, True),
    ("lsq int8 [2,4,70] axis 1 (long rows)", [2, 4, 70], 1, -128, 127, False),
]


def per_tensor_case(name, scale, zp, qmin, qmax):
    x = inputs(scale, zp, qmin, qmax)
    dy = RNG.standard_normal(x.size).astype(F32)
    xt = torch.from_numpy(x.copy()).requires_grad_(True)
    y = torch.fake_quantize_per_tensor_affine(xt, float(F32(scale)), zp, qmin, qmax)
    y.backward(torch.from_numpy(dy.copy()))
    return {
        "name": name,
        "scale": f32bits(scale),
        "zero_point": zp,
        "quant_min": qmin,
        "quant_max": qmax,
        "x": bits(x),
        "y": bits(y.detach().numpy()),
        "dy": bits(dy),
        "dx": bits(xt.grad.numpy()),
    }


def channel_values(shape, axis, scales, zps, qmin, qmax):
    """Fills a tensor element by element from per-channel pools of interesting values."""
    pools = [inputs(float(s), int(z), qmin, qmax, n_random=24, n_ties=8) for s, z in zip(scales, zps)]
    x = np.empty(shape, dtype=F32)
    cursor = [0] * len(pools)
    for idx in np.ndindex(*shape):
        c = idx[axis]
        x[idx] = pools[c][cursor[c] % len(pools[c])]
        cursor[c] += 1
    return x


def channel_params(channels, qmin, qmax):
    scales = (np.exp(RNG.uniform(np.log(0.01), np.log(0.8), channels))).astype(F32)
    scales[0] = F32(0.5)  # exact reciprocal: plenty of exact ties
    mid = (qmin + qmax) // 2
    width = max(1, (qmax - qmin) // 8)
    zps = np.clip(RNG.integers(mid - width, mid + width + 1, channels), qmin, qmax).astype(np.int32)
    zps[-1] = qmin  # a zero point at the end of the range
    return scales, zps


def per_channel_case(name, shape, axis, qmin, qmax):
    scales, zps = channel_params(shape[axis], qmin, qmax)
    x = channel_values(shape, axis, scales, zps, qmin, qmax)
    dy = RNG.standard_normal(shape).astype(F32)
    xt = torch.from_numpy(x.copy()).requires_grad_(True)
    y = torch.fake_quantize_per_channel_affine(
        xt, torch.from_numpy(scales.copy()), torch.from_numpy(zps.copy()), axis, qmin, qmax
    )
    y.backward(torch.from_numpy(dy.copy()))
    return {
        "name": name,
        "shape": shape,
        "axis": axis,
        "scales": bits(scales),
        "zero_points": zps.tolist(),
        "quant_min": qmin,
        "quant_max": qmax,
        "x": bits(x.ravel()),
        "y": bits(y.detach().numpy().ravel()),
        "dy": bits(dy.ravel()),
        "dx": bits(xt.grad.numpy().ravel()),
    }


def lsq_l1(x, dy, scale, zp, qmin, qmax, g):
    """Sums of |per-element terms| of the scale and zero-point gradients, in float64."""
    inv = inv_of(scale)
    w = (x * inv).astype(F32) + F32(zp)
    r = np.rint(w.astype(np.float64))
    inside = (r >= qmin) & (r <= qmax)
    k = np.clip(r, qmin, qmax) - zp
    term = np.where(inside, (k * float(scale) - x.astype(np.float64)) * float(inv), k)
    l1_s = float(np.sum(np.abs(dy.astype(np.float64) * term)) * abs(g))
    l1_z = float(np.sum(np.abs(np.where(inside, 0.0, dy.astype(np.float64)))) * float(scale) * abs(g))
    return l1_s, l1_z


def torch_backward_zero_point(zp, qmin, qmax):
    """PyTorch's `_get_zero_point_from_tensor(z, qmin, qmax, is_forward=false)`."""
    v = F32(zp) + F32(0.5)
    v = min(max(v, F32(qmin)), F32(qmax))
    return float(math.trunc(float(v)))


def learnable_per_tensor_case(name, scale, zp, qmin, qmax):
    z_int = int(np.clip(np.rint(F32(zp)), qmin, qmax))  # the forward's zero point
    z_bwd = torch_backward_zero_point(zp, qmin, qmax)
    x = inputs(scale, z_int, qmin, qmax)
    dy = RNG.standard_normal(x.size).astype(F32)
    g = float(F32(1.0 / math.sqrt(x.size * qmax)))
    xt = torch.from_numpy(x.copy()).requires_grad_(True)
    st = torch.tensor([F32(scale)], requires_grad=True)
    zt = torch.tensor([F32(zp)], requires_grad=True)
    y = torch._fake_quantize_learnable_per_tensor_affine(xt, st, zt, qmin, qmax, g)
    y.backward(torch.from_numpy(dy.copy()))
    case = {
        "name": name,
        "scale": f32bits(scale),
        "zero_point": f32bits(zp),
        "quant_min": qmin,
        "quant_max": qmax,
        "zero_point_backward": f32bits(z_bwd),
        "grad_factor": f32bits(g),
        "x": bits(x),
        "y": bits(y.detach().numpy()),
        "dy": bits(dy),
        "dx": bits(xt.grad.numpy()),
        "dscale": [f32bits(st.grad.item())],
        "dzero_point": [f32bits(zt.grad.item())],
    }
    l1_s, l1_z = lsq_l1(x, dy, F32(scale), int(z_bwd), qmin, qmax, g)
    case["l1_dscale"] = [l1_s]
    case["l1_dzero_point"] = [l1_z]
    return case


def learnable_per_channel_case(name, shape, axis, qmin, qmax, fractional):
    scales, zps = channel_params(shape[axis], qmin, qmax)
    zf = zps.astype(F32)
    if fractional:
        zf = zf + RNG.choice([F32(-0.5), F32(0.5), F32(0.3), F32(-0.7)], zf.size).astype(F32)
    z_round = np.clip(np.rint(zf), qmin, qmax).astype(np.int64)
    x = channel_values(shape, axis, scales, z_round, qmin, qmax)
    dy = RNG.standard_normal(shape).astype(F32)
    per_channel = int(np.prod(shape)) // shape[axis]
    g = float(F32(1.0 / math.sqrt(per_channel * qmax)))
    xt = torch.from_numpy(x.copy()).requires_grad_(True)
    st = torch.from_numpy(scales.copy()).requires_grad_(True)
    zt = torch.from_numpy(zf.copy()).requires_grad_(True)
    y = torch._fake_quantize_learnable_per_channel_affine(xt, st, zt, axis, qmin, qmax, g)
    y.backward(torch.from_numpy(dy.copy()))
    l1_s, l1_z = [], []
    xm = np.moveaxis(x, axis, 0)
    dym = np.moveaxis(dy, axis, 0)
    for c in range(shape[axis]):
        a, b = lsq_l1(xm[c].ravel(), dym[c].ravel(), scales[c], int(z_round[c]), qmin, qmax, g)
        l1_s.append(a)
        l1_z.append(b)
    return {
        "name": name,
        "shape": shape,
        "axis": axis,
        "scales": bits(scales),
        "zero_points": bits(zf),
        "quant_min": qmin,
        "quant_max": qmax,
        "grad_factor": f32bits(g),
        "x": bits(x.ravel()),
        "y": bits(y.detach().numpy().ravel()),
        "dy": bits(dy.ravel()),
        "dx": bits(xt.grad.numpy().ravel()),
        "dscale": bits(st.grad.numpy()),
        "dzero_point": bits(zt.grad.numpy()),
        "l1_dscale": l1_s,
        "l1_dzero_point": l1_z,
    }


def main():
    torch.set_num_threads(1)
    fixtures = {
        "generator": "tools/gen_pytorch_fixtures.py",
        "torch_version": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "encoding": "every f32 (scales, inputs, outputs, gradients) is its IEEE-754 bit pattern as an unsigned integer",
        "per_tensor": [per_tensor_case(*c) for c in PER_TENSOR],
        "per_channel": [per_channel_case(*c) for c in PER_CHANNEL],
        "learnable_per_tensor": [learnable_per_tensor_case(*c) for c in LEARNABLE_PER_TENSOR],
        "learnable_per_channel": [learnable_per_channel_case(*c) for c in LEARNABLE_PER_CHANNEL],
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        # One case per line: readable diffs when the script changes.
        f.write("{\n")
        keys = list(fixtures)
        for i, key in enumerate(keys):
            value = fixtures[key]
            sep = "," if i + 1 < len(keys) else ""
            if isinstance(value, list):
                f.write(f'  "{key}": [\n')
                for j, case in enumerate(value):
                    f.write("    " + json.dumps(case, separators=(",", ":")) + ("," if j + 1 < len(value) else "") + "\n")
                f.write(f"  ]{sep}\n")
            else:
                f.write(f"  {json.dumps(key)}: {json.dumps(value)}{sep}\n")
        f.write("}\n")
    counts = {k: len(v) for k, v in fixtures.items() if isinstance(v, list)}
    print(f"wrote {os.path.normpath(OUT)} with torch {torch.__version__}: {counts}", file=sys.stderr)


if __name__ == "__main__":
    main()
