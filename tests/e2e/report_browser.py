#!/usr/bin/env python3
"""trainrun report in a real browser (Debian's chromium, headless).

  report_browser.py <trainrun> <work dir>

Trains three short runs (the Fashion-MNIST CNN in one process; an MLP under ddp at 2 ranks with
fp16-mixed, every rank writing its metrics; one with the report turned off), then checks:
- the report callback wrote <run_dir>/report.html at the end of each run (and not when off);
- `trainrun report A --compare B` writes one page overlaying both, with the memory estimate of
  `trainrun check` for each run (the pages of the runs' ends say how to get it);
- each page references nothing over the network, loads in chromium with no console message and
  no error, and every chart Chart.js drew has exactly as many points per series as the metrics
  file it came from has lines of that kind (read here from the JSONL, independently);
- the charts the issue asks for are there (loss, lr, grad norm, throughput, step time split,
  memory per rank with the estimate, loss scale and skipped steps under fp16-mixed);
- a screenshot of each page is written to the work dir (a test artifact; not checked in).
Standard library only.
"""
import json
import os
import re
import shutil
import subprocess
import sys

trainrun, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg, flush=True)


def run(args, timeout=300, **kw):
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=work, **kw)
    return r


COMMON = """
[trainer]
max_steps = {steps}
global_batch_size = 32
seed = 3
eval_every = {eval_every}
eval_batch_size = 64
eval_max_batches = 2
log_every = 4
run_dir = "{run_dir}"

[data]
plugin = "idx"
"""

jobs = {
    "cnn": COMMON.format(steps=12, eval_every=6, run_dir="cnn") + """
[model]
plugin = "cnn"
channels = [8, 16]
hidden = 32
""",
    "ddp": COMMON.format(steps=16, eval_every=8, run_dir="ddp") + """
[model]
plugin = "mlp"
hidden = [64]

[launch]
nproc_per_node = 2

[accelerator]
plugin = "gloo-cpu"
threads = 1

[strategy]
plugin = "ddp"

[precision]
plugin = "fp16-mixed"
initial_scale_power = 24

[[callbacks]]
plugin = "metrics"
all_ranks = true
""",
    "off": COMMON.format(steps=3, eval_every=0, run_dir="off") + """
[model]
plugin = "mlp"
hidden = [16]

[[callbacks]]
plugin = "report"
enabled = false
""",
}
for name, text in jobs.items():
    path = os.path.join(work, name + ".toml")
    with open(path, "w") as f:
        f.write(text)
    r = run([trainrun, "--config", path])
    if r.returncode != 0:
        fail(f"training {name} exits {r.returncode}:\n{r.stderr[-3000:]}")
        sys.exit(1)
    page = os.path.join(work, name, "report.html")
    if name == "off":
        if os.path.exists(page):
            fail("[[callbacks]] report with enabled = false still wrote report.html")
    elif not os.path.exists(page):
        fail(f"the run {name} ended without writing {page}:\n{r.stderr[-2000:]}")

r = run([trainrun, "report", "cnn", "--compare", "ddp", "--output", "compare.html"])
if r.returncode != 0:
    fail(f"trainrun report --compare exits {r.returncode}: {r.stderr}")
r = run([trainrun, "report", "no-such-dir"])
if r.returncode != 2 or "no-such-dir" not in r.stderr:
    fail(f"trainrun report on a missing directory: exit {r.returncode} ({r.stderr.strip()}), expected 2 naming it")

# --- what the metrics files hold, read here ----------------------------------------------------


def lines_of(run_dir, file):
    steps = evals = 0
    keys = set()
    with open(os.path.join(work, run_dir, file)) as f:
        for line in f:
            if not line.strip():
                continue
            j = json.loads(line)
            if "eval_loss" in j:
                evals += 1
            elif "loss" in j:
                steps += 1
                keys |= set(j)
    return steps, evals, keys


expected_steps = {"cnn": 12, "ddp": 16}

# --- the pages in chromium -----------------------------------------------------------------------
CAPTURE = """<script>
window.__errors = [];
window.addEventListener('error', function (e) {
  window.__errors.push('error: ' + (e.message || (e.target && (e.target.src || e.target.href)) || 'resource'));
}, true);
window.addEventListener('unhandledrejection', function (e) { window.__errors.push('rejection: ' + e.reason); });
['error', 'warn', 'log', 'info'].forEach(function (level) {
  var orig = console[level];
  console[level] = function () {
    window.__errors.push('console.' + level + ': ' + Array.prototype.join.call(arguments, ' '));
    orig.apply(console, arguments);
  };
});
</script>"""
COLLECT = """<script>
(function () {
  var out = {errors: window.__errors, charts: []};
  try {
    document.querySelectorAll('canvas').forEach(function (cv) {
      var ch = Chart.getChart(cv);
      out.charts.push({canvas: cv.id, drawn: !!ch && cv.width > 0 && cv.height > 0,
        datasets: ch ? ch.data.datasets.map(function (d) {
          return {label: d.label, points: d.data.length,
                  numbers: d.data.filter(function (p) { return typeof p.y === 'number'; }).length};
        }) : []});
    });
    out.report = window.trainrunReport;
  } catch (e) { out.errors.push('collect: ' + e); }
  var pre = document.createElement('pre');
  pre.id = 'test-result';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if not CHROMIUM:
    fail("chromium is not installed (scripts/bootstrap installs Debian's chromium)")
    sys.exit(1)
# A proxy that refuses everything: a page that tried to fetch anything would log an error.
BROWSER = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--proxy-server=127.0.0.1:9", "--user-data-dir=" + os.path.join(work, "chromium-profile")]


def check_page(page, runs, cli):
    html = open(page).read()
    if re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html):
        fail(f"{page} refers to something over the network")
    instrumented = page[:-5] + ".instrumented.html"
    with open(instrumented, "w") as f:
        f.write(html.replace("<head>", "<head>\n" + CAPTURE, 1).replace("</body>", COLLECT + "\n</body>", 1))
    r = run(BROWSER + ["--enable-logging=stderr", "--v=0", "--virtual-time-budget=15000",
                       "--window-size=1300,2400", "--dump-dom", "file://" + instrumented], timeout=180)
    m = re.search(r'<pre id="test-result">(.*?)</pre>', r.stdout, re.S)
    if not m:
        fail(f"{page}: chromium printed no result (exit {r.returncode}): {r.stderr[-2000:]}")
        return
    raw = m.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")
    out = json.loads(raw)
    for e in out["errors"]:
        fail(f"{page}: {e}")
    for line in r.stderr.splitlines():
        if "CONSOLE" in line:
            fail(f"{page}: console: {line}")
    report = out["report"]
    charts = {c["canvas"]: c for c in out["charts"]}
    ids = [c["id"] for c in report["charts"]]
    needed = ["loss", "lr", "grad_norm", "throughput", "step_time", "memory", "memory_peak"]
    if any(n == "ddp" for n in runs):
        needed.append("loss_scale")
    for n in needed:
        if n not in ids:
            fail(f"{page}: no '{n}' chart (charts: {ids})")
    n_series = 0
    for spec in report["charts"]:
        drawn = charts.get("chart-" + spec["id"])
        if not drawn or not drawn["drawn"]:
            fail(f"{page}: chart {spec['id']} was not drawn")
            continue
        if len(drawn["datasets"]) != len(spec["datasets"]):
            fail(f"{page}: chart {spec['id']}: {len(drawn['datasets'])} series drawn, {len(spec['datasets'])} in the data")
            continue
        for d, s in zip(drawn["datasets"], spec["datasets"]):
            run_dir = runs[s["run"]]
            steps, evals, _ = lines_of(run_dir, s["file"])
            want = evals if s["kind"] == "eval" else steps
            n_series += 1
            if want == 0 or d["points"] != want:
                fail(f"{page}: chart {spec['id']} series '{d['label']}': {d['points']} points drawn, "
                     f"{run_dir}/{s['file']} has {want} {s['kind']} lines")
            elif s["kind"] == "train" and want != expected_steps[run_dir]:
                fail(f"{page}: {run_dir}/{s['file']} has {want} step lines, the run made {expected_steps[run_dir]} steps")
            if d["numbers"] == 0:
                fail(f"{page}: chart {spec['id']} series '{d['label']}' has no numeric point")
    labels = {s["label"] for c in report["charts"] for s in c["datasets"]}
    if "ddp" in runs:
        for want in ("rank 0 model state (measured)", "rank 1 model state (measured)", "exposed communication",
                     "loss scale"):
            if not any(want in label for label in labels):
                fail(f"{page}: no series '{want}' (series: {sorted(labels)})")
    # `trainrun report` adds the estimate of `trainrun check`; the page written at the end of a
    # run leaves it out (it would cost every run a second build of the dataset and model).
    for i, name in enumerate(runs):
        estimate = "estimate, ZeRO stage 0 (replicated)"
        has = any(estimate in s["label"] and s["run"] == i for c in report["charts"] for s in c["datasets"])
        if cli and not has:
            fail(f"{page}: no series '{estimate}' for {name} (series: {sorted(labels)})")
        if not cli and (has or "adds trainrun check&#x27;s estimate" not in html and "adds trainrun check's estimate" not in html):
            fail(f"{page}: the page of the run's end should name `trainrun report` for the estimate")
    shot = os.path.join(work, os.path.basename(os.path.dirname(page)) + "-" + os.path.basename(page)[:-5] + ".png")
    r = run(BROWSER + ["--hide-scrollbars", "--virtual-time-budget=15000", "--window-size=1300,2600",
                       "--screenshot=" + shot, "file://" + page], timeout=180)
    if not os.path.exists(shot) or os.path.getsize(shot) < 20000:
        fail(f"{page}: no screenshot ({r.stderr[-500:]})")
    print(f"ok: {page}: {len(report['charts'])} charts, {n_series} series, counts equal to the metrics; "
          f"screenshot {shot}", flush=True)


check_page(os.path.join(work, "cnn", "report.html"), ["cnn"], cli=False)
check_page(os.path.join(work, "ddp", "report.html"), ["ddp"], cli=False)
check_page(os.path.join(work, "compare.html"), ["cnn", "ddp"], cli=True)
sys.exit(1 if failures else 0)
