#!/usr/bin/python3
"""The single-process gpt training step of trainrun built against Debian's LibTorch 1.13 (build/)
vs the same source built against the torch wheel's LibTorch 2.x (build-pip/), in one run.

Both binaries run bench/jobs/gpt.toml (4 layers, 4 heads, n_embd 128, block 128, batch 16, fp32,
AdamW) with the same steps, threads and seed. On 2.x the gpt's attention is
at::scaled_dot_product_attention (sdk trainrun/model/attention.hpp), on 1.13 the explicit matmul +
masked softmax; everything else differs only by what the two LibTorch builds do (their BLAS: 1.13
uses Debian's OpenBLAS, the wheel its bundled MKL). Step time is the median over the steps after
`warmup`; the two builds alternate which goes first, `--rounds` times, and the median round of
each is reported with the ratio (> 1: 2.x is faster) and the load average before and after.

usage: bench/libtorch_versions.py [--old build/bin/trainrun] [--new build-pip/bin/trainrun]
                                  [--rounds 5] [--steps 60] [--warmup 10] [--threads 2]
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from single_vs_pytorch import ROOT, trainrun_step_time  # noqa: E402


def version_line(binary):
    return subprocess.run([binary, "--version"], check=True, stdout=subprocess.PIPE,
                          text=True).stdout.strip().splitlines()[0]


def blas_of(run_dir):
    """What rank 0 reported about its BLAS (runtime/rank-0.json), or '?'."""
    try:
        blas = json.load(open(os.path.join(run_dir, "runtime", "rank-0.json"))).get("blas", {})
    except (OSError, ValueError):
        return "?"
    if not blas.get("openblas"):
        return "not OpenBLAS"
    return "OpenBLAS " + (blas.get("corename") or "?")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", default=os.path.join(ROOT, "build", "bin", "trainrun"))
    ap.add_argument("--new", default=os.path.join(ROOT, "build-pip", "bin", "trainrun"))
    ap.add_argument("--model", default="gpt")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    sides = {"old": a.old, "new": a.new}
    for name, binary in sides.items():
        print(f"{name}: {version_line(binary)}")
    load0 = os.getloadavg()
    times = {"old": [], "new": []}
    runs = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as work:
        for r in range(a.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for name in order:
                times[name].append(trainrun_step_time(sides[name], a.model, a.steps, a.warmup,
                                                      a.batch, a.threads, work, runs[name]))
            print(f"round {r + 1}: step {times['old'][-1] * 1e3:.2f} ms (old) "
                  f"{times['new'][-1] * 1e3:.2f} ms (new)", flush=True)
        blas = {name: blas_of(runs[name][0]) for name in sides}
    load1 = os.getloadavg()
    old, new = statistics.median(times["old"]), statistics.median(times["new"])
    print(f"{a.model}, batch {a.batch}, {a.threads} threads, {a.steps} steps (first {a.warmup} "
          f"not timed), median of {a.rounds} alternating rounds")
    print(f"old: {old * 1e3:.2f} ms/step ({a.batch / old:.0f} samples/s), BLAS {blas['old']}")
    print(f"new: {new * 1e3:.2f} ms/step ({a.batch / new:.0f} samples/s), BLAS {blas['new']}")
    print(f"ratio old/new step time: {old / new:.3f} (> 1: the 2.x build is faster)")
    print("load average (1, 5, 15 min) before %.2f %.2f %.2f, after %.2f %.2f %.2f"
          % (load0 + load1))


if __name__ == "__main__":
    sys.exit(main())
