#!/usr/bin/env python3
"""Validates the `ring` strategy's timeline files against the Chrome Trace Event Format (the
JSON Object Format that Perfetto and chrome://tracing load) and checks that every tensor went
through every phase in every recorded step. Standard library only.

  ring_timeline_check.py FILE... --world N --steps S

Format (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU):
top level an object with "traceEvents" (a list) and optionally "displayTimeUnit" ("ms" | "ns")
and "otherData" (an object); each event an object with "name" (string), "ph" (one character),
"pid" and "tid" (integers) and, except metadata, "ts" (microseconds, a number); "X" events a
"dur" >= 0; "B"/"E" pairs balanced per (pid, tid); "M" events named process_name, thread_name,
process_sort_index or thread_sort_index with the matching "args"; "args" an object.
Exit 1 with the first problem found."""
import argparse, json, math, sys

PHASES = ["WAIT_FOR_READY", "NEGOTIATE", "MEMCPY_IN_FUSION_BUFFER", "RING_ALLREDUCE",
          "MEMCPY_OUT_FUSION_BUFFER"]
KNOWN_PH = set("BEXIiCbneSTpFsftPOND(RMc") | {"M"}
META_ARGS = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
             "thread_sort_index": "sort_index", "process_labels": "labels"}


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_schema(path, doc):
    if not isinstance(doc, dict):
        fail(f"{path}: top level is {type(doc).__name__}, not an object")
    if not isinstance(doc.get("traceEvents"), list):
        fail(f"{path}: no traceEvents list")
    if "displayTimeUnit" in doc and doc["displayTimeUnit"] not in ("ms", "ns"):
        fail(f"{path}: displayTimeUnit {doc['displayTimeUnit']!r} is not 'ms' or 'ns'")
    if "otherData" in doc and not isinstance(doc["otherData"], dict):
        fail(f"{path}: otherData is not an object")
    open_b = {}
    for k, e in enumerate(doc["traceEvents"]):
        where = f"{path}: event {k} ({e.get('name') if isinstance(e, dict) else e!r})"
        if not isinstance(e, dict):
            fail(f"{where}: not an object")
        if not isinstance(e.get("name"), str) or not e["name"]:
            fail(f"{where}: no name")
        ph = e.get("ph")
        if not isinstance(ph, str) or ph not in KNOWN_PH:
            fail(f"{where}: unknown ph {ph!r}")
        for key in ("pid", "tid"):
            if not isinstance(e.get(key), int) or isinstance(e.get(key), bool):
                fail(f"{where}: {key} is not an integer")
        if "args" in e and not isinstance(e["args"], dict):
            fail(f"{where}: args is not an object")
        if ph == "M":
            want = META_ARGS.get(e["name"])
            if want is None:
                fail(f"{where}: unknown metadata event")
            if want not in e.get("args", {}):
                fail(f"{where}: metadata without args.{want}")
            continue
        if not number(e.get("ts")) or e["ts"] < 0:
            fail(f"{where}: ts is not a non-negative number of microseconds")
        if ph == "X" and (not number(e.get("dur")) or e["dur"] < 0):
            fail(f"{where}: complete event without a non-negative dur")
        if ph in "BE":
            stack = open_b.setdefault((e["pid"], e["tid"]), [])
            if ph == "B":
                stack.append(e)
            elif not stack:
                fail(f"{where}: E without a B")
            else:
                stack.pop()
    for key, stack in open_b.items():
        if stack:
            fail(f"{path}: B event {stack[-1]['name']} on pid/tid {key} is never ended")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    a = ap.parse_args()
    if len(a.files) != a.world:
        fail(f"{len(a.files)} timeline files for world size {a.world}")
    tensor_sets = []
    for path in a.files:
        with open(path) as f:
            try:
                doc = json.load(f)
            except json.JSONDecodeError as err:
                fail(f"{path}: not JSON: {err}")
        check_schema(path, doc)
        ev = doc["traceEvents"]
        pids = {e["pid"] for e in ev}
        if len(pids) != 1:
            fail(f"{path}: events of several processes {sorted(pids)}; one rank per file")
        pid = pids.pop()
        names = {e["tid"]: e["args"]["name"] for e in ev
                 if e["ph"] == "M" and e["name"] == "thread_name" and e["tid"] > 0}
        if not names:
            fail(f"{path}: no tensor tracks (thread_name metadata)")
        # phases[tid][step] = {phase: (ts, dur)}
        phases = {}
        buffers = 0
        for e in ev:
            if e["ph"] != "X":
                continue
            if e["tid"] == 0:
                buffers += e["name"] == "FUSED_BUFFER"
                continue
            if e["tid"] not in names:
                fail(f"{path}: event {e['name']} on track {e['tid']} that names no tensor")
            if e["name"] not in PHASES:
                fail(f"{path}: unknown tensor phase {e['name']}")
            step = e.get("args", {}).get("step")
            if not isinstance(step, int):
                fail(f"{path}: {e['name']} of {names[e['tid']]} without args.step")
            slot = phases.setdefault(e["tid"], {}).setdefault(step, {})
            if e["name"] in slot:
                fail(f"{path}: {e['name']} twice for {names[e['tid']]} in step {step}")
            slot[e["name"]] = (e["ts"], e["dur"])
        if buffers == 0:
            fail(f"{path}: no FUSED_BUFFER events")
        for tid, name in sorted(names.items()):
            steps = phases.get(tid, {})
            if sorted(steps) != list(range(1, a.steps + 1)):
                fail(f"{path}: tensor {name} has steps {sorted(steps)}, expected 1..{a.steps}")
            for step, got in sorted(steps.items()):
                missing = [p for p in PHASES if p not in got]
                if missing:
                    fail(f"{path}: tensor {name}, step {step}: missing {', '.join(missing)}")
                # The phases follow each other (0.01 µs of slack for the printed precision).
                for p, q in zip(PHASES, PHASES[1:]):
                    if got[q][0] + 0.01 < got[p][0]:
                        fail(f"{path}: tensor {name}, step {step}: {q} starts before {p}")
        tensor_sets.append((pid, sorted(names.values())))
        print(f"OK: {path}: rank {pid}, {len(ev)} events, {len(names)} tensors x {a.steps} steps x "
              f"{len(PHASES)} phases, {buffers} fused buffers")
    pids = sorted(p for p, _ in tensor_sets)
    if pids != list(range(a.world)):
        fail(f"ranks (pid) {pids}, expected 0..{a.world - 1}")
    if any(t != tensor_sets[0][1] for _, t in tensor_sets):
        fail("the ranks' timelines name different tensors")


if __name__ == "__main__":
    main()
