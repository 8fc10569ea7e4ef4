#!/usr/bin/env python3
"""PTQ with nearest rounding against learned rounding (AdaRound or GPTQ), optionally with
bias correction, at W8A8, W4A8 and W3A8 (weights per channel), on the bundled MNIST and digits
models: the figures of the README's learned-rounding table.

Each variant is its base run file with the weights and input widths replaced, QAT off, and
the weights settings `learned_rounding` / `bias_correction` added; the float models come from
the cache (`runs/cache`), so the float training runs once per model and seed.

    cargo build --release --bin quant
    python3 tools/learned_rounding_sweep.py [--seeds 0,1,2] [--models mnist_cnn,...] [--bits 8,4,3]

Prints one line per variant: float, PTQ (mean over the seeds, test split), the share of the
float-PTQ gap of nearest rounding that the variant closes, and the run's wall time (float
models from the cache: calibration, the learned rounding and the evaluations).
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys
import time

BASES = {
    "mnist_cnn": "configs/mnist_cnn_w4a4.toml",
    "mnist_resnet": "configs/mnist_resnet_w4a4.toml",
    "mnist_vit": "configs/mnist_vit_w8a8.toml",
    "digits_vit": "configs/vit_w8a8.toml",
}
VARIANTS = {
    "nearest": [],
    "adaround": ['learned_rounding = "AdaRound"'],
    "adaround_bc": ['learned_rounding = "AdaRound"', "bias_correction = true"],
    "gptq": ['learned_rounding = "GPTQ"'],
    "gptq_bc": ['learned_rounding = "GPTQ"', "bias_correction = true"],
}


def section_set(text, section, key, value):
    """Sets `key = value` in `[section]` (replacing an existing line)."""
    lines = text.splitlines()
    out, inside, done = [], False, False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("["):
            if inside and not done:
                out.append(f"{key} = {value}")
                done = True
            inside = stripped == f"[{section}]"
        if inside and re.match(rf"{re.escape(key)}\s*=", stripped):
            out.append(f"{key} = {value}")
            done = True
            continue
        out.append(line)
    if inside and not done:
        out.append(f"{key} = {value}")
    return "\n".join(out) + "\n"


def variant(base_text, bits, extra):
    text = section_set(base_text, "quantization.weights", "bits", str(bits))
    text = section_set(text, "quantization.weights", "per_channel", "true")
    text = section_set(text, "quantization.input", "bits", "8")
    text = section_set(text, "qat", "epochs", "0")
    text = section_set(text, "qat", "warmup_epochs", "0")
    for line in extra:
        key, value = [p.strip() for p in line.split("=", 1)]
        text = section_set(text, "quantization.weights", key, value)
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2", help="the run files' seeds (0,1,2), or one")
    ap.add_argument("--models", default=",".join(BASES))
    ap.add_argument("--bits", default="8,4,3")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--binary", default="target/release/quant")
    args = ap.parse_args()
    out_dir = pathlib.Path("runs/learned_rounding")
    out_dir.mkdir(parents=True, exist_ok=True)
    for model in args.models.split(","):
        base = pathlib.Path(BASES[model]).read_text()
        for bits in [int(b) for b in args.bits.split(",")]:
            results = {}
            for name in args.variants.split(","):
                # The data paths are relative to the repository: the run file stays in configs/.
                cfg = pathlib.Path("configs") / f".sweep_{model}_w{bits}a8_{name}.toml"
                cfg.write_text(variant(base, bits, VARIANTS[name]))
                report = out_dir / f"{model}_w{bits}a8_{name}.json"
                cmd = [args.binary, "run", str(cfg), "--quiet", "--report", str(report),
                       "--out", str(out_dir / f"{model}_w{bits}a8_{name}")]
                if "," not in args.seeds:
                    cmd += ["--seed", args.seeds]
                start = time.monotonic()
                proc = subprocess.run(cmd, capture_output=True, text=True)
                seconds = time.monotonic() - start
                cfg.unlink()
                if proc.returncode != 0:
                    print(f"{model} w{bits}a8 {name}: failed\n{proc.stderr}", file=sys.stderr)
                    continue
                r = json.loads(report.read_text())
                results[name] = (r, seconds)
            if "nearest" not in results:
                continue
            fp32 = results["nearest"][0]["fp32_accuracy"] * 100
            near = results["nearest"][0]["ptq_accuracy"] * 100
            for name, (r, seconds) in results.items():
                ptq = r["ptq_accuracy"] * 100
                gap = fp32 - near
                closed = (ptq - near) / gap * 100 if gap > 0 else float("nan")
                print(f"{model:13} W{bits}A8 {name:12} float {fp32:6.2f}  PTQ {ptq:6.2f}  "
                      f"gap closed {closed:6.1f}%  {seconds:6.1f} s", flush=True)


if __name__ == "__main__":
    main()
