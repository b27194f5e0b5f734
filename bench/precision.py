#!/usr/bin/python3
"""Mixed precision and activation checkpointing, measured with the shipped jobs (issue 8):

  (a) accuracy parity: configs/fashion-mnist-ddp.toml (the CNN, ddp on 2 ranks, 2 epochs) under
      fp32 and bf16-mixed: final test accuracy of each and the difference in points (goal:
      within 1 point), and the median step time of each;
  (b) gpt held-out loss: configs/gpt-text.toml (one process) under fp32 and bf16-mixed after the
      same steps (--gpt-steps, default the job's 800), evaluated on the whole held-out split:
      both losses and the relative difference (goal: within 2%), and the tokens/s of each;
  (c) activation checkpointing on the gpt with 8 blocks (--ckpt-steps steps of
      configs/gpt-text.toml with n_layer = 8): median step time and peak memory per step
      (mem_peak_bytes - mem_current_bytes of the step before, i.e. what the step added above
      the model state at rest, from metrics.jsonl when the CPU memory tracker reports it).

Step time: the median of rank 0's step_time_s after the first --warmup steps. Other processes on
the machine skew the times (and (a) fills both cores of a 2-core machine): the load average is
printed before and after. Every figure comes from one run per configuration.

usage: bench/precision.py <trainrun binary> [--only a|b|c] [--gpt-steps N] [--ckpt-steps N]
       [--warmup N] [--work DIR]
"""
import argparse, json, os, re, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load():
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def train(tr, job, run_dir, sets, log):
    cmd = [tr, "--config", job, "--set", f"trainer.run_dir={run_dir}"]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.time()
    with open(log, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    wall = time.time() - t0
    text = open(log).read()
    if rc != 0:
        sys.exit(f"run failed ({rc}): {' '.join(cmd)}\n{text[-3000:]}")
    final = [l for l in text.splitlines() if "final eval:" in l][-1]
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    steps = [r for r in rows if "loss" in r and "eval_loss" not in r]
    evals = [r for r in rows if "eval_loss" in r]
    return {"final": final, "steps": steps, "eval": evals[-1], "wall": wall}


def median_step(r, warmup):
    return statistics.median(s["step_time_s"] for s in r["steps"][warmup:])


def train_both_precisions(tr, job, work, part, name, sets, warmup):
    """Trains `job` with `sets` under fp32, then bf16-mixed (run dir WORK/NAME-PRECISION), and
    prints each one's final eval line and median step as part PART; returns {precision: train()}."""
    res = {}
    for prec in ("fp32", "bf16-mixed"):
        d = os.path.join(work, f"{name}-{prec}")
        res[prec] = train(tr, job, d, sets + [f"precision.plugin={prec}"], d + ".log")
        print(f"({part}) {prec}: {res[prec]['final']} | median step {1e3 * median_step(res[prec], warmup):.1f} ms", flush=True)
    return res


def median_steps_text(res, warmup):
    """"median step fp32 T ms, bf16-mixed T ms (Sx" for train_both_precisions' results, S the
    speed-up of bf16-mixed; the caller closes the parenthesis."""
    t32, t16 = median_step(res["fp32"], warmup), median_step(res["bf16-mixed"], warmup)
    return f"median step fp32 {1e3 * t32:.1f} ms, bf16-mixed {1e3 * t16:.1f} ms ({t32 / t16:.2f}x"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trainrun")
    ap.add_argument("--only", choices=["a", "b", "c"])
    ap.add_argument("--gpt-steps", type=int, default=800)
    ap.add_argument("--ckpt-steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    tr = os.path.abspath(a.trainrun)
    work = a.work or tempfile.mkdtemp(prefix="trainrun-precision-")
    os.makedirs(work, exist_ok=True)
    print(f"work dir {work}; {load()}", flush=True)
    summary = []

    if a.only in (None, "a"):
        job = os.path.join(ROOT, "configs", "fashion-mnist-ddp.toml")
        res = train_both_precisions(tr, job, work, "a", "fmnist", [], a.warmup)
        acc32 = 100 * res["fp32"]["eval"]["eval_accuracy"]
        acc16 = 100 * res["bf16-mixed"]["eval"]["eval_accuracy"]
        summary.append(f"(a) Fashion-MNIST CNN, ddp 2 ranks, {len(res['fp32']['steps'])} steps: test accuracy "
                       f"fp32 {acc32:.2f}%, bf16-mixed {acc16:.2f}% (difference {acc16 - acc32:+.2f} points, "
                       f"goal within 1); {median_steps_text(res, a.warmup)})")

    if a.only in (None, "b"):
        job = os.path.join(ROOT, "configs", "gpt-text.toml")
        sets = [f"trainer.max_steps={a.gpt_steps}", "trainer.eval_every=0", "trainer.eval_max_batches=0"]
        res = train_both_precisions(tr, job, work, "b", "gpt", sets, a.warmup)
        l32, l16 = res["fp32"]["eval"]["eval_loss"], res["bf16-mixed"]["eval"]["eval_loss"]
        tok = lambda r: statistics.median(s["tokens_per_s"] for s in r["steps"][a.warmup:])
        summary.append(f"(b) gpt-text, {a.gpt_steps} steps: held-out loss fp32 {l32:.4f}, bf16-mixed {l16:.4f} "
                       f"({100 * (l16 - l32) / l32:+.2f}%, goal within 2%); {median_steps_text(res, a.warmup)}; "
                       f"{tok(res['fp32']):.0f} vs {tok(res['bf16-mixed']):.0f} tokens/s)")

    if a.only in (None, "c"):
        job = os.path.join(ROOT, "configs", "gpt-text.toml")
        res = {}
        sets = [f"trainer.max_steps={a.ckpt_steps}", "trainer.eval_every=0", "trainer.eval_max_batches=2",
                "model.n_layer=8", "trainer.save_final_model=false"]
        for on in ("false", "true"):
            d = os.path.join(work, f"ckpt-{on}")
            res[on] = train(tr, job, d, sets + [f"trainer.activation_checkpointing={on}"], d + ".log")

        def step_mem(r):
            s = r["steps"]
            if "mem_peak_bytes" not in s[-1]:
                return None
            return statistics.median(s[i]["mem_peak_bytes"] - s[i - 1]["mem_current_bytes"]
                                     for i in range(max(1, a.warmup), len(s)))

        t0, t1 = median_step(res["false"], a.warmup), median_step(res["true"], a.warmup)
        m0, m1 = step_mem(res["false"]), step_mem(res["true"])
        mem = ("peak above the model state: not reported (no CPU memory tracker)" if m0 is None else
               f"peak above the model state {m0 / 2**20:.1f} MiB without, {m1 / 2**20:.1f} MiB with "
               f"({100 * (1 - m1 / m0):.1f}% less)")
        summary.append(f"(c) gpt n_layer 8, batch 32 x 128 tokens: median step {1e3 * t0:.1f} ms without "
                       f"checkpointing, {1e3 * t1:.1f} ms with ({100 * (t1 / t0 - 1):+.1f}%); {mem}")

    print(f"\n{load()}")
    for line in summary:
        print(line)


if __name__ == "__main__":
    main()
