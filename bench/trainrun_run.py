"""One trainrun training run for the benchmarks: the command, one BLAS/OpenMP thread per
process (so ranks do not oversubscribe the cores the peer is measured on), and rank 0's per-step
rows of metrics.jsonl."""
import json, os, subprocess, sys, tempfile

ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_trainrun(binary, config, sets, work, prefix):
    """Runs `binary --config config --set trainer.run_dir=<new dir under work> --set s...`.
    Returns (run_dir, rank 0's step rows, the combined output); exits naming the command on
    failure, with the output's last 4000 characters."""
    run_dir = tempfile.mkdtemp(prefix=prefix, dir=work)
    cmd = [binary, "--config", config, "--set", f"trainer.run_dir={run_dir}"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=dict(os.environ, **ONE_THREAD))
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-4000:])
        sys.exit(f"trainrun failed ({p.returncode}): {' '.join(cmd)}")
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    rows = [r for r in rows if "step_time_s" in r and r.get("rank", 0) == 0]
    return run_dir, rows, p.stdout
