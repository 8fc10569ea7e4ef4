#!/usr/bin/env python3
"""The mixed-precision and fallback figures of the README's PTQ-toolbox section.

For each model: `quant analyze` chooses on rows held out of the training split (never the test
split), writes a policy, and `quant run --policy` measures that policy's PTQ accuracy on the
test split (QAT off), beside uniform W4A8 PTQ and float.

- mixed precision: `--weight-budget 4` and `--weight-budget 3` (candidates 2, 4, 8) on the
  W4A8 run file;
- fallback: `--max-drop 0.5` on a W4A4 run file, with the number of slots it left float;
- fallback with learned rounding and bias correction (`fallback_adaround`, `fallback_gptq`) on
  the W4A4 run file;
- fallback with SmoothQuant (`smoothing`): the W4A4 run file with `smoothing = 0.25, 0.5, 0.75`
  on the Linear layers' inputs, each with its hold-out and test PTQ and its fallback;
- mixed precision with learned rounding (`mixed_adaround`, `mixed_gptq`): the same budgets,
  widths 2, 3, 4 and 8, on the W4A8 run file with `learned_rounding = "AdaRound"` or `"GPTQ"`;
- timing: `quant analyze` (the ranking) and the `--weight-budget 4` search, wall time, with the
  float models already cached (one untimed run first trains them).

    cargo build --release --bin quant
    python3 tools/ptq_toolbox_targets.py [--models mnist_cnn,digits_vit] [--tasks mixed,fallback,timing]
"""
import argparse
import json
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from learned_rounding_sweep import BASES, section_set, variant  # noqa: E402

W4A4 = {
    "mnist_cnn": "configs/mnist_cnn_w4a4.toml",
    "digits_vit": "configs/vit_w4a4.toml",
}
OUT = pathlib.Path("runs/ptq_toolbox")


def quant(binary, *args):
    started = time.time()
    proc = subprocess.run([binary, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"quant {' '.join(args)} failed:\n{proc.stderr}")
    return proc.stdout, time.time() - started


def config(name, text):
    path = pathlib.Path("configs") / f".targets_{name}.toml"
    path.write_text(text)
    return path


def ptq_of(binary, cfg, name, policy=None):
    report = OUT / f"{name}.json"
    args = ["run", str(cfg), "--quiet", "--report", str(report), "--out", str(OUT / name)]
    if policy:
        args += ["--policy", str(policy)]
    quant(binary, *args)
    r = json.loads(report.read_text())
    return r["fp32_accuracy"] * 100, r["ptq_accuracy"] * 100


def fallback(binary, model, label, weights_settings, extra="", described=""):
    """`--max-drop 0.5` on the model's W4A4 run file (QAT off, `weights_settings` added to its
    weights table, `extra` TOML appended, `described` in the output), then the written policy's
    PTQ on the test split."""
    text = pathlib.Path(W4A4[model]).read_text()
    text = section_set(text, "qat", "epochs", "0")
    text = section_set(text, "qat", "warmup_epochs", "0")
    for key, value in weights_settings:
        text = section_set(text, "quantization.weights", key, value)
    w4a4 = config(f"{model}_w4a4{label}", text + extra)
    policy = OUT / f"{model}_fallback{label}.toml"
    report = OUT / f"{model}_fallback{label}_analysis.json"
    _, secs = quant(binary, "analyze", str(w4a4), "--quiet", "--max-drop", "0.5",
                    "--policy-out", str(policy), "--report", str(report))
    analysis = json.loads(report.read_text())
    f = analysis["fallback"]
    holdout = analysis["mean"]["quantized"]["accuracy"] * 100
    fp32, plain = ptq_of(binary, w4a4, f"{model}_w4a4{label}_plain")
    _, fell = ptq_of(binary, w4a4, f"{model}_w4a4{label}_fallback", policy)
    settings = ", ".join(f"{k} = {v}" for k, v in weights_settings) or "nearest rounding"
    settings += f", {described}" if described else ""
    print(f"{model:11} fallback max_drop 0.5 on W4A4 ({settings}): {len(f['raised'])} of "
          f"{f['slots']} slots raised ({', '.join(f['raised'])}); test: float "
          f"{fp32:6.2f}, PTQ {plain:6.2f} -> {fell:6.2f} (drop {fp32 - fell:.2f}); hold-out PTQ "
          f"{holdout:6.2f}; analyze {secs:.0f} s", flush=True)
    w4a4.unlink()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mnist_cnn,digits_vit")
    ap.add_argument("--tasks", default="mixed,mixed_adaround,fallback,fallback_adaround,timing")
    ap.add_argument("--binary", default="target/release/quant")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    tasks = args.tasks.split(",")
    for model in args.models.split(","):
        base = pathlib.Path(BASES[model]).read_text()
        w4a8 = config(f"{model}_w4a8", variant(base, 4, []))
        # Uniform W4A8 PTQ, the baseline of every mixed-precision task: run once per model.
        if {"mixed", "mixed_adaround", "mixed_gptq"} & set(tasks):
            fp32, uniform = ptq_of(args.binary, w4a8, f"{model}_w4a8_uniform")
            print(f"{model:11} float {fp32:6.2f}  uniform W4A8 PTQ {uniform:6.2f}", flush=True)
        # The searches: nearest rounding with the default candidates, and each learned
        # rounding with widths 2, 3, 4 and 8.
        for task, method in (("mixed", None), ("mixed_adaround", "AdaRound"),
                             ("mixed_gptq", "GPTQ")):
            if task not in tasks:
                continue
            if method is None:
                cfg, tag, label, extra = w4a8, "", "", []
            else:
                cfg = config(f"{model}_w4a8_{method.lower()}",
                             variant(base, 4, [f'learned_rounding = "{method}"']))
                tag, label, extra = f"_{method.lower()}", f" + {method}", ["--candidates", "2,3,4,8"]
            for budget in ["4", "3"]:
                policy = OUT / f"{model}_weights{budget}{tag}.toml"
                report = OUT / f"{model}_weights{budget}{tag}_analysis.json"
                _, secs = quant(args.binary, "analyze", str(cfg), "--quiet", "--weight-budget",
                                budget, *extra, "--policy-out", str(policy),
                                "--report", str(report))
                m = json.loads(report.read_text())["mixed_precision"]
                widths = ",".join(str(s["bits"]) for s in m["slots"])
                _, mixed = ptq_of(args.binary, cfg, f"{model}_weights{budget}{tag}", policy)
                print(f"{model:11} mixed precision{label}, weight budget {budget} bits: "
                      f"{m['bits']:.3f} bits/weight (widths {widths}), test PTQ {mixed:6.2f} "
                      f"(vs uniform W4A8 {mixed - uniform:+.2f}), analyze {secs:.0f} s", flush=True)
            if method is not None:
                cfg.unlink()
        if "fallback" in tasks and model in W4A4:
            fallback(args.binary, model, "", [])
        for task, method in (("fallback_adaround", "AdaRound"), ("fallback_gptq", "GPTQ")):
            if task in tasks and model in W4A4:
                fallback(args.binary, model, f"_{method.lower()}",
                         [("learned_rounding", f'"{method}"'), ("bias_correction", "true")])
        if "smoothing" in tasks and model in W4A4:
            for alpha in ["0.25", "0.5", "0.75"]:
                fallback(args.binary, model, f"_smooth{alpha}", [],
                         f"\n[quantization.kinds.Linear]\ninput = {{ smoothing = {alpha} }}\n",
                         f"smoothing = {alpha}")
        if "timing" in tasks:
            quant(args.binary, "analyze", str(w4a8), "--quiet")  # trains and caches the floats
            _, rank_secs = quant(args.binary, "analyze", str(w4a8), "--quiet")
            _, search_secs = quant(args.binary, "analyze", str(w4a8), "--quiet",
                                   "--weight-budget", "4")
            print(f"{model:11} timing (floats cached): analyze {rank_secs:.1f} s, "
                  f"analyze --weight-budget 4 {search_secs:.1f} s", flush=True)
        w4a8.unlink()


if __name__ == "__main__":
    main()
