#!/usr/bin/env python3
"""Encoding throughput of trainrun's tokenizer against Hugging Face `tokenizers` (PyPI), in the
same run on the same corpus (tests/e2e/tokenizer_corpus.py: ~2.9 MB of prose, code, JSON, 40+
languages, emoji, whitespace runs).

    $TRAINRUN_VENV/bin/python bench/tokenizer.py [--tokenizer DIR]... [--trainrun build/bin/trainrun]
                                                 [--repeat 3] [--threads N]

Single thread: tokenizers' Tokenizer.encode per text with RAYON_NUM_THREADS=1 and
TOKENIZERS_PARALLELISM=false vs `trainrun encode --jsonl --threads 1`; all threads: tokenizers'
encode_batch (Rayon, N threads) vs `--threads N` (default: all cores). Both sides time encoding
only (not loading the file, not reading or printing), each in a fresh process (cold word
caches), interleaved, best of --repeat. Prints MB/s and the ratio trainrun / HF.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import tokenizer_corpus  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def ours(trainrun, d, payload, threads):
    p = subprocess.run([trainrun, "encode", "--tokenizer", d, "--jsonl", "--stats", "--threads", str(threads)],
                       input=payload, capture_output=True, check=True)
    m = re.search(r"in ([0-9.e+-]+) s", p.stderr.decode())
    return float(m.group(1))


HF_SNIPPET = r"""
import json, sys, time
from tokenizers import Tokenizer
docs = [json.loads(l)["text"] for l in sys.stdin.read().split("\n")[:-1]]
tok = Tokenizer.from_file(sys.argv[1])
t0 = time.perf_counter()
if sys.argv[2] == "batch":
    tok.encode_batch(docs)
else:
    for x in docs:
        tok.encode(x)
print(time.perf_counter() - t0)
"""


def hf(d, payload, threads):
    """Seconds tokenizers takes, in a fresh process: Rayon's pool size is fixed at first use, and
    even a single encode() fans out over it unless RAYON_NUM_THREADS says otherwise."""
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true" if threads > 1 else "false")
    p = subprocess.run([sys.executable, "-c", HF_SNIPPET, os.path.join(d, "tokenizer.json"),
                        "batch" if threads > 1 else "loop"], input=payload, capture_output=True, check=True, env=env)
    return float(p.stdout.decode().strip())


def main():
    fx = os.path.join(ROOT, "..", "shared", "fixtures", "tokenizers")
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", action="append", help="model directory (default: the three fixtures)")
    ap.add_argument("--trainrun", default=os.path.join(ROOT, "build", "bin", "trainrun"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    dirs = a.tokenizer or [os.path.join(fx, n) for n in ("llama3", "qwen3", "mistral")]
    docs = tokenizer_corpus.assemble()
    mb = sum(len(x.encode()) for x in docs) / 1e6
    payload = "".join(json.dumps({"text": x}) + "\n" for x in docs).encode()
    print(f"corpus: {len(docs)} texts, {mb:.2f} MB; {a.threads} threads for the parallel columns; best of {a.repeat}")
    print(f"{'tokenizer':10} {'HF 1 thr':>10} {'ours 1 thr':>11} {'ratio':>6} {'HF all':>10} {'ours all':>10} {'ratio':>6}   (MB/s)")
    for d in dirs:
        # Interleaved, so that a noisy moment on a shared machine hits both sides alike.
        hf1, us1, hfn, usn = [], [], [], []
        for _ in range(a.repeat):
            hf1.append(hf(d, payload, 1))
            us1.append(ours(a.trainrun, d, payload, 1))
            hfn.append(hf(d, payload, a.threads))
            usn.append(ours(a.trainrun, d, payload, a.threads))
        hf1, us1, hfn, usn = min(hf1), min(us1), min(hfn), min(usn)
        name = os.path.basename(os.path.normpath(d))
        print(f"{name:10} {mb / hf1:10.2f} {mb / us1:11.2f} {hf1 / us1:5.2f}x {mb / hfn:10.2f} {mb / usn:10.2f} {hfn / usn:5.2f}x")


if __name__ == "__main__":
    main()
