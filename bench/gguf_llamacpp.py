#!/usr/bin/env python3
"""llama.cpp itself on `trainrun export --format gguf` (issue 49): SmolLM2-135M-Instruct exported
as f32, f16 and q8_0, loaded by llama.cpp (PyPI llama-cpp-python, built from source into its
own venv by this script the first time: about 10-15 minutes on 2 cores, too slow for CI), and
decoded greedily from the same prompt token ids as `trainrun generate` on 8 prompts. Prints,
per type, how many prompts give the same first N tokens, the prompt tokenizations compared
(llama.cpp's tokenizer reading the GGUF's vocabulary and merges against trainrun's), and the
first position where they part.

  python bench/gguf_llamacpp.py [--tokens 16] [--types f32,f16,q8_0]

Needs build/bin/trainrun and build/cache/smollm2-135m-instruct (scripts/prepare-smollm2-sft).
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "import numpy as np\n\nx = np.",
    "Photosynthesis is the process by which",
    "1, 2, 3, 5, 8, 13,",
]


def llama_venv():
    """The venv with llama-cpp-python (built from its sdist: PyPI carries no Linux wheel)."""
    venv = os.environ.get("TRAINRUN_LLAMACPP_VENV", os.path.join(ROOT, ".venv-llamacpp"))
    py = os.path.join(venv, "bin", "python")
    if os.path.exists(py) and subprocess.run([py, "-c", "import llama_cpp"], capture_output=True).returncode == 0:
        return py
    print(f"gguf_llamacpp: building {LLAMA_CPP_PYTHON} into {venv} (10-15 minutes the first time)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2),
               CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF")
    subprocess.run([py, "-m", "pip", "install", "-q", LLAMA_CPP_PYTHON], check=True, env=env)
    return py


# Runs inside the llama.cpp venv: greedy decoding from given prompt ids, argmax of the logits.
DECODE = r"""
import json, sys
import numpy as np
from llama_cpp import Llama
path, n, prompts = sys.argv[1], int(sys.argv[2]), json.loads(sys.stdin.read())
llm = Llama(model_path=path, n_ctx=256, n_threads=2, logits_all=True, verbose=False)
out = []
for text, ids in prompts:
    mine = llm.tokenize(text.encode(), add_bos=False, special=False)
    llm.reset()
    llm.eval(ids)
    gen = []
    for _ in range(n):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        gen.append(t)
        llm.eval([t])
    out.append({"tokenized": mine, "ids": gen})
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--types", default="f32,f16,q8_0")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench-gguf"))
    a = ap.parse_args()
    tr = os.path.join(ROOT, "build", "bin", "trainrun")
    model = os.path.join(ROOT, "build", "cache", "smollm2-135m-instruct")
    os.makedirs(a.work, exist_ok=True)
    args = [tr, "generate", "--model", model, "--max-new-tokens", str(a.tokens), "--jsonl", "--threads", "2"]
    for p in PROMPTS:
        args += ["--prompt", p]
    # No EOS stop inside the compared tokens: --min-new-tokens keeps decoding as llama.cpp does here.
    args += ["--min-new-tokens", str(a.tokens)]
    ours = [json.loads(l) for l in subprocess.run(args, check=True, capture_output=True, text=True).stdout.splitlines() if l.startswith("{")]
    py = llama_venv()
    for typ in a.types.split(","):
        path = os.path.join(a.work, f"smollm2-{typ}.gguf")
        if os.path.exists(path):
            os.remove(path)
        subprocess.run([tr, "export", model, "--format", "gguf", "--type", typ, "--output", path], check=True,
                       capture_output=True)
        res = json.loads(subprocess.run([py, "-c", DECODE, path, str(a.tokens)], check=True, capture_output=True, text=True,
                                        input=json.dumps([[o["prompt"], o["prompt_ids"]] for o in ours])).stdout)
        same_tok = sum(r["tokenized"] == o["prompt_ids"] for r, o in zip(res, ours))
        same = 0
        parts = []
        for r, o in zip(res, ours):
            k = next((i for i, (x, y) in enumerate(zip(r["ids"], o["ids"])) if x != y), None)
            same += k is None
            parts.append(str(k) if k is not None else "=")
        print(f"{typ}: {same}/{len(ours)} prompts give trainrun's first {a.tokens} tokens in llama.cpp "
              f"(first differing position per prompt: {' '.join(parts)}); prompt tokenization equal "
              f"{same_tok}/{len(ours)}")


if __name__ == "__main__":
    main()
