#!/usr/bin/env python3
"""Seeds fuzz/corpus/<target>/ from the files the project already has: the shipped configs,
the hostile corpus under tests/hostile/ (valid controls included) and, for `export`, each export
directory packed as the target expects (u32 length of model.json, model.json, model.safetensors).
Standard library only: `python3 fuzz/seed_corpus.py`."""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
HOSTILE = os.path.join(ROOT, "tests", "hostile")


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name.replace(os.sep, "_")), "wb") as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


for base, _, files in os.walk(os.path.join(ROOT, "configs")):
    for f in files:
        if f.endswith(".toml"):
            data = read(os.path.join(base, f))
            put("policy", f, data)
            put("run_config", f, data)
for target, sub in [("policy", "policy"), ("run_config", "run"), ("inferable_json", "inferable"),
                    ("safetensors_header", "checkpoint")]:
    d = os.path.join(HOSTILE, sub)
    for f in sorted(os.listdir(d)):
        put(target, f, read(os.path.join(d, f)))
exports = os.path.join(HOSTILE, "export")
for name in sorted(os.listdir(exports)):
    d = os.path.join(exports, name)
    meta = read(os.path.join(d, "model.json")) if os.path.exists(os.path.join(d, "model.json")) else b""
    st = read(os.path.join(d, "model.safetensors")) if os.path.exists(os.path.join(d, "model.safetensors")) else b""
    put("export", name, struct.pack("<I", len(meta)) + meta + st)
    if st:
        put("safetensors_header", name + ".safetensors", st)
print("seeded", os.path.join(HERE, "corpus"))
