#!/usr/bin/python3
"""trainrun's per-rank CPU runtime ([accelerator] threads/blas_threads/pin, [launch] blas_coretype)
left at its defaults ("auto") vs every rank left at the libraries' own defaults, in one run:

  models   mlp, cnn and gpt of bench/jobs/{mlp,cnn,gpt}.toml;
  layouts  single: one process, strategy single, accelerator cpu (bench/jobs/<model>.toml);
           ddp: 2 ranks on this node, gloo-cpu (bench/jobs/ddp-<model>.toml), same model and
           global batch as single (checked from the resolved job.toml; a difference is printed);
  configs  auto:     accelerator.threads=auto, accelerator.blas_threads=auto, accelerator.pin=true,
                     launch.blas_coretype=auto (trainrun's defaults: LibTorch intra-/inter-op
                     threads = usable cores / local ranks, OpenBLAS 1 thread, each local rank
                     pinned to its own CPUs, a better OpenBLAS kernel when the loaded one is of a
                     lower ISA tier);
           defaults: accelerator.threads=0, accelerator.blas_threads=0, accelerator.pin=false,
                     launch.blas_coretype=off (every pool as LibTorch and OpenBLAS size it, no
                     pinning, OpenBLAS's own kernel).
  Both configs are set explicitly on the command line, so the jobs' own [accelerator] threads
  (1 in the ddp jobs, 2 in gpt.toml) do not leak into either side.

Step time is the median over the steps after `--warmup` of rank 0's step_time_s in
<run_dir>/metrics.jsonl (as bench/ddp.py); samples/s = global batch / step time, tokens/s (gpt) =
samples/s x block_size. Each configuration runs `--rounds` times, auto first on odd rounds and
defaults first on even ones, and the round with the median step time is reported; the table's
auto/defaults is the ratio of those two. The runtime each side actually ran with (intra-/inter-op
threads, BLAS threads and kernel, affinity of every rank) is read back from the reported round's
<run_dir>/runtime/rank-N.json and printed under the table.

Caveats: OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS, MKL_NUM_THREADS and
OPENBLAS_CORETYPE are removed from the environment of every run, so "defaults" means the
libraries' defaults, not this shell's. Where OpenBLAS already picks a kernel of this CPU's best
ISA tier, blas_coretype=auto changes nothing and the read-back shows the same kernel on both
sides. The figures are only as good as the machine is quiet: 2 ranks, or one process with
threads=auto, fill every core, so anything else running skews them; the load average is printed
before and after.

usage: bench/cpu_runtime.py <trainrun binary> [--only mlp,cnn,gpt] [--layouts single,ddp]
       [--steps N] [--gpt-steps N] [--rounds R] [--warmup N] [--set KEY=VALUE]...
       [--defaults-env KEY=VALUE]...
"""
import argparse, json, os, signal, statistics, subprocess, sys, tempfile, time, tomllib

sys.dont_write_bytecode = True  # no bench/__pycache__ from the import below
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp import alternate  # the same alternating rounds as bench/ddp.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = os.path.join(ROOT, "bench", "jobs")
MODELS = ("mlp", "cnn", "gpt")
LAYOUTS = ("single", "ddp")

CONFIGS = {
    "auto": ["accelerator.threads=auto", "accelerator.blas_threads=auto", "accelerator.pin=true",
             "launch.blas_coretype=auto"],
    "defaults": ["accelerator.threads=0", "accelerator.blas_threads=0", "accelerator.pin=false",
                 "launch.blas_coretype=off"],
}
# The layout is pinned down explicitly too: mlp.toml and cnn.toml rely on the built-in defaults
# for strategy and accelerator, and a changed default would silently change what is compared.
LAYOUT_SETS = {
    "single": ["launch.nproc_per_node=1", "strategy.plugin=single", "accelerator.plugin=cpu"],
    "ddp": ["launch.nproc_per_node=2", "strategy.plugin=ddp", "accelerator.plugin=gloo-cpu"],
}
# These would override what either side asks for (or what the libraries pick by default), so
# neither side inherits them from the shell the bench runs in.
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "MKL_NUM_THREADS",
              "OPENBLAS_CORETYPE")
# A hung gloo rendezvous would otherwise block the bench for [accelerator] timeout_s.
RUN_TIMEOUT_S = 600
EXTRA_SETS = []  # --set of the command line: added to every run
DEFAULTS_ENV = {}  # --defaults-env: added to the environment of the defaults side only


def job_name(model, layout):
    return model if layout == "single" else f"ddp-{model}"


def tail(text, lines=30):
    return "\n".join(text.rstrip().splitlines()[-lines:])


def fail(cmd, why, out, err, run_dir):
    sys.stderr.write(f"\ntrainrun failed ({why}): {' '.join(cmd)}\n")
    if err.strip():
        sys.stderr.write("--- stderr (tail)\n" + tail(err) + "\n")
    if out.strip():
        sys.stderr.write("--- stdout (tail)\n" + tail(out, 15) + "\n")
    # Per-rank logs live in the temporary run dir, which is gone once the bench exits.
    logs = os.path.join(run_dir, "logs")
    if os.path.isdir(logs):
        for name in sorted(os.listdir(logs)):
            with open(os.path.join(logs, name), errors="replace") as f:
                sys.stderr.write(f"--- {name} (tail)\n" + tail(f.read(), 15) + "\n")
    sys.exit(1)


def run(binary, model, layout, config, steps, warmup, work):
    """One trainrun run; rank 0's median step time, the resolved job and every rank's read-back."""
    job = job_name(model, layout)
    run_dir = tempfile.mkdtemp(prefix=f"{job}-{config}-", dir=work)
    cmd = [binary, "--config", os.path.join(JOBS, f"{job}.toml"),
           "--set", f"trainer.max_steps={steps}", "--set", f"trainer.run_dir={run_dir}",
           "--set", "trainer.save_final_model=false"]
    for s in LAYOUT_SETS[layout] + CONFIGS[config] + EXTRA_SETS:
        cmd += ["--set", s]
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV}
    if config == "defaults":
        env.update(DEFAULTS_ENV)
    # Own session: on a timeout the whole launcher + ranks group is killed, not just the launcher.
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        fail(cmd, f"no exit after {RUN_TIMEOUT_S} s", out, err, run_dir)
    if p.returncode != 0:
        fail(cmd, f"exit status {p.returncode}", out, err, run_dir)
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            rows = [json.loads(l) for l in f if l.strip()]
        with open(os.path.join(run_dir, "job.toml"), "rb") as f:
            resolved = tomllib.load(f)
        rt_dir = os.path.join(run_dir, "runtime")
        ranks = []
        for name in os.listdir(rt_dir):
            if name.startswith("rank-") and name.endswith(".json"):
                with open(os.path.join(rt_dir, name)) as f:
                    ranks.append(json.load(f))
        ranks.sort(key=lambda r: r["rank"])
    except (OSError, ValueError, KeyError) as e:
        fail(cmd, f"unreadable output: {e!r}", out, err, run_dir)
    rows = [r for r in rows if "step_time_s" in r and r.get("rank", 0) == 0]
    if len(rows) != steps:
        fail(cmd, f"{len(rows)} step rows of rank 0 in metrics.jsonl, expected {steps}", out, err,
             run_dir)
    return {"step": statistics.median(r["step_time_s"] for r in rows[warmup:]),
            "resolved": resolved, "ranks": ranks}


def median_round(results):
    """The round whose step time is the median (odd rounds: exact; even: the lower middle)."""
    ranked = sorted(results, key=lambda d: d["step"])
    return ranked[(len(ranked) - 1) // 2]


def cpu_ranges(cpus):
    if not cpus:
        return "?"
    cpus, parts, start = sorted(cpus), [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            parts.append(str(start) if start == c else f"{start}-{c}")
            start = None
    return ",".join(parts)


def readback(ranks):
    def one(r):
        b = r.get("blas", {})
        kernel = b.get("corename", "?") if b.get("openblas") else "not OpenBLAS"
        return (f"rank {r['rank']}: intra-op {r.get('intra_op_threads', '?')}, inter-op "
                f"{r.get('inter_op_threads', '?')}, BLAS {b.get('threads', '?')} ({kernel}), "
                f"CPUs {cpu_ranges(r.get('affinity', []))}")
    return " | ".join(one(r) for r in ranks)


def layout_differences(single, ddp):
    """What the ddp job resolves to differently from the single one, apart from the layout."""
    diffs = []
    for table in ("model", "data", "optimizer", "precision"):
        a, b = single.get(table, {}), ddp.get(table, {})
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                diffs.append(f"{table}.{k} {a.get(k)!r} vs {b.get(k)!r}")
    for k in ("global_batch_size", "micro_batch_size", "seed", "drop_last"):
        a, b = single.get("trainer", {}).get(k), ddp.get("trainer", {}).get(k)
        if a != b:
            diffs.append(f"trainer.{k} {a!r} vs {b!r}")
    return diffs


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def runtime_banner(binary):
    """The '# runtime' lines of `trainrun check` (LibTorch build, OpenBLAS config), before any run."""
    p = subprocess.run([binary, "check", "--config", os.path.join(JOBS, "mlp.toml")] +
                       sum((["--set", s] for s in CONFIGS["defaults"]), []),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env={k: v for k, v in os.environ.items() if k not in THREAD_ENV})
    lines = p.stdout.splitlines()
    if "# runtime" not in lines:
        return "(trainrun check printed no runtime section)"
    section = lines[lines.index("# runtime") + 1:]
    # The first line is 'LibTorch ... | OpenBLAS <config>'; the rest depend on the config.
    return section[0].lstrip("# ").strip() if section else "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trainrun")
    ap.add_argument("--only", default=",".join(MODELS), help="models, comma-separated (mlp,cnn,gpt)")
    ap.add_argument("--layouts", default=",".join(LAYOUTS),
                    help="layouts, comma-separated (single,ddp)")
    ap.add_argument("--steps", type=int, default=200, help="steps per run, mlp and cnn")
    ap.add_argument("--gpt-steps", type=int, default=40, help="steps per run, gpt")
    ap.add_argument("--warmup", type=int, default=10, help="first steps of a run not timed")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="extra --set for every run (both configs), e.g. "
                         "accelerator.check_collectives=false")
    ap.add_argument("--defaults-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment of the defaults side only; OPENBLAS_CORETYPE=Prescott "
                         "reproduces a CPU that OpenBLAS does not recognise (it then runs its "
                         "generic kernels), which blas_coretype=auto would correct")
    a = ap.parse_args()
    for kv in a.defaults_env:
        if "=" not in kv:
            ap.error(f"--defaults-env {kv}: expected KEY=VALUE")
        DEFAULTS_ENV[kv.split("=", 1)[0]] = kv.split("=", 1)[1]
    models = [m for m in a.only.split(",") if m]
    layouts = [l for l in a.layouts.split(",") if l]
    for m in models:
        if m not in MODELS:
            ap.error(f"--only: unknown model {m!r} (one of {', '.join(MODELS)})")
    for l in layouts:
        if l not in LAYOUTS:
            ap.error(f"--layouts: unknown layout {l!r} (one of {', '.join(LAYOUTS)})")
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    steps_of = {m: a.gpt_steps if m == "gpt" else a.steps for m in models}
    if any(a.warmup >= s for s in steps_of.values()):
        ap.error("--warmup must be below the step counts of the models run")
    binary = os.path.abspath(a.trainrun)
    if not os.access(binary, os.X_OK):
        ap.error(f"{binary} is not an executable")
    EXTRA_SETS.extend(a.sets)

    t_start = time.time()
    usable = len(os.sched_getaffinity(0))
    print(f"CPU: {cpu_model()}; nproc {usable} (of {os.cpu_count()} online)")
    print(f"runtime: {runtime_banner(binary)}")
    print(f"median step time of rank 0 after {a.warmup} warmup steps, median of {a.rounds} "
          f"alternating rounds; {a.steps} steps per run (mlp, cnn), {a.gpt_steps} (gpt)")
    print(f"auto:     --set {' --set '.join(CONFIGS['auto'])}")
    print(f"defaults: --set {' --set '.join(CONFIGS['defaults'])}")
    if a.sets:
        print(f"both:     --set {' --set '.join(a.sets)}")
    if DEFAULTS_ENV:
        print("defaults side environment: " + " ".join(f"{k}={v}" for k, v in DEFAULTS_ENV.items()))
    before = load()
    print(f"load average before: {before}", flush=True)
    if float(before.split()[0]) >= 0.5:
        # Seen on a 2-core machine sharing its cores with a compile: threads=auto's 2 OpenMP
        # threads wait on each other at every parallel region while one is descheduled, and the
        # single-process auto side came out up to 50x slower than on a quiet machine.
        print("warning: the machine is not idle; every side that uses all cores (auto single, "
              "2-rank ddp) is slowed by it, auto single with several OpenMP threads the most")
    print(flush=True)

    hdr = (f"{'model':6} {'layout':7} {'defaults samples/s':>19} {'auto samples/s':>15} "
           f"{'auto/defaults':>14} {'defaults tokens/s':>18} {'auto tokens/s':>14}")
    print(hdr)
    print("-" * len(hdr), flush=True)
    reported = {}  # (model, layout) -> {"auto": round, "defaults": round}
    ratios = {}
    with tempfile.TemporaryDirectory(prefix="cpu_runtime-") as work:
        for m in models:
            for l in layouts:
                def side(config, m=m, l=l):
                    return lambda: run(binary, m, l, config, steps_of[m], a.warmup, work)
                auto_runs, def_runs = alternate(a.rounds, [side("auto"), side("defaults")])
                res = {"auto": median_round(auto_runs), "defaults": median_round(def_runs)}
                reported[(m, l)] = res
                trainer = res["auto"]["resolved"]["trainer"]
                batch = trainer["global_batch_size"]
                sps = {c: batch / res[c]["step"] for c in res}
                ratios[(m, l)] = sps["auto"] / sps["defaults"]
                if m == "gpt":
                    block = res["auto"]["resolved"]["data"]["block_size"]
                    tok = f"{sps['defaults'] * block:18.0f} {sps['auto'] * block:14.0f}"
                else:
                    tok = f"{'-':>18} {'-':>14}"
                print(f"{m:6} {l:7} {sps['defaults']:19.0f} {sps['auto']:15.0f} "
                      f"{ratios[(m, l)]:14.2f} {tok}", flush=True)

    print("\nglobal batch per model (the same in both layouts unless noted below): " +
          ", ".join(f"{m} {reported[(m, layouts[0])]['auto']['resolved']['trainer']['global_batch_size']}"
                    + (f" x {reported[(m, layouts[0])]['auto']['resolved']['data']['block_size']} "
                       f"tokens" if m == "gpt" else "")
                    for m in models))
    if "single" in layouts and "ddp" in layouts:
        for m in models:
            diffs = layout_differences(reported[(m, "single")]["auto"]["resolved"],
                                       reported[(m, "ddp")]["auto"]["resolved"])
            if diffs:
                print(f"note: {m} single vs ddp job differ in: {'; '.join(diffs)}")
    if "gpt" in models and "ddp" in layouts:
        ds = reported[("gpt", "ddp")]["auto"]["resolved"].get("strategy", {})
        print(f"note: gpt ddp uses bench/jobs/ddp-gpt.toml's bucket_cap_mb = "
              f"{ds.get('bucket_cap_mb')}, overlap = {str(ds.get('overlap')).lower()}")

    print("\nruntime read-back of the reported rounds (runtime/rank-N.json):")
    for l in layouts:
        for c in ("defaults", "auto"):
            # Group the models that ran with the same runtime so the usual case is one line.
            groups = {}
            for m in models:
                groups.setdefault(readback(reported[(m, l)][c]["ranks"]), []).append(m)
            for text, ms in groups.items():
                print(f"  {l:6} {c:8} {','.join(ms):11} {text}")
    if ("mlp", "single") in ratios or ("mlp", "ddp") in ratios:
        got = ", ".join(f"{l} {ratios[('mlp', l)]:.2f}" for l in layouts if ("mlp", l) in ratios)
        print(f"\nexpected: auto/defaults >= 1.8 on the mlp (got {got})")
    print(f"load average after: {load()}; total {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
