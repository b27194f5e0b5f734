#!/usr/bin/env python3
"""The docs checked against the binary, so they cannot rot (docs/contributing.md, "Documentation").

  docs_snippets.py <source dir> <trainrun binary> <work dir>

1. Every ```toml block of README.md and docs/*.md is a whole job that `trainrun check` accepts;
   ```toml partial blocks are merged into README's example job first; ```toml illustrative
   blocks are only parsed.
2. Every `trainrun` command line (code blocks and inline code): its subcommand's --help works and
   lists each --option used; `trainrun plugins NAME` runs; a job command on a job file of the
   repository runs as `trainrun check` with the same arguments.
3. Every option `trainrun plugins NAME` lists for each shipped component, and for the core's
   tables, appears on a docs page that names the component.
Standard library only (tomllib: Python 3.11).
"""
import concurrent.futures
import os
import re
import shlex
import subprocess
import sys
import tomllib

src, trainrun, work = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3]
os.makedirs(work, exist_ok=True)
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def pages():
    out = [os.path.join(src, "README.md")]
    docs = os.path.join(src, "docs")
    out += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    return out


def rel(path):
    return os.path.relpath(path, src)


def blocks(text):
    """(info string, first line number, body) of every fenced block."""
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = re.match(r"^(`{3,})(.*)$", lines[i])
        if not m:
            i += 1
            continue
        fence, info, start, body = m.group(1), m.group(2).strip(), i + 1, []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        out.append((info, start + 1, "\n".join(body)))
        i += 1
    return out


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=src, **kw)


# --- a tiny TOML writer: enough for job files (tables, scalars, arrays, arrays of tables) ----
def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(type(v))


def toml_dump(doc):
    out = []
    for k, v in doc.items():
        if isinstance(v, dict):
            out.append(f"[{k}]")
            out += [f"{kk} = {toml_value(vv)}" for kk, vv in v.items()]
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for entry in v:
                out.append(f"[[{k}]]")
                out += [f"{kk} = {toml_value(vv)}" for kk, vv in entry.items()]
        else:
            out.insert(0, f"{k} = {toml_value(v)}")
    return "\n".join(out) + "\n"


def merge(base, frag):
    doc = {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
           for k, v in base.items()}
    for k, v in frag.items():
        if isinstance(v, dict) and isinstance(doc.get(k), dict):
            doc[k].update(v)
        elif isinstance(v, list) and isinstance(doc.get(k), list):
            doc[k] = doc[k] + v
        else:
            doc[k] = v
    return doc


# --- 1. TOML blocks ---------------------------------------------------------------------------
readme = open(os.path.join(src, "README.md")).read()
base_job = None
for info, line, body in blocks(readme):
    if info == "toml":
        base_job = tomllib.loads(body)
        break
if base_job is None:
    fail("README.md has no whole ```toml job to merge partial snippets into")
    base_job = {}

n_toml = 0
for page in pages():
    for info, line, body in blocks(open(page).read()):
        words = info.split()
        if not words or words[0] != "toml":
            continue
        n_toml += 1
        where = f"{rel(page)}:{line}"
        try:
            doc = tomllib.loads(body)
        except tomllib.TOMLDecodeError as e:
            fail(f"{where}: not TOML: {e}")
            continue
        kind = words[1] if len(words) > 1 else "job"
        if kind == "illustrative":
            continue
        if kind == "partial":
            doc = merge(base_job, doc)
        elif kind != "job":
            fail(f"{where}: unknown marker '```toml {kind}' (use partial or illustrative)")
            continue
        job = os.path.join(work, f"snippet-{n_toml}.toml")
        with open(job, "w") as f:
            f.write(toml_dump(doc) if kind == "partial" else body + "\n")
        r = run([trainrun, "check", "--config", job])
        if r.returncode != 0:
            fail(f"{where}: `trainrun check` refuses the {kind} snippet (exit {r.returncode}): "
                 + r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "")

# --- 2. command lines -------------------------------------------------------------------------
SUBCOMMANDS = None  # from `trainrun --help`: the words after "trainrun" on its usage lines
r = run([trainrun, "--help"])
if r.returncode != 0:
    fail("trainrun --help failed")
SUBCOMMANDS = set(re.findall(r"^\s*(?:usage:)?\s*trainrun ([a-z][a-z-]*)", r.stdout, re.M))
SUBCOMMANDS |= {w for line in re.findall(r"^\s*(?:usage:)?\s*trainrun ([a-z|-]+)", r.stdout, re.M)
                for w in line.split("|")}
help_cache = {}


def help_of(sub):
    if sub not in help_cache:
        args = [trainrun] + ([] if sub == "train" else sub.split()) + ["--help"]
        r = run(args)
        help_cache[sub] = (r.returncode, r.stdout + r.stderr)
    return help_cache[sub]


def command_lines(text):
    """(line number, command, dry-run it?) of every trainrun command: code-block lines and inline code."""
    out = []
    for info, start, body in blocks(text):
        if info.split()[:1] in (["toml"], ["cpp"], ["cmake"]):
            continue
        lines = body.split("\n")
        # A transcript (`$ command` then its output): only the `$` lines are commands.
        if any(l.startswith("$ ") for l in lines):
            lines = [l if l.startswith("$ ") else "" for l in lines]
        dry = "illustrative" not in info.split()
        i = 0
        while i < len(lines):
            n, cmd = start + i, lines[i]
            while cmd.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
            cmd = re.sub(r"^\s*\$\s+", "", cmd)
            m = re.search(r"(?:^|\|\s*|^mpiexec .*?\s)(trainrun|scripts/run)(\s.*)?$", cmd.strip())
            if m and (cmd.strip().startswith(("trainrun", "scripts/run", "mpiexec")) or "|" in cmd):
                out.append((n, m.group(1) + (m.group(2) or ""), dry))
    for n, line in enumerate(text.split("\n"), 1):
        for span in re.findall(r"`(trainrun [^`]+)`", line):
            out.append((n, span, True))
    return out


def strip_comment(cmd):
    return re.split(r"\s+#\s", cmd, maxsplit=1)[0].strip()


n_cmd = n_dry = 0
for page in pages():
    for line, cmd, dry in command_lines(open(page).read()):
        where = f"{rel(page)}:{line}"
        cmd = strip_comment(cmd)
        n_cmd += 1
        try:
            words = shlex.split(cmd.split(" | ")[0].split(" < ")[0].split(" > ")[0])
        except ValueError:
            words = cmd.split()
        if words[0] == "scripts/run":
            words = ["trainrun", "--config"] + words[1:]
        args = words[1:]
        sub = "train"
        if args and not args[0].startswith("-"):
            sub = args[0]
            if sub == "bench" and len(args) > 1 and not args[1].startswith("-"):
                sub = "bench " + args[1]
            elif sub not in SUBCOMMANDS:
                fail(f"{where}: `{cmd}`: 'trainrun {sub}' is not a command of `trainrun --help`")
                continue
        rc, text = help_of(sub)
        if rc != 0:
            fail(f"{where}: `trainrun {sub} --help` exits {rc}")
            continue
        for opt in re.findall(r"(?:^|[\s\[|])(--[a-z][a-z0-9-]*)", " ".join(args)):
            if not re.search(re.escape(opt) + r"(?![a-z0-9-])", text):
                fail(f"{where}: `{cmd}`: {opt} is not in `trainrun {sub} --help`")
        if sub == "plugins" and len(args) > 1 and re.fullmatch(r"[a-z0-9-]+", args[1]):
            r = run([trainrun, "plugins", args[1]])
            if r.returncode != 0:
                fail(f"{where}: `{cmd}` exits {r.returncode}")
        if dry and sub in ("train", "check") and "--config" in args[:-1]:
            cfg = args[args.index("--config") + 1]
            if os.path.exists(os.path.join(src, cfg)) and cfg.startswith("configs/"):
                rest = [a for a in args if a != "check"]
                r = run([trainrun, "check"] + rest)
                n_dry += 1
                if r.returncode != 0:
                    last = (r.stderr.strip().splitlines() or ["?"])[-1]
                    fail(f"{where}: `{cmd}` as `trainrun check` exits {r.returncode}: {last}")

# --- 3. every option of every shipped component is documented --------------------------------
r = run([trainrun, "plugins"])
components = []
for row in r.stdout.splitlines()[1:]:
    parts = row.split()
    if len(parts) >= 6 and not row.startswith("skipped"):
        components.append(parts[0])
if len(components) < 20:
    fail(f"`trainrun plugins` lists only {len(components)} components; the check would prove little")
texts = {page: open(page).read() for page in pages()}


def names_component(text, name):
    return f"`{name}`" in text or f'"{name}"' in text


def documents_option(text, opt):
    if re.search(r"`" + re.escape(opt) + r"(?=[`\s=.\[(])", text):
        return True
    for info, _, body in blocks(text):
        if info.split()[:1] == ["toml"] and re.search(r"^\s*#?\s*" + re.escape(opt) + r"\s*=", body, re.M):
            return True
    # The job-file overview lists keys in TOML comments ("# max_steps | max_epochs, ...").
    return re.search(r"#.*\b" + re.escape(opt) + r"\b", text) is not None


n_opt = 0
names = components + ["trainer", "launch", "parallel", "eval", "plugins"]
# Each call loads every plugin (about a second here): four at a time.
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    tables = list(pool.map(lambda n: run([trainrun, "plugins", n]).stdout, names))
for name, table in zip(names, tables):
    rows = table.splitlines()
    try:
        header = next(i for i, l in enumerate(rows) if l.split()[:2] == ["option", "type"])
    except StopIteration:
        fail(f"`trainrun plugins {name}` printed no option table")
        continue
    for row in rows[header + 1:]:
        opt = row.split()[0]
        if name in ("trainer", "launch", "parallel", "eval", "plugins"):
            scope = [t for t in texts.values() if f"[{name}]" in t]
        else:
            scope = [t for t in texts.values() if names_component(t, name)]
        n_opt += 1
        if not any(documents_option(t, opt) for t in scope):
            fail(f"option '{opt}' of '{name}' (trainrun plugins {name}) is on no docs page "
                 f"that names `{name}`")

print(f"checked {n_toml} TOML snippets, {n_cmd} command lines ({n_dry} dry runs), "
      f"{n_opt} options of {len(components)} components + the core's tables")
if n_toml < 3 or n_cmd < 20 or n_dry < 3:
    fail("too few snippets found: the extraction is broken")
sys.exit(1 if failures else 0)
