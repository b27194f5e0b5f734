"""The `rewards` reward plugin (ABI 1.10) through `trainrun reward` and `trainrun check`.

--part plugins: fixed rows scored by accuracy (last number; an <answer> tag), format, length
(DAPO's soft overlong punishment in characters, linear in tokens), with two of them weighted;
every score and the weighted sum against values computed here independently: Python's `re` for
the regexes and answers, TRL 1.16's think_format_reward and get_soft_overlong_punishment for the
format and overlong rewards, numpy's nansum for TRL's combination. Then the bad jobs `trainrun
check` must refuse with exit 2, naming the [[rewards]] entry and the key.

--part command: the command reward with a small Python judge (kept running: its pid is the same
for every batch; the row's fields reach it), then one judge per way of misbehaving (exits,
hangs, prints a non-number, prints too many lines, prints too few): each must end `trainrun
reward` with exit 2 and a message naming the reward, the row and what went wrong.

usage: rewards_check.py TRAINRUN WORK --part plugins|command
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np

ROWS = [
    {"prompt": "2+2?", "completion": "<think>add</think> <answer>4</answer> so 4.", "solution": "4"},
    {"prompt": "price?", "completion": "It costs 1,234.50 dollars", "solution": 1234.5},
    {"prompt": "7?", "completion": "no idea", "solution": "7"},
    {"prompt": "capital?", "completion": "<think>x\ny</think>\n<answer> Paris </answer>",
     "solution": "paris"},
    {"prompt": "two tags", "completion": "<answer>3</answer> then <answer>5</answer>",
     "solution": "5"},
    {"prompt": "negative", "completion": "<think>\n</think><answer>-3</answer>", "solution": "-3.0"},
    {"prompt": "long", "completion": "é" * 35 + " 12", "solution": 13},
    {"prompt": "longer", "completion": "<think>" + "a" * 60 + "</think>", "solution": "1"},
    {"prompt": "empty", "completion": "", "solution": "0"},
    {"prompt": "wrong", "completion": "<answer>six</answer> or 6", "solution": "7"},
]
for i, r in enumerate(ROWS):
    r["completion_ids"] = list(range(3 * i % 11 + 1))  # 1..11 tokens, around max 8
    r["tag"] = f"t{i}"

NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
ANSWER = r"<answer>(.*?)</answer>"
THINK = r"^<think>(?!.*<think>)(.*?)</think>.*$"  # TRL's think_format_reward

# Rewards need no model; a job names one all the same (a [[rewards]] table joins a whole job).
JOB_HEAD = """
[model]
plugin = "mlp"
[data]
plugin = "idx"
[trainer]
run_dir = "{work}/run"
"""


def fail(msg):
    print("FAIL:", msg, file=sys.stderr)
    sys.exit(1)


def run(args, **kw):
    p = subprocess.run(args, capture_output=True, text=True, timeout=120, **kw)
    return p.returncode, p.stdout, p.stderr


def expect_refusal(what, args, pattern):
    """`trainrun ARGS` must exit 2 with a message matching `pattern`; prints that message."""
    rc, out, err = run(args)
    if rc != 2 or not re.search(pattern, err):
        print(out, err)
        fail(f"{what}: expected exit 2 and /{pattern}/, got exit {rc}")
    print(f"{what}: {err.strip().splitlines()[-1]}")


def as_number(s):
    t = s.strip().replace(",", "").replace(" ", "")
    t = t[1:] if t.startswith("+") else t
    t = t[:-1] if t.endswith(".") else t
    return float(t) if re.fullmatch(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", t) else None


def accuracy(completion, solution, pattern, no_answer):
    matches = list(re.finditer(pattern, completion, re.DOTALL))
    if not matches:
        return float("nan") if no_answer == "none" else 0.0
    m = matches[-1]
    answer = m.group(1) if m.re.groups else m.group(0)
    ref = solution if isinstance(solution, str) else json.dumps(solution)
    a, b = as_number(answer), as_number(ref)
    if a is not None and b is not None:
        return 1.0 if a == b else 0.0
    return 1.0 if answer.strip().lower() == ref.strip().lower() else 0.0


def part_plugins(trainrun, work):
    from trl.rewards import get_soft_overlong_punishment, think_format_reward

    rows_file = os.path.join(work, "rows.jsonl")
    with open(rows_file, "w") as f:
        for r in ROWS:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    job = os.path.join(work, "job.toml")
    with open(job, "w") as f:
        f.write(JOB_HEAD.format(work=work) + textwrap.dedent(f"""
        [[rewards]]
        plugin = "accuracy"
        name = "last_number"

        [[rewards]]
        plugin = "accuracy"
        name = "answer_tag"
        pattern = '{ANSWER}'
        no_answer = "none"
        weight = 0.5

        [[rewards]]
        plugin = "format"
        pattern = '{THINK}'
        multiline = true
        weight = 0.25

        [[rewards]]
        plugin = "length"
        name = "overlong"
        unit = "characters"
        max_completion_length = 40
        soft_punish_cache = 10

        [[rewards]]
        plugin = "length"
        name = "linear"
        kind = "linear"
        max_completion_length = 8
        weight = -2.0
        """))
    rc, out, err = run([trainrun, "reward", "--config", job, "--input", rows_file, "--batch-size", "4"])
    print(err)
    if rc != 0:
        fail(f"trainrun reward exited with {rc}")
    got = [json.loads(l) for l in out.splitlines()]
    if len(got) != len(ROWS):
        fail(f"{len(got)} lines for {len(ROWS)} rows")

    comps = [r["completion"] for r in ROWS]
    expected = {
        "last_number": [accuracy(r["completion"], r["solution"], NUMBER, "zero") for r in ROWS],
        "answer_tag": [accuracy(r["completion"], r["solution"], ANSWER, "none") for r in ROWS],
        "format": think_format_reward([[{"content": c}] for c in comps]),
        "overlong": get_soft_overlong_punishment(40, 10)(completion_ids=[list(c) for c in comps]),
        "linear": [-len(r["completion_ids"]) / 8 for r in ROWS],
    }
    weights = {"last_number": 1.0, "answer_tag": 0.5, "format": 0.25, "overlong": 1.0, "linear": -2.0}
    names = list(expected)
    total = np.nansum(np.array([[weights[n] * expected[n][i] for n in names] for i in range(len(ROWS))]),
                      axis=1)
    # Each reward must give both outcomes somewhere, or the check could not tell them apart.
    for n in ["last_number", "answer_tag", "format"]:
        vals = set(v for v in expected[n] if not math.isnan(v))
        if vals != {0.0, 1.0}:
            fail(f"the rows do not exercise {n} both ways: {expected[n]}")
    if not any(math.isnan(v) for v in expected["answer_tag"]):
        fail("no row without an answer tag")
    if len(set(expected["overlong"])) < 3:
        fail(f"the rows do not reach the overlong ramp: {expected['overlong']}")
    compared = 0
    for i, line in enumerate(got):
        if line["row"] != i:
            fail(f"line {i} is row {line['row']}")
        for n in names:
            g, e = line["rewards"][n], expected[n][i]
            if math.isnan(e):
                if g is not None:
                    fail(f"row {i} {n}: expected no reward (null), got {g}")
            elif g is None or abs(g - e) > 1e-12:
                fail(f"row {i} {n}: expected {e}, got {g}")
            compared += 1
        if abs(line["reward"] - total[i]) > 1e-12:
            fail(f"row {i} weighted sum: expected {total[i]}, got {line['reward']}")
        compared += 1
    print(f"{compared} scores equal the reference")

    # `trainrun check` lists the rewards, with their weights, and accepts the job.
    rc, out, err = run([trainrun, "check", "--config", job])
    if rc != 0 or "reward      accuracy 'answer_tag' x 0.5" not in out:
        print(out, err)
        fail(f"trainrun check of the good job: exit {rc}")

    bad = [
        ("unknown plugin", 'plugin = "acuracy"', r"\[\[rewards\]\]\[0\].*unknown reward plugin 'acuracy'.*did you mean 'accuracy'"),
        ("unknown key", 'plugin = "format"\npattern = "x"\npatern = "y"',
         r"unknown key 'patern' in \[\[rewards\]\]\[0\] \(plugin 'format'\); did you mean 'pattern'"),
        ("missing pattern", 'plugin = "format"', r"\[\[rewards\]\]\[0\] \(plugin 'format'\) is missing required key 'pattern'"),
        ("bad regex", 'plugin = "format"\npattern = "(<answer>"',
         r"reward 'format' \(plugin rewards, .*\): create failed: \[\[rewards\]\]\[0\] \(.*bad.toml\): option 'pattern': the regular expression does not compile at offset 9"),
        ("bad weight type", 'plugin = "format"\npattern = "x"\nweight = "high"', r"bad\.toml:\d+:\d+: \[\[rewards\]\]\[0\] weight: expected float, got string \"high\""),
        ("length without max", 'plugin = "length"', r"create failed: \[\[rewards\]\]\[0\] \(.*\): option 'max_completion_length' must be set"),
        ("cache too big", 'plugin = "length"\nmax_completion_length = 8\nsoft_punish_cache = 9',
         r"option 'soft_punish_cache' must be in \[1, 8\]"),
        ("command missing", 'plugin = "command"', r"option 'command' must name a program"),
        ("command not executable", 'plugin = "command"\ncommand = ["./no-such-judge.py"]',
         r"option 'command': '.*no-such-judge.py' is not an executable file"),
        ("duplicate name", 'plugin = "format"\npattern = "x"\n\n[[rewards]]\nplugin = "format"\npattern = "y"',
         r"\[\[rewards\]\]\[1\]: the name 'format' is \[\[rewards\]\]\[0\]'s too"),
        ("not an array", None, r"'rewards' must be an array of tables \(\[\[rewards\]\]\)"),
    ]
    for what, body, pattern in bad:
        path = os.path.join(work, "bad.toml")
        with open(path, "w") as f:
            f.write(JOB_HEAD.format(work=work))
            f.write("\n[rewards]\nplugin = \"format\"\n" if body is None else "\n[[rewards]]\n" + body + "\n")
        expect_refusal("check refuses " + what, [trainrun, "check", "--config", path], pattern)
    # A row without the reference field: exit 2 naming the reward, the row and the field.
    rows2 = os.path.join(work, "rows2.jsonl")
    with open(rows2, "w") as f:
        f.write(json.dumps({"completion": "4", "solution": "4"}) + "\n")
        f.write(json.dumps({"completion": "5", "answer": "5"}) + "\n")
    expect_refusal("a row without 'solution'", [trainrun, "reward", "--config", job, "--input", rows2],
                   r"\[\[rewards\]\]\[0\] 'last_number' \(plugin accuracy\): row 1 has no field 'solution'")
    # unit = "tokens" without token ids.
    rows3 = os.path.join(work, "rows3.jsonl")
    with open(rows3, "w") as f:
        f.write(json.dumps({"completion": "4", "solution": "4"}) + "\n")
    expect_refusal("a row without completion_ids", [trainrun, "reward", "--config", job, "--input", rows3],
                   r"'linear' \(plugin length\): score failed: row 0: no completion token ids")
    print("PASS")


JUDGE = """\
import json, os, sys
mode = sys.argv[1]
n = 0
for line in sys.stdin:
    row = json.loads(line)
    n += 1
    if mode == "good":
        # the row's own field ("level") comes through; the pid shows one process for every batch
        print(len(row["completion"]) + 0.5 * row["level"] if row["level"] >= 0 else "nan", flush=True)
        sys.stderr.write(f"judge pid {os.getpid()}\\n")
    elif mode == "exits":
        if n == 3:
            sys.exit(3)
        print(1.0, flush=True)
    elif mode == "hangs":
        if n == 2:
            import time; time.sleep(60)
        print(1.0, flush=True)
    elif mode == "word":
        print("1.0" if n != 2 else "great", flush=True)
    elif mode == "extra":
        # one write, so the extra line is there with the batch's last answer
        sys.stdout.write("1.0\\n2.0\\n" if n == 4 else "1.0\\n")
        sys.stdout.flush()
    elif mode == "fewer":
        if n != 2:
            print(1.0, flush=True)
"""


def part_command(trainrun, work):
    judge = os.path.join(work, "judge.py")
    with open(judge, "w") as f:
        f.write(JUDGE)
    rows_file = os.path.join(work, "rows.jsonl")
    rows = [{"prompt": f"p{i}", "completion": "x" * (i + 1), "level": i if i != 4 else -1} for i in range(6)]
    with open(rows_file, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")

    def job_for(mode, timeout="5s"):
        path = os.path.join(work, f"job-{mode}.toml")
        with open(path, "w") as f:
            f.write(JOB_HEAD.format(work=work) + textwrap.dedent(f"""
            [[rewards]]
            plugin = "command"
            name = "judge"
            command = ["{sys.executable}", "judge.py", "{mode}"]
            timeout_s = "{timeout}"
            weight = 2.0
            """))
        return path

    rc, out, err = run([trainrun, "reward", "--config", job_for("good"), "--input", rows_file,
                        "--batch-size", "4"], cwd="/")
    print(err)
    if rc != 0:
        fail(f"the good judge: exit {rc}")
    got = [json.loads(l) for l in out.splitlines()]
    for r, g in zip(rows, got):
        e = len(r["completion"]) + 0.5 * r["level"] if r["level"] >= 0 else None
        if g["rewards"]["judge"] != e or g["reward"] != (2 * e if e is not None else 0.0):
            fail(f"row {g['row']}: expected {e}, got {g}")
    if len(got) != len(rows):
        fail(f"{len(got)} lines for {len(rows)} rows")
    pids = set(re.findall(r"judge pid (\d+)", err))
    if len(pids) != 1 or len(re.findall(r"judge pid", err)) != len(rows):
        fail(f"the judge was not one process kept running over two batches: pids {pids}")
    print("the good judge: every score as computed, one process over 2 batches")

    bad = [
        ("exits", "5s", r"program '.*judge.py exits' exited with status 3 before answering row 2 \(2 of 4 answers received\)"),
        ("hangs", "1s", r"program '.*judge.py hangs' gave no answer for row 1 within 1 s \(option timeout_s; 1 of 4 answers"),
        ("word", "5s", r"program '.*judge.py word' answered \"great\" for row 1, which is not a number"),
        ("extra", "5s", r"program '.*judge.py extra' wrote more lines than it was sent completions \(4 sent; an extra line \"2\.0\"\)"),
        ("fewer", "1s", r"program '.*judge.py fewer' gave no answer for row 3 within 1 s .*3 of 4 answers received"),
    ]
    for mode, timeout, pattern in bad:
        expect_refusal(f"judge that {mode}",
                       [trainrun, "reward", "--config", job_for(mode, timeout), "--input", rows_file,
                        "--batch-size", "4"],
                       r"trainrun reward: error: \[\[rewards\]\]\[0\] 'judge' \(plugin command\): score failed: "
                       + pattern)
    print("PASS")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trainrun")
    ap.add_argument("work")
    ap.add_argument("--part", choices=["plugins", "command"], required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    work = os.path.abspath(a.work)
    (part_plugins if a.part == "plugins" else part_command)(os.path.abspath(a.trainrun), work)


if __name__ == "__main__":
    main()
