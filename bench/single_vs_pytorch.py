#!/usr/bin/python3
"""trainrun's single-process step throughput vs the same model, batch, optimizer and thread count
in a plain PyTorch training loop (Debian's python3-torch, the same LibTorch 1.13 underneath).

Both sides: Fashion-MNIST (or the fortunes bytes for gpt) held in memory, a random global batch
gathered per step, forward, cross-entropy (sum / targets), backward, AdamW (no decay on 1-d
parameters). Step time is the median over the steps after `warmup` (robust to another process
taking a core for a moment); samples/s = batch / step time. Each model runs `--rounds` times per
side, alternating which side goes first, and the median round is reported.

PyTorch runs twice per round, each in its own process: as it runs by default, and given the
OpenBLAS kernel trainrun's rank 0 reported using (<run_dir>/runtime/rank-0.json, blas.corename,
passed as OPENBLAS_CORETYPE) with the same thread counts. On CPUs where OpenBLAS's own detection
falls back to an older kernel in the Python process, the first ratio includes trainrun's choice
of kernel (a real advantage out of the box) and the second compares the training loops alone.

usage: bench/single_vs_pytorch.py <trainrun binary> [--steps N] [--threads T] [--batch B]
"""
import argparse, gzip, json, os, statistics, subprocess, sys, tempfile, time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = "/usr/share/datasets/fashion-mnist"


def load_idx(name):
    with gzip.open(os.path.join(DATA, name)) as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


class Mlp(nn.Module):  # plugins/models/models "mlp" with hidden = [256, 128]
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                                 nn.Linear(128, 10))

    def forward(self, x):
        return self.net(x.flatten(1))


class Cnn(nn.Module):  # plugins/models/models "cnn" defaults: channels [32, 64], hidden 128, dropout 0.25
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        x = F.dropout(x.flatten(1), 0.25, self.training)
        x = F.dropout(F.relu(self.fc1(x)), 0.25, self.training)
        return self.fc2(x)


class Block(nn.Module):  # plugins/models/models "gpt" block: pre-LayerNorm, causal attention, GELU MLP
    def __init__(self, c, nh):
        super().__init__()
        self.nh = nh
        self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.c_attn, self.attn_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.c_fc, self.mlp_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (C // self.nh) ** 0.5)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class Gpt(nn.Module):  # bench/jobs/gpt.toml: 4 layers, 4 heads, n_embd 128, block 128, tied
    def __init__(self, n_layer=4, nh=4, c=128, block=128, vocab=256):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(block, c)
        self.blocks = nn.ModuleList(Block(c, nh) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(c)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def fortunes_bytes():
    root = "/usr/share/games/fortunes"
    names = sorted(n for n in os.listdir(root) if "." not in n)
    data = b"".join(open(os.path.join(root, n), "rb").read() for n in names)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def pytorch_step_time(model_name, steps, warmup, batch, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if model_name == "gpt":
        tokens = fortunes_bytes()
        x = torch.stack([tokens[i:i + 129] for i in range(0, 129 * 4096, 129)])
        y = None
    else:
        x = torch.from_numpy(load_idx("train-images-idx3-ubyte.gz").copy()).float().div_(255)
        x = x.sub_(0.2860).div_(0.3530).unsqueeze(1)
        y = torch.from_numpy(load_idx("train-labels-idx1-ubyte.gz").astype(np.int64))
    model = {"mlp": Mlp, "cnn": Cnn, "gpt": Gpt}[model_name]()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)
    perm = torch.randperm(x.shape[0])
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        idx = perm[(step * batch) % (x.shape[0] - batch):][:batch]
        if y is None:  # next-byte prediction on windows of 129 bytes
            w = x.index_select(0, idx)
            xb, yb = w[:, :-1], w[:, 1:]
        else:
            xb, yb = x.index_select(0, idx), y.index_select(0, idx)
        logits = model(xb)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1),
                               reduction="sum") / yb.numel()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[warmup:])


def pytorch_step_time_in(env_extra, model_name, steps, warmup, batch, threads):
    """pytorch_step_time in a fresh process with `env_extra` added (OpenBLAS reads
    OPENBLAS_CORETYPE when it is loaded, so it cannot be changed in this process)."""
    code = ("import sys; sys.path.insert(0, %r); import single_vs_pytorch as b; "
            "print(b.pytorch_step_time(%r, %d, %d, %d, %d))"
            % (os.path.dirname(os.path.abspath(__file__)), model_name, steps, warmup, batch, threads))
    out = subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.PIPE,
                         env=dict(os.environ, **env_extra), text=True).stdout
    return float(out.strip().splitlines()[-1])


def loaded_openblas_corename():
    """The kernel of the OpenBLAS this process (with torch imported) loaded, or '?'."""
    import ctypes
    for line in open("/proc/self/maps"):
        path = line.split()[-1]
        if "blas" in os.path.basename(path) and ".so" in path:
            f = getattr(ctypes.CDLL(path), "openblas_get_corename", None)
            if f is not None:
                f.restype = ctypes.c_char_p
                return f().decode()
    return "?"


def pytorch_blas_kernel():
    """The OpenBLAS kernel a default PyTorch process picks (after one matmul)."""
    code = ("import sys, torch; sys.path.insert(0, %r); import single_vs_pytorch as b; "
            "torch.ones(64, 64) @ torch.ones(64, 64); print(b.loaded_openblas_corename())"
            % os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                          text=True).stdout.strip() or "?"


def matched_env(run_dir, threads):
    """What makes PyTorch's BLAS match trainrun's: the kernel rank 0 reported, same threads."""
    rank0 = json.load(open(os.path.join(run_dir, "runtime", "rank-0.json")))
    return {"OPENBLAS_CORETYPE": rank0["blas"]["corename"], "OPENBLAS_NUM_THREADS": str(threads),
            "OMP_NUM_THREADS": str(threads)}


def trainrun_step_time(binary, model_name, steps, warmup, batch, threads, work, runs=None):
    run_dir = tempfile.mkdtemp(prefix=model_name + "-", dir=work)
    if runs is not None:
        runs.append(run_dir)
    cmd = [binary, "--config", os.path.join(ROOT, "bench", "jobs", f"{model_name}.toml"),
           "--set", f"trainer.max_steps={steps}", "--set", f"trainer.global_batch_size={batch}",
           "--set", f"accelerator.threads={threads}", "--set", f"trainer.run_dir={run_dir}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    times = [r["step_time_s"] for r in rows if "step_time_s" in r]
    assert len(times) == steps, (len(times), steps)
    return statistics.median(times[warmup:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trainrun")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--gpt-batch", type=int, default=16)
    ap.add_argument("--gpt-steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="mlp,cnn,gpt")
    a = ap.parse_args()
    print(f"single process, batch {a.batch} (gpt {a.gpt_batch} x 128 bytes), {a.threads} threads, "
          f"{a.steps} steps (gpt {a.gpt_steps}), median of {a.rounds} alternating rounds, "
          f"(first {a.warmup} not timed); torch {torch.__version__}")
    print(f"{'model':6} {'trainrun samples/s':>20} {'pytorch samples/s':>18} {'ratio':>7} "
          f"{'pytorch, same BLAS':>19} {'ratio':>7}  kernels (trainrun / pytorch default)")
    worst = worst_same = None
    with tempfile.TemporaryDirectory() as work:
        for m in a.models.split(","):
            batch = a.batch if m != "gpt" else a.gpt_batch
            steps = a.steps if m != "gpt" else a.gpt_steps
            trs, pys, same, run_dirs = [], [], [], []
            for r in range(a.rounds):
                def tr_side():
                    trs.append(trainrun_step_time(a.trainrun, m, steps, a.warmup, batch,
                                                  a.threads, work, run_dirs))
                def py_side():
                    pys.append(pytorch_step_time_in({}, m, steps, a.warmup, batch, a.threads))
                    same.append(pytorch_step_time_in(matched_env(run_dirs[0], a.threads), m,
                                                     steps, a.warmup, batch, a.threads))
                # trainrun first in round 0: the matched PyTorch needs its kernel name.
                for run in ((tr_side, py_side) if r % 2 == 0 else (py_side, tr_side)):
                    run()
            tr, py, py_same = (statistics.median(v) for v in (trs, pys, same))
            ratio, ratio_same = py / tr, py_same / tr
            worst = ratio if worst is None else min(worst, ratio)
            worst_same = ratio_same if worst_same is None else min(worst_same, ratio_same)
            kernel = matched_env(run_dirs[0], a.threads)["OPENBLAS_CORETYPE"]
            default_kernel = pytorch_blas_kernel()
            print(f"{m:6} {batch / tr:20.0f} {batch / py:18.0f} {ratio:7.2f} "
                  f"{batch / py_same:19.0f} {ratio_same:7.2f}  {kernel} / {default_kernel}",
                  flush=True)
    print(f"worst ratio trainrun/pytorch: {worst:.2f} as PyTorch runs by default, "
          f"{worst_same:.2f} with the same BLAS kernel and threads (target >= 1.0)")


if __name__ == "__main__":
    sys.exit(main())
