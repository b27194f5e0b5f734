"""Reads a run's TensorBoard event files back with TensorBoard's own reader and compares them
with the run's metrics JSON lines, value by value.

usage: tensorboard_check.py RUN_DIR [--world N | --killed]
  without options: rank 0 wrote metrics.jsonl and the event file (the defaults);
  --world N: metrics and tensorboard ran with all_ranks on N ranks (metrics-rank-R.jsonl);
  --killed: the run was SIGKILLed while training: the event file may end in a partial record,
  and may lack the step metrics.jsonl logged last (metrics writes before tensorboard), no more.
Checks: every record's framing and both masked CRC-32Cs (tensorboard's own crc32c), the first
record of each file is file_version "brain.Event:2", the file names, one file per writing rank;
EventAccumulator's scalar tags equal exactly the tags the JSON lines imply, and for each tag the
same steps in the same order with float32-equal values (null in JSON = NaN); the text summary
"job" (text plugin, string tensor) holds <run_dir>/job.toml.
"""
import json
import math
import os
import re
import struct
import sys

import numpy as np
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

# Figures StepMetrics describes as the whole run's (rank 0 writes them); the rest are per rank.
GLOBAL = {"epoch", "loss", "lr", "grad_norm", "elapsed_s", "samples_per_s", "tokens_per_s"}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def records(path, killed):
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at < len(data):
        length = struct.unpack("<Q", data[at:at + 8])[0] if len(data) - at >= 8 else 0
        if len(data) - at < 16 + length:
            if killed:
                print(f"{path}: a partial last record ({len(data) - at} bytes), as a kill leaves")
                return
            fail(f"{path}: {len(data) - at} trailing bytes at offset {at}")
        header = data[at:at + 8]
        (crc,) = struct.unpack("<I", data[at + 8:at + 12])
        if crc != masked_crc32c(header):
            fail(f"{path}: bad length crc at offset {at}")
        body = data[at + 12:at + 12 + length]
        (crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        if crc != masked_crc32c(body):
            fail(f"{path}: bad data crc at offset {at}")
        yield body
        at += 16 + length


def load_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def expected_tags(run_dir, world):
    """tag -> [(step, value)] in file order, from the JSON lines."""
    want = {}

    def add(tag, step, value):
        want.setdefault(tag, []).append((step, math.nan if value is None else value))

    if world is None:
        sources = [(0, os.path.join(run_dir, "metrics.jsonl"))]
    else:
        sources = [(r, os.path.join(run_dir, f"metrics-rank-{r}.jsonl")) for r in range(world)]
    for rank, path in sources:
        for line in load_lines(path):
            step = line["step"]
            if "eval_loss" in line:
                if rank == 0:
                    for k, v in line.items():
                        if k.startswith("eval_"):
                            add("eval/" + k[len("eval_"):], step, v)
                continue
            for k, v in line.items():
                if k in ("step", "rank"):
                    continue
                if world is None:
                    add("train/" + k, step, v)
                elif k in GLOBAL:
                    if rank == 0:
                        add("train/" + k, step, v)
                else:
                    add(f"rank_{rank}/" + k, step, v)
    return want


def main():
    run_dir = sys.argv[1]
    world = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--world" else None
    killed = len(sys.argv) > 2 and sys.argv[2] == "--killed"
    tb_dir = os.path.join(run_dir, "tb")
    files = sorted(os.listdir(tb_dir))
    if len(files) != (world or 1):
        fail(f"{tb_dir} holds {files}, expected {world or 1} event file(s)")
    for name in files:
        m = re.fullmatch(r"events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.(\d+)", name)
        if not m:
            fail(f"event file name {name!r}")
        bodies = list(records(os.path.join(tb_dir, name), killed))
        first = event_pb2.Event.FromString(bodies[0])
        if first.file_version != "brain.Event:2":
            fail(f"{name}: first record is {first}, not file_version brain.Event:2")
        if int(first.wall_time) != int(m.group(1)):
            fail(f"{name}: seconds in the name differ from the first wall_time {first.wall_time}")
        print(f"{name}: {len(bodies)} records, CRCs good")

    acc = ea.EventAccumulator(tb_dir, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    want = expected_tags(run_dir, world)
    got_tags = set(acc.Tags()["scalars"])
    if got_tags != set(want):
        fail(f"tags differ: only in tensorboard {sorted(got_tags - set(want))}, "
             f"only in the JSON lines {sorted(set(want) - got_tags)}")
    compared = 0
    for tag, expected in want.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        if killed and len(got) == len(expected) - 1:
            expected = expected[:-1]
        got_steps, want_steps = [s for s, _ in got], [s for s, _ in expected]
        if got_steps != want_steps:
            first = next((i for i, (a, b) in enumerate(zip(got_steps, want_steps)) if a != b),
                         min(len(got_steps), len(want_steps)))
            fail(f"{tag}: {len(got_steps)} steps in tensorboard, {len(want_steps)} in the JSON "
                 f"lines; they part at index {first}: {got_steps[first:first + 3]} vs "
                 f"{want_steps[first:first + 3]}")
        for (step, g), (_, w) in zip(got, expected):
            g32, w32 = np.float32(g), np.float32(w)
            if not (g32 == w32 or (np.isnan(g32) and np.isnan(w32))):
                fail(f"{tag} at step {step}: tensorboard {g32!r}, JSON {w!r} (float32 {w32!r})")
            compared += 1
    print(f"{len(want)} tags, {compared} values equal in float32")

    if "job" not in acc.Tags()["tensors"]:
        fail(f"no text summary 'job' (tensors: {acc.Tags()['tensors']})")
    if acc.SummaryMetadata("job").plugin_data.plugin_name != "text":
        fail(f"'job' is not a text summary: {acc.SummaryMetadata('job')}")
    proto = acc.Tensors("job")[0].tensor_proto
    text = proto.string_val[0].decode()
    with open(os.path.join(run_dir, "job.toml")) as f:
        job = f.read()
    if proto.dtype != 7 or job not in text:
        fail(f"the text summary does not hold job.toml: {text[:200]!r}")
    print(f"text summary 'job' holds job.toml ({len(job)} characters)")


if __name__ == "__main__":
    main()
