#!/usr/bin/python3
"""Sharded strategies' memory, measured by the tracking allocator, on the gpt of
tests/e2e/jobs/gpt-memory.toml at world sizes 1, 2 and 4 (every rank's metrics-rank-N.jsonl):

  - zero stages 1, 2, 3: the model state at rest (mem_model_state_bytes: parameters, gradients
    and optimizer state, right after the optimizer step) within 5% of the strategy's estimate
    (zero_estimate_state_bytes: the SDK estimator, ZeRO paper's formulas) on every rank;
  - fsdp FULL_SHARD with limit_all_gathers: the gathered unit parameters never exceed two units
    (fsdp_max_unit_full_bytes <= 2 x fsdp_unit_bytes, every step and rank), and the model state
    per rank falls as 1/world_size (within 5% of world 1's divided by N).

Prints the table the closing note quotes. usage: sharded_memory.py TRAINRUN JOB WORK
"""
import glob, json, os, shutil, subprocess, sys

tr, job, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
failures = []


def run(name, world, sets):
    run_dir = os.path.join(work, f"{name}-w{world}")
    cmd = [tr, "--config", job, "--set", f"launch.nproc_per_node={world}",
           "--set", f"trainer.run_dir={run_dir}"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                       timeout=240)
    if p.returncode != 0:
        sys.stdout.write(p.stdout[-3000:])
        sys.exit(f"FAIL: exit code {p.returncode} from {' '.join(cmd)}")
    ranks = {}
    for f in glob.glob(os.path.join(run_dir, "metrics*.jsonl")):
        for line in open(f):
            r = json.loads(line)
            if "step_time_s" in r:
                ranks.setdefault(r["rank"], []).append(r)
    if sorted(ranks) != list(range(world)):
        sys.exit(f"FAIL: {name} world {world}: metrics from ranks {sorted(ranks)}")
    return ranks


def mib(b):
    return f"{b / 2**20:7.3f}"


print(f"{'strategy':<22} {'world':>5} {'state MiB':>9} {'estimate':>9} {'ratio':>6}")
for stage in (1, 2, 3):
    for world in (1, 2, 4):
        ranks = run(f"zero{stage}", world, ["strategy.plugin=zero", f"strategy.stage={stage}",
                                           "strategy.param_persistence_threshold=1000",
                                           "strategy.reduce_bucket_size=100000"])
        worst = 0.0
        for rank, rows in ranks.items():
            last = rows[-1]
            state, est = last["mem_model_state_bytes"], last["zero_estimate_state_bytes"]
            worst = max(worst, abs(state / est - 1))
            if abs(state / est - 1) > 0.05:
                failures.append(f"zero stage {stage} world {world} rank {rank}: model state "
                                f"{state:.0f} B vs estimate {est:.0f} B")
        last = ranks[0][-1]
        print(f"{'zero stage ' + str(stage):<22} {world:>5} {mib(last['mem_model_state_bytes']):>9} "
              f"{mib(last['zero_estimate_state_bytes']):>9} "
              f"{last['mem_model_state_bytes'] / last['zero_estimate_state_bytes']:6.3f}")

print(f"\n{'fsdp FULL_SHARD':<22} {'world':>5} {'state MiB':>9} {'x world':>9} "
      f"{'max gathered units MiB':>23} {'unit MiB':>9}")
state1 = None
for world in (1, 2, 4):
    ranks = run("fsdp", world, ["strategy.plugin=fsdp", "strategy.sharding_strategy=FULL_SHARD",
                                "strategy.limit_all_gathers=true"])
    peak_units = 0.0
    for rank, rows in ranks.items():
        for r in rows:
            peak_units = max(peak_units, r["fsdp_max_unit_full_bytes"])
            if r["fsdp_max_unit_full_bytes"] > 2 * r["fsdp_unit_bytes"]:
                failures.append(f"fsdp world {world} rank {rank} step {r['step']}: "
                                f"{r['fsdp_max_unit_full_bytes']:.0f} B of unit parameters gathered, "
                                f"more than two units ({2 * r['fsdp_unit_bytes']:.0f} B)")
        if peak_units == 0 and world > 1:
            failures.append(f"fsdp world {world}: no unit was ever gathered (metric missing?)")
    state = ranks[0][-1]["mem_model_state_bytes"]
    if world == 1:
        state1 = state
    for rank, rows in ranks.items():
        s = rows[-1]["mem_model_state_bytes"]
        if abs(s * world / state1 - 1) > 0.05:
            failures.append(f"fsdp world {world} rank {rank}: model state {s:.0f} B is not "
                            f"1/{world} of world 1's {state1:.0f} B (x{world} = {s * world:.0f})")
    print(f"{'':<22} {world:>5} {mib(state):>9} {mib(state * world):>9} {mib(peak_units):>23} "
          f"{mib(ranks[0][-1]['fsdp_unit_bytes']):>9}")

if failures:
    for f in failures:
        print("FAIL:", f)
    sys.exit(1)
print("ok")
