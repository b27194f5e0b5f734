#!/usr/bin/python3
"""The sharded strategies — ZeRO stages 1-3 (`zero`) and every FSDP sharding strategy (`fsdp`) —
against `ddp` on the gpt of bench/jobs/sharded-gpt.toml (that of bench/jobs/ddp-gpt.toml: (4 layers,
n_embd 128, ~0.8 M parameters, AdamW, fp32, gloo-cpu, 1 intra-op thread per rank):

  (a) step time at 2 ranks: median step_time_s of rank 0 after --warmup steps, for ddp (1 MiB
      buckets, overlap on) and zero stages 1, 2, 3 (reduce buckets of 262144 elements = 1 MiB,
      overlap on; stage 3 keeps parameters under 1000 elements whole and prefetches one unit),
      fsdp FULL_SHARD, SHARD_GRAD_OP, NO_SHARD (PyTorch's defaults: BACKWARD_PRE,
      limit_all_gathers) and FULL_SHARD with param_dtype bf16, alternating the order of the runs each round, median round;
      ratio = strategy / ddp;
  (b) memory per rank vs world size (1, 2, 4): model state at rest (mem_model_state_bytes: params
      + gradients + optimizer state, from the tracking allocator, right after the optimizer
      step) beside zero's own estimate (zero_estimate_state_bytes, from the SDK estimator), and
      the peak during a step above what lived before the model was built (mem_peak_bytes minus
      mem_current_bytes plus the model state: model state + activations + gathered parameters
      + communication buffers), the median over steps after the first two, beside zero's
      estimated peak (zero_estimate_peak_bytes: estimate with buffers + the activations its
      one-step probe measured in the first forward).

Other processes skew the timings (2 ranks x 1 thread fill a 2-core machine): the load average is
printed before and after. usage: bench/sharded.py <trainrun binary> [--only a|b] [--steps N]
[--rounds R] [--warmup N] [--set KEY=VALUE]... (--set is added to every run, e.g.
--set accelerator.shm=false for gloo-cpu's TCP algorithms, as before its shared-memory collectives)
"""
import argparse, os, statistics, sys, tempfile

sys.dont_write_bytecode = True  # no bench/__pycache__ from the import below
from trainrun_run import ONE_THREAD, run_trainrun

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "bench", "jobs", "sharded-gpt.toml")
EXTRA_SETS = []  # --set of the command line: added to every run

STRATEGIES = {
    "ddp": ["strategy.bucket_cap_mb=1", "strategy.first_bucket_mb=1"],
    "zero-1": ["strategy.plugin=zero", "strategy.stage=1", "strategy.reduce_bucket_size=262144"],
    "zero-2": ["strategy.plugin=zero", "strategy.stage=2", "strategy.reduce_bucket_size=262144"],
    "zero-3": ["strategy.plugin=zero", "strategy.stage=3", "strategy.param_persistence_threshold=1000",
               "strategy.prefetch_bucket_size=200000"],
    "fsdp-FULL": ["strategy.plugin=fsdp", "strategy.sharding_strategy=FULL_SHARD"],
    "fsdp-GRAD_OP": ["strategy.plugin=fsdp", "strategy.sharding_strategy=SHARD_GRAD_OP"],
    "fsdp-NO": ["strategy.plugin=fsdp", "strategy.sharding_strategy=NO_SHARD"],
    "fsdp-FULL-bf16": ["strategy.plugin=fsdp", "strategy.sharding_strategy=FULL_SHARD",
                       "strategy.param_dtype=bf16"],
}


def run(binary, sets, steps, world, work):
    _, rows, out = run_trainrun(binary, JOB, [f"trainer.max_steps={steps}",
                                              f"launch.nproc_per_node={world}"] + sets + EXTRA_SETS,
                                work, "sharded-")
    return rows, out


def med(rows, key, warmup):
    vals = [r[key] for r in rows[warmup:] if key in r]
    return statistics.median(vals) if vals else float("nan")


def mib(b):
    return f"{b / 2**20:8.2f}" if b == b else "       -"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--only", choices=["a", "b"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args()
    EXTRA_SETS.extend(a.sets)
    if a.sets:
        print("every run also: " + " ".join("--set " + s for s in a.sets))
    print("load average before:", " ".join(open("/proc/loadavg").read().split()[:3]))
    work = tempfile.mkdtemp(prefix="bench-sharded-")
    if a.only in (None, "a"):
        print(f"\n(a) step time, gpt, 2 ranks x 1 thread, {a.steps} steps, median of {a.rounds} rounds")
        times = {k: [] for k in STRATEGIES}
        names = list(STRATEGIES)
        for r in range(a.rounds):
            for k in (names if r % 2 == 0 else names[::-1]):
                rows, _ = run(a.binary, STRATEGIES[k], a.steps, 2, work)
                times[k].append(med(rows, "step_time_s", a.warmup))
        base = statistics.median(times["ddp"])
        print(f"{'strategy':<12} {'step ms':>8} {'vs ddp':>7}")
        for k in names:
            t = statistics.median(times[k])
            print(f"{k:<12} {t * 1e3:8.1f} {t / base:7.2f}x")
    if a.only in (None, "b"):
        print(f"\n(b) memory per rank (MiB), gpt, {a.steps} steps: model state measured | estimate | "
              f"peak during a step above the pre-model baseline")
        print(f"{'strategy':<12} {'world':>5} {'state':>8} {'estimate':>8} {'ratio':>6} {'peak':>8} "
              f"{'est.peak':>8} {'ratio':>6}")
        for k in STRATEGIES:
            for world in (1, 2, 4):
                rows, _ = run(a.binary, STRATEGIES[k], min(a.steps, 12), world, work)
                state = med(rows, "mem_model_state_bytes", 2)
                est = med(rows, "zero_estimate_state_bytes", 2)
                # mem_peak_bytes counts from the tracker's start; mem_current - model state is
                # what lived before the model (data, runtime): subtract it to get the step's own.
                base = med(rows, "mem_current_bytes", 2) - state
                peak = med(rows, "mem_peak_bytes", 2) - base
                ratio = f"{state / est:6.3f}" if est == est else "     -"
                est_peak = med(rows, "zero_estimate_peak_bytes", 2)
                pratio = f"{peak / est_peak:6.3f}" if est_peak == est_peak else "     -"
                print(f"{k:<12} {world:>5} {mib(state)} {mib(est)} {ratio} {mib(peak)} "
                      f"{mib(est_peak)} {pratio}")
    print("load average after:", " ".join(open("/proc/loadavg").read().split()[:3]))


if __name__ == "__main__":
    main()
