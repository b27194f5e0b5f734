#!/usr/bin/python3
"""Checks <run_dir>/runtime/rank-N.json (what each rank read back from LibTorch, OpenBLAS and
the kernel) against the CPU-runtime rules, computed here independently of trainrun.

usage: cpu_runtime_check.py auto <run_dir> <ranks>        threads = auto, pin = true
       cpu_runtime_check.py defaults <run_dir> <ranks>    threads 0, blas_threads 0, pin false
       cpu_runtime_check.py threads <run_dir> <ranks> N   intra-op threads N on every rank
       cpu_runtime_check.py kernel <run_dir> <ranks> NAME every rank runs OpenBLAS kernel NAME
       cpu_runtime_check.py corename <run_dir>            prints rank 0's kernel
       cpu_runtime_check.py best                          prints the best OpenBLAS kernel for
                                                          this CPU's flags ("" without AVX)
       cpu_runtime_check.py auto_kernel OWN RUNS_BEST     prints the kernel "auto" must run when
                                                          OpenBLAS picks OWN by itself and this
                                                          OpenBLAS runs the best kernel (1) or not
"""
import json, math, os, sys


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def quota_cores():
    """The cgroup CPU quota in cores (0 = none): v2 cpu.max, else v1 cfs quota/period."""
    v2 = v1 = ""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrl, path = line.rstrip("\n").split(":", 2)
            if ctrl == "":
                v2 = path
            if "cpu" in ctrl.split(","):
                v1 = path
    for d in ("/sys/fs/cgroup" + v2, "/sys/fs/cgroup"):
        try:
            q, p = open(d + "/cpu.max").read().split()
            return 0.0 if q == "max" else float(q) / float(p)
        except (OSError, ValueError):
            pass
    for root in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):
        for d in (root + v1, root):
            try:
                q = int(open(d + "/cpu.cfs_quota_us").read())
                p = int(open(d + "/cpu.cfs_period_us").read())
                return q / p if q > 0 and p > 0 else 0.0
            except (OSError, ValueError):
                pass
    return 0.0


def ranks(run_dir, n, quiet=False):
    out = []
    for r in range(n):
        path = os.path.join(run_dir, "runtime", "rank-%d.json" % r)
        if not os.path.exists(path):
            fail(path + " is missing")
        out.append(json.load(open(path)))
    extra = os.path.join(run_dir, "runtime", "rank-%d.json" % n)
    if os.path.exists(extra):
        fail("%s exists: more ranks than %d" % (extra, n))
    for r in [] if quiet else out:
        print("rank %d: intra-op %d, inter-op %d, BLAS %d (%s), CPUs %s, %d of %d threads elsewhere"
              % (r["rank"], r["intra_op_threads"], r["inter_op_threads"], r["blas"]["threads"],
                 r["blas"]["corename"], r["affinity"], r["threads_elsewhere"], r["threads_total"]))
    return out


# OpenBLAS kernel names by vector ISA tier, as OPENBLAS_CORETYPE takes them.
TIERS = {4: ["SkylakeX", "Cooperlake", "SapphireRapids"], 3: ["Haswell", "Zen"],
         2: ["Sandybridge", "Bulldozer", "Piledriver", "Steamroller", "Excavator"],
         1: ["Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Katmai",
             "Coppermine", "Northwood", "Banias", "Opteron", "Opteron_SSE3", "Barcelona",
             "Bobcat", "Nano", "Athlon"]}


def tier(name):
    for t, names in TIERS.items():
        if name.lower() in (n.lower() for n in names):
            return t
    return 0


def best_kernel():
    """The best kernel for this CPU, from /proc/cpuinfo's flags (not from trainrun)."""
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= flags:
        return "Cooperlake" if "avx512_bf16" in flags else "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return "Sandybridge" if "avx" in flags else ""


def main():
    if sys.argv[1] == "best":
        print(best_kernel())
        return
    if sys.argv[1] == "auto_kernel":
        own, runs_best, best = sys.argv[2], sys.argv[3] == "1", best_kernel()
        known = tier(own) > 0
        print(best if known and best and runs_best and tier(own) < tier(best) else own)
        return
    mode, run_dir = sys.argv[1], sys.argv[2]
    if mode == "corename":
        print(ranks(run_dir, 1, quiet=True)[0]["blas"]["corename"])
        return
    n = int(sys.argv[3])
    rs = ranks(run_dir, n)
    mask = sorted(os.sched_getaffinity(0))
    usable = len(mask)
    q = quota_cores()
    if q > 0:
        usable = max(1, min(usable, math.floor(q)))
    for r in rs:
        if not r["blas"]["openblas"]:
            fail("rank %d: OpenBLAS not found in the process" % r["rank"])
        if r["threads_elsewhere"] != 0:
            fail("rank %d: %d threads have another affinity mask than the main thread"
                 % (r["rank"], r["threads_elsewhere"]))
    if mode == "auto":
        share = max(1, usable // n)
        k = len(mask) // n
        seen = set()
        for r in rs:
            lr = r["local_rank"]
            if r["intra_op_threads"] != share or r["inter_op_threads"] != share:
                fail("rank %d: intra-op/inter-op %d/%d, expected %d (%d usable cores / %d ranks)"
                     % (r["rank"], r["intra_op_threads"], r["inter_op_threads"], share, usable, n))
            if r["blas"]["threads"] != 1:
                fail("rank %d: BLAS threads %d, expected 1" % (r["rank"], r["blas"]["threads"]))
            want = mask[lr * k:(lr + 1) * k] if len(mask) >= n else mask
            if r["affinity"] != want:
                fail("rank %d: affinity %s, expected %s" % (r["rank"], r["affinity"], want))
            if len(mask) >= n and seen & set(r["affinity"]):
                fail("rank %d shares CPUs %s with another rank" % (r["rank"], seen & set(r["affinity"])))
            seen |= set(r["affinity"])
    elif mode == "defaults":
        for r in rs:
            if r["affinity"] != mask:
                fail("rank %d: affinity %s, expected the whole mask %s (pin = false)"
                     % (r["rank"], r["affinity"], mask))
            # OpenBLAS's own default is one thread per CPU it sees; 1 would mean trainrun set it.
            if len(mask) > 1 and r["blas"]["threads"] == 1:
                fail("rank %d: BLAS threads 1 although blas_threads = 0 (library default)" % r["rank"])
    elif mode == "threads":
        want = int(sys.argv[4])
        for r in rs:
            if r["intra_op_threads"] != want:
                fail("rank %d: intra-op %d, expected %d" % (r["rank"], r["intra_op_threads"], want))
    elif mode == "kernel":
        want = sys.argv[4]
        for r in rs:
            if r["blas"]["corename"].lower() != want.lower():
                fail("rank %d: OpenBLAS kernel %s, expected %s" % (r["rank"], r["blas"]["corename"], want))
    else:
        fail("unknown mode " + mode)
    print("checked: %s, %d rank(s), mask %s, usable cores %d" % (mode, n, mask, usable))


main()
