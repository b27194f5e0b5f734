#!/usr/bin/python3
"""trainrun's `ddp` strategy on 2 ranks x 1 intra-op thread (gloo-cpu and mpi), three benchmarks in one run:

  (a) trainrun ddp vs PyTorch's own DistributedDataParallel (gloo, this python3's torch 1.13) on
      the mlp and cnn of plugins/models/models: same global batch (64 = 32 per rank), same data split
      (trainrun's DistributedSampler: rank r of W takes positions step*G + r + j*W of one seeded
      permutation), same loss normalisation (mean over the global batch), AdamW as
      bench/single_vs_pytorch.py, 2 ranks x 1 thread on both sides. PyTorch runs twice: as it
      runs by default, and with the OpenBLAS kernel trainrun's rank 0 used (OPENBLAS_CORETYPE
      from <run_dir>/runtime/rank-0.json), so that the second ratio compares the loops alone;
  (b) scaling 1 -> 2 ranks on the cnn with trainrun: strategy single on one process with one
      thread vs ddp on 2 ranks x 1 thread, same global batch of 64;
  (c) overlap on vs off on the gpt of bench/jobs/gpt.toml with 1 MiB buckets (bench/jobs/
      ddp-gpt.toml), 2 ranks x 1 thread: median step time, mean comm_exposed_s, comm_bytes and
      buckets per step from metrics.jsonl.

Step time on both sides is the median over the steps after `--warmup` of rank 0's wall time of a
whole step (trainrun: step_time_s of <run_dir>/metrics.jsonl; PyTorch: batch gather, forward,
loss, backward with DDP's all-reduces, optimizer step, zero_grad, loss.item()); samples/s =
global batch / step time. Every configuration runs `--rounds` times, alternating which side goes
first per round, and the median round is reported. Other processes on the machine skew the
figures (2 ranks x 1 thread fill a 2-core machine): the load average is printed before and after.

usage: bench/ddp.py <trainrun binary> [--only a|b|c] [--steps N] [--rounds R]
       [--gpt-steps N] [--warmup N] [--set KEY=VALUE]... [--no-bucket-view]
"""
import argparse, json, os, socket, statistics, subprocess, sys, tempfile, time

sys.dont_write_bytecode = True  # no bench/__pycache__ from the import below
from trainrun_run import ONE_THREAD, run_trainrun

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = os.path.join(ROOT, "bench", "jobs")
EXTRA_SETS = []  # --set of the command line: added to every trainrun run
KERNEL = {}  # the OpenBLAS kernel trainrun's rank 0 reported, once a run has ended


# ---------------------------------------------------------------------------------------------
# PyTorch side: this file re-run as one worker process per rank (`--worker`), started below.

def worker(a):
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    sys.dont_write_bytecode = True  # no bench/__pycache__ from the import below
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from single_vs_pytorch import Cnn, Mlp, load_idx

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)  # same initial weights on every rank (DDP broadcasts rank 0's anyway)
    x = torch.from_numpy(load_idx("train-images-idx3-ubyte.gz").copy()).float().div_(255)
    x = x.sub_(0.2860).div_(0.3530).unsqueeze(1)
    y = torch.from_numpy(load_idx("train-labels-idx1-ubyte.gz").astype(np.int64))
    model = DDP({"mlp": Mlp, "cnn": Cnn}[a.model](), bucket_cap_mb=25,
                gradient_as_bucket_view=a.bucket_view)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)
    n, G = x.shape[0], a.batch
    steps_per_epoch = n // G
    # trainrun's DistributedSampler (seed 0): a permutation per epoch from a generator seeded
    # with seed * 1000003 + epoch; rank r's j-th sample of step s is perm[s*G + r + j*W].
    perms = {}
    mine = torch.arange(rank, G, world)
    dist.barrier()
    times = []
    for step in range(a.steps):
        t0 = time.perf_counter()
        epoch = step // steps_per_epoch
        if epoch not in perms:
            perms = {epoch: torch.randperm(n, generator=torch.Generator().manual_seed(epoch))}
        idx = perms[epoch].index_select(0, (step % steps_per_epoch) * G + mine)
        xb, yb = x.index_select(0, idx), y.index_select(0, idx)
        # Mean over this rank's equal share; DDP averages over ranks: the mean over the global
        # batch, as trainrun's sum / global targets.
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - t0)
    dist.barrier()
    if rank == 0:
        print(json.dumps({"step_times": times}), flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pytorch_step_time(model, steps, warmup, batch, nproc, bucket_view, same_blas=False):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(nproc), **ONE_THREAD)
    if same_blas:
        env["OPENBLAS_CORETYPE"] = KERNEL["trainrun"]
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--model", model,
           "--steps", str(steps), "--batch", str(batch)] + (["--bucket-view"] if bucket_view else [])
    procs = [subprocess.Popen(cmd, env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, text=True)
             for r in range(nproc)]
    outs = [p.communicate()[0] for p in procs]
    for r, p in enumerate(procs):
        if p.returncode != 0:
            sys.exit(f"PyTorch DDP worker rank {r} failed ({p.returncode}): {' '.join(cmd)}")
    times = json.loads(outs[0].strip().splitlines()[-1])["step_times"]
    return statistics.median(times[warmup:])


# ---------------------------------------------------------------------------------------------
# trainrun side

def trainrun_rows(binary, job, sets, steps, work):
    """Rank 0's per-step rows of metrics.jsonl for one run of bench/jobs/<job>.toml."""
    run_dir, rows, _ = run_trainrun(binary, os.path.join(JOBS, f"{job}.toml"),
                                    [f"trainer.max_steps={steps}"] + sets + EXTRA_SETS, work,
                                    job + "-")
    rank0 = json.load(open(os.path.join(run_dir, "runtime", "rank-0.json")))
    KERNEL["trainrun"] = rank0["blas"]["corename"]
    assert len(rows) == steps, (len(rows), steps, job, sets)
    return rows


def median_step(rows, warmup):
    return statistics.median(r["step_time_s"] for r in rows[warmup:])


def mean_of(rows, key, warmup):
    vals = [r[key] for r in rows[warmup:] if key in r]
    return statistics.fmean(vals) if vals else float("nan")


def alternate(rounds, sides):
    """Runs each side `rounds` times, swapping the order every round; lists of results."""
    out = [[] for _ in sides]
    for r in range(rounds):
        order = list(range(len(sides)))
        if r % 2:
            order.reverse()
        for i in order:
            out[i].append(sides[i]())
    return out


def median_round(results, key):
    """The round whose `key` is the median (odd rounds: exact; even: the lower middle)."""
    ranked = sorted(results, key=key)
    return ranked[(len(ranked) - 1) // 2]


def load():
    return open("/proc/loadavg").read().split()[:3]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trainrun", nargs="?")
    ap.add_argument("--only", choices=["a", "b", "c"], action="append",
                    help="run only this benchmark (repeatable); default all three")
    ap.add_argument("--steps", type=int, default=200, help="steps per run, mlp and cnn")
    ap.add_argument("--gpt-steps", type=int, default=50, help="steps per run, gpt (c)")
    ap.add_argument("--warmup", type=int, default=10, help="first steps of a run not timed")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64, help="global batch, mlp and cnn")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="extra --set for every trainrun run, e.g. accelerator.check_collectives=false")
    ap.add_argument("--no-bucket-view", dest="bucket_view", action="store_false",
                    help="PyTorch DDP with gradient_as_bucket_view=False (its default); the "
                         "baseline uses True, as trainrun's ddp does")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--bucket-view", dest="bucket_view", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    if not a.trainrun:
        ap.error("the trainrun binary is required")
    binary = os.path.abspath(a.trainrun)
    EXTRA_SETS.extend(a.sets)
    only = set(a.only or ["a", "b", "c"])
    assert a.warmup < min(a.steps, a.gpt_steps), "--warmup must be below the step counts"
    import torch
    t_start = time.time()
    print(f"2 ranks x 1 intra-op thread (gloo), median step time of rank 0 after {a.warmup} warmup "
          f"steps, median of {a.rounds} alternating rounds; torch {torch.__version__}; "
          f"load average before: {' '.join(load())}"
          + (f"; trainrun --set {' '.join(a.sets)}" if a.sets else ""), flush=True)
    cache = {}

    def tr(job, sets, steps):
        return trainrun_rows(binary, job, sets, steps, work)

    def ddp2(job, steps, backend="gloo-cpu"):
        # One run of a 2-rank ddp job; (a) and (b) share the cnn's runs when both are asked for.
        return tr(job, ["launch.nproc_per_node=2", "accelerator.threads=1",
                        f"accelerator.plugin={backend}"], steps)

    with tempfile.TemporaryDirectory() as work:
        if "a" in only:
            print(f"\n(a) trainrun ddp vs PyTorch DistributedDataParallel, global batch {a.batch} "
                  f"(= 2 x {a.batch // 2}), AdamW, {a.steps} steps per run; PyTorch "
                  f"gradient_as_bucket_view={a.bucket_view}")
            print("trainrun runs ddp on both of its CPU backends: gloo-cpu (Gloo's TCP transport, as "
                  "PyTorch's gloo) and mpi (MPICH, shared memory within a node); Debian's PyTorch "
                  "has no MPI backend, so its side is gloo.")
            print(f"{'model':6} {'backend':9} {'trainrun ms':>12} {'samples/s':>10} {'pytorch ms':>11} "
                  f"{'samples/s':>10} {'trainrun/pytorch':>17} {'same BLAS ms':>13} "
                  f"{'trainrun/pytorch':>17}", flush=True)
            for m in ("mlp", "cnn"):
                # trainrun's side runs first in round 0: the same-BLAS side needs its kernel.
                trs, mps, pys, sames = alternate(a.rounds, [
                    lambda: median_step(ddp2(f"ddp-{m}", a.steps), a.warmup),
                    lambda: median_step(ddp2(f"ddp-{m}", a.steps, "mpi"), a.warmup),
                    lambda: pytorch_step_time(m, a.steps, a.warmup, a.batch, 2, a.bucket_view),
                    lambda: pytorch_step_time(m, a.steps, a.warmup, a.batch, 2, a.bucket_view,
                                              same_blas=True)])
                if m == "cnn":
                    cache["cnn2"] = trs
                    cache["cnn2-mpi"] = mps
                p, q = statistics.median(pys), statistics.median(sames)
                for backend, runs in (("gloo-cpu", trs), ("mpi", mps)):
                    t = statistics.median(runs)
                    print(f"{m:6} {backend:9} {1e3 * t:12.2f} {a.batch / t:10.0f} {1e3 * p:11.2f} "
                          f"{a.batch / p:10.0f} {p / t:17.2f} {1e3 * q:13.2f} {q / t:17.2f}",
                          flush=True)
            print(f"OpenBLAS kernel: trainrun {KERNEL['trainrun']}; 'same BLAS' runs PyTorch with "
                  f"OPENBLAS_CORETYPE={KERNEL['trainrun']}")
            print("target: trainrun/pytorch (same BLAS) >= 1.5 on the mlp, >= 1.2 on the cnn")

        if "b" in only:
            print(f"\n(b) trainrun scaling on the cnn, global batch {a.batch}, {a.steps} steps per "
                  f"run: 1 rank x 1 thread (strategy single, accelerator cpu) vs ddp 2 ranks x 1 thread")
            one_sets = ["launch.nproc_per_node=1", "strategy.plugin=single", "accelerator.plugin=cpu",
                        "accelerator.threads=1"]
            sides = [lambda: median_step(tr("ddp-cnn", one_sets, a.steps), a.warmup)]
            shared = "cnn2" in cache
            if not shared:
                sides.append(lambda: median_step(ddp2("ddp-cnn", a.steps), a.warmup))
                sides.append(lambda: median_step(ddp2("ddp-cnn", a.steps, "mpi"), a.warmup))
            res = alternate(a.rounds, sides)
            t1 = statistics.median(res[0])
            print(f"{'ranks':>5} {'backend':9} {'step ms':>8} {'samples/s':>10} {'speed-up':>9}")
            print(f"{1:5} {'-':9} {1e3 * t1:8.1f} {a.batch / t1:10.0f} {1.0:9.2f}")
            for i, backend in enumerate(("gloo-cpu", "mpi")):
                runs = cache["cnn2" if i == 0 else "cnn2-mpi"] if shared else res[1 + i]
                t2 = statistics.median(runs)
                print(f"{2:5} {backend:9} {1e3 * t2:8.1f} {a.batch / t2:10.0f} {t1 / t2:9.2f}"
                      + ("   (the 2-rank runs of (a))" if shared else ""))
            print("target: speed-up >= 1.80 (2 ranks on 2 cores)", flush=True)

        if "c" in only:
            print(f"\n(c) ddp overlap on vs off, gpt of bench/jobs/ddp-gpt.toml (4 layers, n_embd "
                  f"128, batch 16 x 128 bytes = 2 x 8), {a.gpt_steps} steps per run")

            def gpt(overlap):
                rows = tr("ddp-gpt", ["launch.nproc_per_node=2", "accelerator.threads=1",
                                      f"strategy.overlap={str(overlap).lower()}"], a.gpt_steps)
                return {"step": median_step(rows, a.warmup),
                        "exposed": mean_of(rows, "comm_exposed_s", a.warmup),
                        "bytes": mean_of(rows, "comm_bytes", a.warmup),
                        "buckets": mean_of(rows, "buckets", a.warmup),
                        "overlapped": mean_of(rows, "buckets_overlapped", a.warmup)}
            on, off = alternate(a.rounds, [lambda: gpt(True), lambda: gpt(False)])
            print(f"{'overlap':8} {'step ms':>8} {'comm_exposed ms':>16} {'comm MB/step':>13} "
                  f"{'buckets':>8} {'launched in backward':>21}")
            res = {}
            for name, runs in (("true", on), ("false", off)):
                r = median_round(runs, key=lambda d: d["step"])
                res[name] = r
                print(f"{name:8} {1e3 * r['step']:8.1f} {1e3 * r['exposed']:16.2f} "
                      f"{r['bytes'] / 1e6:13.3f} {r['buckets']:8.0f} {r['overlapped']:21.1f}")
            print(f"step time off/on: {res['false']['step'] / res['true']['step']:.3f} "
                  f"(> 1: overlap saves time); exposed comm off - on: "
                  f"{1e3 * (res['false']['exposed'] - res['true']['exposed']):.2f} ms", flush=True)

    print(f"\nload average after: {' '.join(load())}; total {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
