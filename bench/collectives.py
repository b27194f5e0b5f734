#!/usr/bin/python3
"""Collective bandwidth of trainrun's backends against MPICH's own MPI_Allreduce and one core's
memcpy, measured in the same run on this machine.

    bench/collectives.py [--nproc 2] [--sizes 4K:256M] [--iters 20] [--warmup 5] [--ops all]

Runs `trainrun bench collectives` for gloo-cpu and mpi (nccl-tests columns: time, algbw, busbw
and a correctness check per row), the SDK's ring all-reduce (`--algo ring`, the `ring`
strategy's algorithm) over gloo-cpu's send/recv with shared memory and over plain TCP
(`shm = false`) and over mpi's send/recv, then bench/collectives_ref.c under mpiexec for the
references, and prints one all-reduce table with the ratios, plus the other operations' tables
as measured.
Needs the build (scripts/test or scripts/run builds it) and the mpich package (mpicc, mpiexec).
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def size_bytes(text):
    m = re.fullmatch(r"(\d+)\s*([KMG]?)(i?B)?", text.strip(), re.I)
    if not m:
        sys.exit(f"bad size {text!r}")
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]


def run(cmd, **kw):
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-4000:] + p.stderr[-4000:])
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return p.stdout


def parse_table(text):
    """{op: [(bytes, time_us, algbw, busbw, check)]} from `trainrun bench collectives` output."""
    tables, op = {}, None
    for line in text.splitlines():
        line = re.sub(r"^\[rank \d+\] ", "", line)  # the launcher's prefix
        m = re.match(r"# (\w+)(?: \(ring[^)]*\))? on ", line)
        if m:
            op = m.group(1)
            tables[op] = []
            continue
        f = line.split()
        if op and len(f) >= 7 and f[0].isdigit():
            tables[op].append((int(f[0]), float(f[3]), float(f[4]), float(f[5]), " ".join(f[6:])))
    return tables


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--sizes", default="4K:256M")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--ops", default="all")
    ap.add_argument("--build", default=os.environ.get("TRAINRUN_BUILD_DIR", os.path.join(ROOT, "build")))
    a = ap.parse_args()
    trainrun = os.path.join(a.build, "bin", "trainrun")
    first, last = (size_bytes(s) for s in a.sizes.split(":"))
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

    results = {}
    for backend in ("gloo-cpu", "mpi"):
        out = run([trainrun, "bench", "collectives", "--backend", backend, "--nproc", str(a.nproc),
                   "--op", a.ops, "--sizes", a.sizes, "--iters", str(a.iters),
                   "--warmup", str(a.warmup), "--set", "accelerator.threads=1"], env=env)
        results[backend] = parse_table(out)
        print(re.sub(r"^\[rank 0\] ", "", out, flags=re.M).rstrip())
        print()

    rings = {"ring-shm": ["--backend", "gloo-cpu"],
             "ring-tcp": ["--backend", "gloo-cpu", "--set", "accelerator.shm=false"],
             "ring-mpi": ["--backend", "mpi"]}
    for name, args in rings.items():
        out = run([trainrun, "bench", "collectives", *args, "--algo", "ring", "--nproc",
                   str(a.nproc), "--op", "allreduce", "--sizes", a.sizes, "--iters", str(a.iters),
                   "--warmup", str(a.warmup), "--set", "accelerator.threads=1"], env=env)
        results[name] = parse_table(out)

    ref_bin = os.path.join(a.build, "bench", "collectives_ref")
    os.makedirs(os.path.dirname(ref_bin), exist_ok=True)
    run(["mpicc", "-O2", "-o", ref_bin, os.path.join(ROOT, "bench", "collectives_ref.c")])
    ref = {}
    for line in run(["mpiexec", "-n", str(a.nproc), ref_bin, str(first), str(last), str(a.iters),
                     str(a.warmup)], env=env).splitlines():
        f = line.split()
        if len(f) == 4:
            ref[int(f[0])] = (float(f[1]), float(f[2]), float(f[3]))

    print(f"# all-reduce float32 sum, {a.nproc} ranks: busbw (GB/s) and ratios to MPICH's "
          f"MPI_Allreduce and to one core's memcpy (same run)")
    hdr = ["size(B)", "gloo-cpu", "mpi", "ring-shm", "ring-tcp", "ring-mpi", "MPICH", "memcpy",
           "gloo/MPICH", "mpi/MPICH", "shm/MPICH", "tcp/gloo", "gloo/memcpy", "checks"]
    print("".join(f"{h:>12}" for h in hdr))
    cols = {k: {r[0]: r for r in results[k].get("allreduce", [])}
            for k in ("gloo-cpu", "mpi", "ring-shm", "ring-tcp", "ring-mpi")}
    for size in sorted(ref):
        if any(size not in c for c in cols.values()):
            continue
        g, m = cols["gloo-cpu"][size][3], cols["mpi"][size][3]
        rs, rt, rm = (cols[k][size][3] for k in ("ring-shm", "ring-tcp", "ring-mpi"))
        _, mb, cp = ref[size]
        checks = "ok" if all(c[size][4] == "ok" for c in cols.values()) else "FAIL"
        row = [size, g, m, rs, rt, rm, mb, cp, g / mb, m / mb, rs / mb, rt / g, g / cp]
        print(f"{row[0]:>12}" + "".join(f"{v:>12.3f}" for v in row[1:]) + f"{checks:>12}")


if __name__ == "__main__":
    main()
