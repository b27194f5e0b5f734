#!/usr/bin/env python3
"""Encoding throughput of trainrun's tokenizer against Hugging Face `tokenizers` (PyPI), in the
same run on the same corpus (tests/tokenizer_corpus.py: ~2.9 MB of prose, code, JSON, 40+
languages, emoji, whitespace runs).

    $TRAINRUN_VENV/bin/python bench/tokenizer.py [--tokenizer DIR]... [--trainrun build/bin/trainrun]
                                                 [--repeat 3] [--threads N]

Single thread: tokenizers' Tokenizer.encode per text vs `trainrun encode --jsonl --threads 1`;
all threads: tokenizers' encode_batch (Rayon, all cores) vs `--threads N` (default all cores).
Both sides time encoding only (not loading the file, not reading or printing), each from a
fresh tokenizer (cold word cache), best of --repeat. Prints MB/s and the ratio trainrun / HF.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import tokenizer_corpus  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def ours(trainrun, d, payload, threads):
    p = subprocess.run([trainrun, "encode", "--tokenizer", d, "--jsonl", "--stats", "--threads", str(threads)],
                       input=payload, capture_output=True, check=True)
    m = re.search(r"in ([0-9.e+-]+) s", p.stderr.decode())
    return float(m.group(1))


def hf(d, docs, batch):
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    t0 = time.perf_counter()
    if batch:
        tok.encode_batch(docs)
    else:
        for x in docs:
            tok.encode(x)
    return time.perf_counter() - t0


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
        hf1 = min(hf(d, docs, False) for _ in range(a.repeat))
        us1 = min(ours(a.trainrun, d, payload, 1) for _ in range(a.repeat))
        os.environ["RAYON_NUM_THREADS"] = str(a.threads)
        hfn = min(hf(d, docs, True) for _ in range(a.repeat))
        usn = min(ours(a.trainrun, d, payload, a.threads) for _ in range(a.repeat))
        name = os.path.basename(os.path.normpath(d))
        print(f"{name:10} {mb / hf1:10.2f} {mb / us1:11.2f} {hf1 / us1:5.2f}x {mb / hfn:10.2f} {mb / usn:10.2f} {hfn / usn:5.2f}x")


if __name__ == "__main__":
    main()
