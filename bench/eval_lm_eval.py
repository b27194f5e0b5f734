#!/usr/bin/env python3
"""`trainrun eval` beside lm-evaluation-harness (PyPI lm_eval, HF backend, float32) on the same
lm-eval YAML tasks and model: one run of each, whole commands timed (model load included), the
per-sample answers compared, and the throughput ratio printed. Default: SmolLM2-135M-Instruct
(scripts/gguf_to_hf.py, cached in build/cache/) on the shipped tasks (eval/tasks/).

  .venv/bin/python bench/eval_lm_eval.py [--model DIR] [--tasks DIR] [--limit N] [--batch-size 8]
                                         [--trainrun build/bin/trainrun] [--check]

--check exits 1 unless every per-sample log-likelihood agrees within 1e-4 relative, every
generation and per-sample metric is equal and every aggregate agrees (the long test
eval.smollm2 runs it so). Both tools get the machine's cores: lm-eval through torch's threads,
trainrun through OpenBLAS's.
"""
import argparse
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def run(cmd, cwd, log):
    t0 = time.time()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT).returncode
    dt = time.time() - t0
    if rc != 0:
        sys.stderr.write(open(log).read()[-4000:])
        sys.exit(f"eval_lm_eval: {cmd[0]} failed (exit {rc}); log {log}")
    return dt


def flat(v):
    if isinstance(v, list):
        for e in v:
            yield from flat(e)
    else:
        yield v


def as_number(x):
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return x
    return x


def compare(ref_dir, tr_dir, tasks):
    """(problems, max relative log-likelihood difference, samples compared)."""
    problems, worst, n = [], 0.0, 0
    for task in tasks:
        ref_files = glob.glob(os.path.join(ref_dir, "**", f"samples_{task}_*.jsonl"), recursive=True)
        if not ref_files:
            problems.append(f"{task}: lm-eval wrote no samples")
            continue
        ref = [json.loads(l) for l in open(sorted(ref_files)[-1])]
        tr = [json.loads(l) for l in open(os.path.join(tr_dir, f"samples_{task}.jsonl"))]
        key = lambda s: (s["filter"], s["doc_id"])  # noqa: E731
        ref.sort(key=key)
        tr.sort(key=key)
        if len(ref) != len(tr):
            problems.append(f"{task}: {len(ref)} samples from lm-eval, {len(tr)} from trainrun")
            continue
        for a, b in zip(ref, tr):
            n += 1
            where = f"{task} doc {a['doc_id']} filter {a['filter']}"
            for k in ("doc", "target", "arguments", "doc_hash", "prompt_hash", "target_hash", "metrics"):
                if a.get(k) != b.get(k):
                    problems.append(f"{where}: {k} differs")
            for field in ("resps", "filtered_resps"):
                for u, w in zip(flat(a[field]), flat(b[field])):
                    u, w = as_number(u), as_number(w)
                    if isinstance(u, float) and isinstance(w, (int, float)) and not isinstance(w, bool):
                        rel = abs(u - w) / max(abs(u), 1e-3)
                        worst = max(worst, rel)
                        if rel > 1e-4:
                            problems.append(f"{where}: {field} {u} vs {w}")
                    elif str(u) != str(w):
                        problems.append(f"{where}: {field} {u!r} vs {w!r}")
            for m in a["metrics"]:
                u, w = a[m], b.get(m)
                if isinstance(u, list):
                    if not (isinstance(w, list) and math.isclose(u[0], w[0], rel_tol=1e-4) and u[1] == w[1]):
                        problems.append(f"{where}: {m} {u} vs {w}")
                elif u != w:
                    problems.append(f"{where}: {m} {u} vs {w}")
    return problems, worst, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "build", "cache", "smollm2-135m-instruct"))
    ap.add_argument("--tasks", default=os.path.join(ROOT, "eval", "tasks"))
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--trainrun", default=os.path.join(ROOT, "build", "bin", "trainrun"))
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench-eval"))
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    if not os.path.isfile(os.path.join(a.model, "config.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gguf_to_hf.py"), a.model], check=True)
    tasks_dir = os.path.abspath(a.tasks)
    tasks = sorted(os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(tasks_dir, "*.yaml")))
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    limit = ["--limit", str(a.limit)] if a.limit else []
    env_note = f"{os.cpu_count()} cores"

    # lm-eval from the task directory, so that its relative data_files resolve as for a user.
    ref_out = os.path.join(a.work, "lm_eval")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(a.work, "hf-datasets"))
    t_ref = run([sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
                 f"pretrained={os.path.abspath(a.model)},dtype=float32", "--tasks", ",".join(tasks),
                 "--include_path", tasks_dir, "--batch_size", str(a.batch_size), "--device", "cpu",
                 "--output_path", ref_out, "--log_samples"] + limit, tasks_dir, os.path.join(a.work, "lm_eval.log"))
    tr_out = os.path.join(a.work, "trainrun")
    t_tr = run([a.trainrun, "eval", "--model", os.path.abspath(a.model), "--tasks", tasks_dir,
                "--batch-size", str(a.batch_size), "--output", os.path.join(tr_out, "results.json"),
                "--log-samples", tr_out] + limit, tasks_dir, os.path.join(a.work, "trainrun.log"))

    ref_results = json.load(open(sorted(glob.glob(os.path.join(ref_out, "**", "results_*.json"), recursive=True))[-1]))
    tr_results = json.load(open(os.path.join(tr_out, "results.json")))
    print(f"model {a.model}, tasks {', '.join(tasks)}, batch size {a.batch_size}, {env_note}"
          + (f", limit {a.limit}" if a.limit else ""))
    print(f"{'task':<18} {'metric,filter':<26} {'lm-eval':>12} {'trainrun':>12}")
    agg_problems = []
    for task in tasks:
        for k, v in ref_results["results"][task].items():
            if "," not in k or "_stderr" in k:
                continue
            w = tr_results["results"][task].get(k)
            print(f"{task:<18} {k:<26} {v:>12.6g} {w if w is None else format(w, '>12.6g')}")
            if w is None or not math.isclose(v, w, rel_tol=1e-4, abs_tol=1e-12):
                agg_problems.append(f"{task} {k}: lm-eval {v}, trainrun {w}")
    problems, worst, n = compare(ref_out, tr_out, tasks)
    problems = agg_problems + problems
    print(f"samples compared: {n}; largest relative log-likelihood difference {worst:.2e}; "
          f"{len(problems)} disagreements")
    for p in problems[:20]:
        print("  " + p)
    print(f"wall time (load included): lm-eval {t_ref:.1f} s, trainrun {t_tr:.1f} s; "
          f"trainrun / lm-eval throughput x{t_ref / t_tr:.2f}")
    if a.check and problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
