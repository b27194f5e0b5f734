#!/usr/bin/python3
"""Collective bandwidth of trainrun's backends against MPICH's own MPI_Allreduce and one core's
memcpy, measured in the same run on this machine.

    bench/collectives.py [--nproc 2] [--sizes 4K:256M] [--iters 20] [--warmup 5] [--ops all]
                         [--repeat 1] [--stat mean]

Runs `trainrun bench collectives` for gloo-cpu and mpi (nccl-tests columns: time, algbw, busbw
and a correctness check per row), the SDK's ring all-reduce (`--algo ring`, the `ring`
strategy's algorithm) over gloo-cpu's send/recv with shared memory and over plain TCP
(`shm = false`) and over mpi's send/recv, then bench/collectives_ref.c under mpiexec for the
references, and prints one all-reduce table with the ratios, plus the other operations' tables
as measured. --repeat K runs the all-reduce measurements K times in rounds (every column once
per round, so a noisy moment hits all of them alike) and reports each column's median.
--stat median (or min) times every iteration on its own in every column, MPICH's included, and
reports the median (minimum) iteration instead of the loop's mean: on a shared VM whose
hypervisor steals the CPU in bursts (the steal line below says how much), the mean carries the
bursts and the median of short iterations mostly does not.
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


def cpu_times():
    """The machine's CPU time split so far (/proc/stat's first line), or None off Linux."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None


def steal_share(before, after):
    """Percent of the CPU time between two cpu_times() that the hypervisor gave to others
    (steal) and that stood idle. On a shared VM a run with much steal says little about either
    side of a ratio: every column, MPICH's included, slows by a varying amount."""
    if not before or not after or len(before) < 8:
        return None
    d = [b - a for a, b in zip(before, after)]
    total = sum(d) or 1
    return 100.0 * d[7] / total, 100.0 * d[3] / total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--sizes", default="4K:256M")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--ops", default="all")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--stat", choices=["mean", "median", "min"], default="mean")
    ap.add_argument("--build", default=os.environ.get("TRAINRUN_BUILD_DIR", os.path.join(ROOT, "build")))
    a = ap.parse_args()
    trainrun = os.path.join(a.build, "bin", "trainrun")
    first, last = (size_bytes(s) for s in a.sizes.split(":"))
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

    ref_bin = os.path.join(a.build, "bench", "collectives_ref")
    os.makedirs(os.path.dirname(ref_bin), exist_ok=True)
    run(["mpicc", "-O2", "-o", ref_bin, os.path.join(ROOT, "bench", "collectives_ref.c")])
    rings = {"ring-shm": ["--backend", "gloo-cpu"],
             "ring-tcp": ["--backend", "gloo-cpu", "--set", "accelerator.shm=false"],
             "ring-mpi": ["--backend", "mpi"]}
    common = ["--nproc", str(a.nproc), "--sizes", a.sizes, "--iters", str(a.iters),
              "--warmup", str(a.warmup), "--stat", a.stat, "--set", "accelerator.threads=1"]

    # rounds[k][column] = {size: (busbw, check)}
    rounds = []
    shares = []  # (steal %, idle %) per round
    for k in range(max(1, a.repeat)):
        t0 = cpu_times()
        cols = {}
        for backend in ("gloo-cpu", "mpi"):
            # The first round times every operation (its tables are printed); later rounds
            # only the all-reduce.
            ops = a.ops if k == 0 else "allreduce"
            out = run([trainrun, "bench", "collectives", "--backend", backend, "--op", ops, *common],
                      env=env)
            if k == 0:
                print(re.sub(r"^\[rank 0\] ", "", out, flags=re.M).rstrip())
                print()
            cols[backend] = {r[0]: (r[3], r[4]) for r in parse_table(out).get("allreduce", [])}
        for name, args in rings.items():
            out = run([trainrun, "bench", "collectives", *args, "--algo", "ring", "--op",
                       "allreduce", *common], env=env)
            cols[name] = {r[0]: (r[3], r[4]) for r in parse_table(out).get("allreduce", [])}
        ref, mem = {}, {}
        for line in run(["mpiexec", "-n", str(a.nproc), ref_bin, str(first), str(last),
                         str(a.iters), str(a.warmup), a.stat], env=env).splitlines():
            f = line.split()
            if len(f) == 4:
                ref[int(f[0])] = (float(f[2]), "ok")
                mem[int(f[0])] = (float(f[3]), "ok")
        cols["MPICH"], cols["memcpy"] = ref, mem
        rounds.append(cols)
        shares.append(steal_share(t0, cpu_times()))

    def median(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])

    names = ["gloo-cpu", "mpi", "ring-shm", "ring-tcp", "ring-mpi", "MPICH", "memcpy"]
    sizes = sorted(set.intersection(*(set(c) for r in rounds for c in r.values())))
    how = f"median of {len(rounds)} rounds" if len(rounds) > 1 else "same run"
    if a.stat != "mean":
        how += f", each the {a.stat} of {a.iters} iterations timed one by one"
    print(f"# all-reduce float32 sum, {a.nproc} ranks: busbw (GB/s) and ratios to MPICH's "
          f"MPI_Allreduce and to one core's memcpy ({how})")
    hdr = ["size(B)", *names, "gloo/MPICH", "mpi/MPICH", "shm/MPICH", "tcp/gloo", "gloo/memcpy",
           "checks"]
    print("".join(f"{h:>12}" for h in hdr))
    for size in sizes:
        v = {n: median([r[n][size][0] for r in rounds]) for n in names}
        checks = "ok" if all(r[n][size][1] == "ok" for r in rounds for n in names) else "FAIL"
        row = [size, *(v[n] for n in names), v["gloo-cpu"] / v["MPICH"], v["mpi"] / v["MPICH"],
               v["ring-shm"] / v["MPICH"], v["ring-tcp"] / v["gloo-cpu"], v["gloo-cpu"] / v["memcpy"]]
        print(f"{row[0]:>12}" + "".join(f"{x:>12.3f}" for x in row[1:]) + f"{checks:>12}")
    if len(rounds) > 1:
        print(f"# shm/MPICH per round: " + "; ".join(
            f"{size >> 10} KiB " + " ".join(f"{r['ring-shm'][size][0] / r['MPICH'][size][0]:.2f}"
                                            for r in rounds)
            for size in sizes if size >= 1 << 20))
    if all(shares):
        print("# CPU time stolen by the hypervisor / idle, per round: " +
              "; ".join(f"{st:.1f}% / {idle:.0f}%" for st, idle in shares) +
              " (more than a few percent of steal: the ratios of that round are noise)")

if __name__ == "__main__":
    main()
