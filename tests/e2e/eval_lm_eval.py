#!/usr/bin/env python3
"""`trainrun eval` against EleutherAI's lm-evaluation-harness (lm_eval 0.4.13, its "hf" model).

A tiny Llama (hidden 64, 2 layers, 4 heads of which 2 key/value, 256 positions, float32), trained
450 steps on the GPL 3 (tiny_models.stable_text) and on "Q: ...\nA: ..." drills made from it, so
that its choices, greedy flags and generations mean something, with tiny_models.bpe_tokenizer
(prepends <s>), is built once into WORK/model (~15 s). Five YAML tasks in lm-eval's format read
local JSONL files made from the same text (WORK/tasks, WORK/data), each 15-30 documents:

  tr_mc           multiple_choice, zero-shot: the next word of a sentence among 4 (doc_to_choice a
                  feature, doc_to_target an index; acc, acc_norm); one query ends in a space (lm-eval
                  moves it into the continuation) and some distractors are not ASCII (acc_norm
                  divides by characters, not bytes); acc is 1 (its stderr 0)
  tr_mc_fewshot   the same with "Question: ...\\nAnswer:", doc_to_choice "{{choices}}" (a rendered
                  Python list literal), a description, 3 shots from a separate train split
  tr_mc_selfshot  2 shots drawn from the test split itself (lm-eval draws 3 and drops the document),
                  the target as the choice's text, target_delimiter " ", fewshot_delimiter "\\n"
  tr_ppl          loglikelihood_rolling over GPL paragraphs (word/byte perplexity, bits per byte),
                  four of them longer than 256 tokens (2-3 rolling windows), one with non-ASCII
                  quotes, most starting with spaces (lm-eval counts the empty first "word")
  tr_gen          generate_until "\\n" or "." (12 tokens at most, greedy), 2 shots from a train split,
                  exact_match (ignore case and punctuation) under two filters: "strict" (regex (\\w+),
                  take_first) and "none" (take_first); generations end at "\\n", at "." and at
                  max_gen_toks

Case `main` runs lm_eval.simple_evaluate (model "hf", pretrained=WORK/model, dtype float32, cpu,
batch size 1, log_samples, TaskManager(include_path=WORK/tasks), lm-eval's default seeds: fewshot
1234), then `trainrun eval --model WORK/model --tasks WORK/tasks --output WORK/trainrun/results.json
--log-samples WORK/trainrun/samples` (exit 0), and compares per task and document: the requests'
arguments (contexts, continuations, few-shot order), every loglikelihood (1e-4 relative or 1e-5
absolute), the is_greedy flags, generated strings, filtered responses and per-document metrics,
then results.json's aggregates (acc and exact_match exactly, perplexities 1e-4 relative, stderrs
1e-6 relative or "N/A" alike), "n-shot", "versions", "higher_is_better", "n-samples".
lm-eval's own outputs are kept in WORK/lm_eval (results.json, samples_<task>.jsonl: one line per
document and filter, lm-eval's in-memory sample with numbers left numbers).

trainrun's samples_<task>.jsonl must have the layout of lm-eval's own sample files (its
EvaluationTracker: one line per document and filter, arguments {"gen_args_i": {"arg_j": ..}}, the
target and answers through Python's str()); values are compared after undoing the str().

Case `ranks`: the same tasks as a training run's [eval] table ([launch] nproc_per_node = 2, under
ddp, then fsdp): scored before the first step and after one step at lr 0, each rank answering a
share of the requests; both evaluations must agree with lm-eval as above, and their aggregates
must be in metrics.jsonl as eval_tasks/<task>/<metric>,<filter> and in report.html's table.

Case `errors`: trainrun eval exits 2 naming the culprit on a YAML with an unknown output_type (the
file and "output_type"), an unknown metric (its name), a doc_to_text referring to a field the data
lacks (the task and the field) and a --tasks path that does not exist (the path), writing no
results. lm-eval's own verdict on the same files is printed.

lm-eval takes about 10 s here (2 cores; 3 s of it importing); its outputs are reused while their
inputs (model, tasks, data, this script, the reference packages' versions: WORK/lm_eval/KEY) are
unchanged, --fresh-reference reruns it. --reference-only runs lm-eval alone and prints what it
produced (no trainrun).

usage: eval_lm_eval.py TRAINRUN WORK [--case main|errors|ranks] [--reference-only] [--fresh-reference]
"""
import argparse
import contextlib
import glob
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tiny_models  # noqa: E402

TASKS = ["tr_mc", "tr_mc_fewshot", "tr_mc_selfshot", "tr_ppl", "tr_gen"]
MODEL_VERSION = "eval-llama-v5"  # bump when the model recipe below changes (the cache is rebuilt)
TRAIN_STEPS, BATCH, LR = 450, 8, 3e-3  # ~15 s on one core
MAX_POS = 256
REL, ABS = 1e-4, 1e-5  # loglikelihoods and perplexities
STDERR_REL = 1e-6
EXACT_METRICS = {"acc", "acc_norm", "exact_match"}
HASHES = ("doc_hash", "prompt_hash", "target_hash")


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def setup_env(work):
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("LMEVAL_LOG_LEVEL", "WARNING")
    # datasets' Arrow cache of the JSONL files stays in the work dir, not ~/.cache.
    os.environ["HF_DATASETS_CACHE"] = os.path.join(work, "hf-datasets-cache")


# --------------------------------------------------------------------------- the model
def build_model(work, steps=TRAIN_STEPS):
    """The tiny Llama and its tokenizer in WORK/model, trained `steps` steps, built once (the
    recipe's version and the steps in .complete)."""
    out = os.path.join(work, "model")
    stamp = os.path.join(out, ".complete")
    version = f"{MODEL_VERSION} steps={steps}"
    if os.path.exists(stamp) and open(stamp).read().strip() == version:
        return out
    import torch
    import transformers as t

    t0 = time.time()
    # One thread: as fast as two for this size, and much faster than two on a busy machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    shutil.rmtree(out, ignore_errors=True)
    text = tiny_models.stable_text()
    tok = tiny_models.bpe_tokenizer([text])
    torch.manual_seed(0)
    cfg = t.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_POS,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                        tie_word_embeddings=False)
    model = t.LlamaForCausalLM(cfg)
    # A few hundred AdamW steps on windows of 128 tokens (each after <s>), so that the next-word
    # choices, the greedy flags and the generated text are not noise; the corpus is the text, then
    # drills in tr_gen's format, "Q: <a sentence's first words>\nA: <what follows>", every
    # sentence once (drill()). The tokenizer stays trained on the text alone.
    sents = sentences(text)
    drills = [f"Q: {d[0]}\nA: {d[1]}" for d in (drill(sents, j) for j in range(len(sents))) if d]
    ids = torch.tensor(tok(text + "\n\n" + "\n\n".join(drills), add_special_tokens=False)["input_ids"])
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    g = torch.Generator().manual_seed(0)
    window = 128
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        offs = torch.randint(0, len(ids) - window, (BATCH,), generator=g).tolist()
        x = torch.stack([torch.cat([torch.tensor([tok.bos_token_id]), ids[o:o + window - 1]]) for o in offs])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.set_num_threads(threads)
    model.eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    if not os.path.exists(os.path.join(out, "model.safetensors")):
        fail(f"transformers wrote no model.safetensors in {out}")
    with open(stamp, "w") as f:
        f.write(version + "\n")
    trained = f"{steps} steps, final loss {loss.item():.3f}" if steps else "untrained"
    print(f"model: built {out} ({trained}, {time.time() - t0:.1f} s)")
    return out


# --------------------------------------------------------------------------- the tasks
def q(s):
    """A YAML double-quoted scalar (JSON's string syntax is YAML's)."""
    return json.dumps(s, ensure_ascii=False)


def sentences(text):
    flat = re.sub(r"\s+", " ", text)
    return [s.strip() for s in re.split(r"(?<=[.;:])\s+", flat) if s.strip()]


def word_pool(text):
    return sorted({w for w in re.findall(r"[a-z]+", text) if 3 <= len(w) <= 10})


DESCRIPTION = "Pick the next word.\n\n"
FEWSHOT_TEXT = "Question: {{query}}\nAnswer:"
GEN_TEXT = "Q: {{question}}\nA:"
GEN_REGEX = r"(\w+)"
MISSING_TEXT = "Context: {{passage}}\nQ: {{question}}\nA:"
NON_ASCII = ["café", "naïve", "über", "façade", "señor", "déjà"]


def cloze(sents, pool, tag, count, start, stride, non_ascii=False, exclude=()):
    """Docs {query, choices, gold, answer}: the first k words of a sentence, the true next word
    among 4; every choice a plain word. Deterministic (random.Random seeded with a string).
    Sentences start, start + stride, ... (mod their number), skipping `exclude`; returns the docs
    and the sentences used."""
    docs, used = [], []
    for j in range(len(sents)):
        if len(docs) == count:
            break
        i = (start + j * stride) % len(sents)
        if i in exclude:
            continue
        words = sents[i].split(" ")
        rng = random.Random(f"{tag}:{len(docs)}")
        k = rng.randint(4, 8)
        if len(words) <= k or not words[k].isalpha() or len(words[k]) < 2:
            continue
        true = words[k]
        distract = []
        while len(distract) < 3:
            w = rng.choice(pool)
            if w.lower() != true.lower() and w not in distract:
                distract.append(w)
        if non_ascii and len(docs) % 4 == 1:
            distract[0] = NON_ASCII[(len(docs) // 4) % len(NON_ASCII)]
        gold = rng.randrange(4)
        choices = distract[:gold] + [true] + distract[gold:]
        docs.append({"query": " ".join(words[:k]), "choices": choices, "gold": gold, "answer": true})
        used.append(i)
    if len(docs) < count:
        raise RuntimeError(f"{tag}: only {len(docs)} of {count} documents")
    return docs, set(used)


def drill(sents, j):
    """The training drill of sentence j: (question, answer), the answer the next word, or the
    next word and a full stop (j = 2 mod 4), or the rest of the sentence (j = 0 mod 4), so that
    generations stop at the line break, at "." and at max_gen_toks. None if the sentence is too
    short."""
    words = sents[j].split(" ")
    k = random.Random(f"drill:{j}").randint(4, 8)
    if len(words) <= k:
        return None
    answer = " ".join(words[k:]) if j % 4 == 0 else words[k] + "." if j % 4 == 2 else words[k]
    return " ".join(words[:k]), answer


def write_text(path, text):
    """Writes `text` unless the file already holds it (so that datasets' cache of the JSONL
    files, keyed by their modification times, is reused from run to run)."""
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    except OSError:
        pass
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_jsonl(path, docs):
    write_text(path, "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs))


def dataset_block(files):
    lines = ["dataset_path: json", "dataset_kwargs:", "  data_files:"]
    lines += [f"    {split}: {q(path)}" for split, path in files.items()]
    return "\n".join(lines)


def metric_block(metrics):
    lines = ["metric_list:"]
    for name, agg, hib, extra in metrics:
        lines += [f"  - metric: {name}", f"    aggregation: {agg}", f"    higher_is_better: {str(hib).lower()}"]
        lines += [f"    {k}: {v}" for k, v in extra.items()]
    return "\n".join(lines)


def build_tasks(work):
    """JSONL data in WORK/data and lm-eval YAML task files in WORK/tasks (made each run, the same
    each time; files already holding it are left alone)."""
    data = os.path.join(work, "data")
    tasks = os.path.join(work, "tasks")
    for d in (data, tasks):
        os.makedirs(d, exist_ok=True)
    text = tiny_models.stable_text()
    sents = sentences(text)
    pool = word_pool(text)
    acc_metrics = [("acc", "mean", True, {}), ("acc_norm", "mean", True, {})]
    yamls = {}

    # a. zero-shot multiple choice; one query ending in a space, some non-ASCII distractors.
    mc, _ = cloze(sents, pool, "tr_mc", 24, 0, 7, non_ascii=True)
    mc[5]["query"] += " "
    write_jsonl(os.path.join(data, "tr_mc_test.jsonl"), [{k: d[k] for k in ("query", "choices", "gold")} for d in mc])
    yamls["tr_mc"] = f"""task: tr_mc
{dataset_block({"test": os.path.join(data, "tr_mc_test.jsonl")})}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{query}}}}"
doc_to_choice: choices
doc_to_target: gold
{metric_block(acc_metrics)}
metadata:
  version: 1.0
"""

    # b. 3 shots from a train split, a description, choices rendered as a Python list literal.
    fs_test, used = cloze(sents, pool, "tr_mc_fewshot", 20, 1, 9)
    fs_train, _ = cloze(sents, pool, "tr_mc_fewshot_train", 30, 2, 5, exclude=used)
    strip = lambda ds: [{k: d[k] for k in ("query", "choices", "gold")} for d in ds]  # noqa: E731
    write_jsonl(os.path.join(data, "tr_mc_fewshot_test.jsonl"), strip(fs_test))
    write_jsonl(os.path.join(data, "tr_mc_fewshot_train.jsonl"), strip(fs_train))
    yamls["tr_mc_fewshot"] = f"""task: tr_mc_fewshot
{dataset_block({"test": os.path.join(data, "tr_mc_fewshot_test.jsonl"),
                "train": os.path.join(data, "tr_mc_fewshot_train.jsonl")})}
test_split: test
fewshot_split: train
output_type: multiple_choice
description: {q(DESCRIPTION)}
doc_to_text: {q(FEWSHOT_TEXT)}
doc_to_choice: "{{{{choices}}}}"
doc_to_target: gold
num_fewshot: 3
{metric_block(acc_metrics)}
metadata:
  version: 1.0
"""

    # c. 2 shots from the test split itself; the target is the choice's text.
    ss, _ = cloze(sents, pool, "tr_mc_selfshot", 20, 3, 11)
    write_jsonl(os.path.join(data, "tr_mc_selfshot_test.jsonl"),
                [{k: d[k] for k in ("query", "choices", "answer")} for d in ss])
    yamls["tr_mc_selfshot"] = f"""task: tr_mc_selfshot
{dataset_block({"test": os.path.join(data, "tr_mc_selfshot_test.jsonl")})}
test_split: test
fewshot_split: test
output_type: multiple_choice
doc_to_text: "{{{{query}}}}"
doc_to_choice: choices
doc_to_target: "{{{{answer}}}}"
target_delimiter: " "
fewshot_delimiter: {q(chr(10))}
num_fewshot: 2
{metric_block(acc_metrics)}
metadata:
  version: 2.0
"""

    # d. rolling loglikelihood over paragraphs as the file has them (leading spaces and line
    # breaks kept): every ninth and the three longest (four of the 17 pass 256 tokens: 2 or 3
    # windows), one given typographic quotes (bytes != characters).
    paras = [p for p in text.split("\n\n") if p.strip()]
    longest = sorted(range(len(paras)), key=lambda i: -len(paras[i]))[:3]
    chosen = sorted(set(list(range(0, len(paras), 9)) + longest))
    pages = [paras[i] for i in chosen]
    quoted = next(i for i, p in enumerate(pages) if p.count('"') >= 2)
    parts = pages[quoted].split('"')
    pages[quoted] = "".join(s + ("“" if j % 2 == 0 else "”") for j, s in enumerate(parts[:-1])) + parts[-1]
    write_jsonl(os.path.join(data, "tr_ppl_test.jsonl"), [{"page": p} for p in pages])
    yamls["tr_ppl"] = f"""task: tr_ppl
{dataset_block({"test": os.path.join(data, "tr_ppl_test.jsonl")})}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{page}}}}"
{metric_block([("word_perplexity", "weighted_perplexity", False, {}),
               ("byte_perplexity", "weighted_perplexity", False, {}),
               ("bits_per_byte", "bits_per_byte", False, {})])}
metadata:
  version: 1.0
"""

    # e. generation: complete a sentence's beginning, 2 shots from a train split, two filters.
    qa = lambda ds: [{"question": d["query"], "answer": d["answer"]} for d in ds]  # noqa: E731
    gen_test, used = cloze(sents, pool, "tr_gen", 16, 4, 13)
    gen_train, _ = cloze(sents, pool, "tr_gen_train", 20, 6, 3, exclude=used)
    write_jsonl(os.path.join(data, "tr_gen_test.jsonl"), qa(gen_test))
    write_jsonl(os.path.join(data, "tr_gen_train.jsonl"), qa(gen_train))
    yamls["tr_gen"] = f"""task: tr_gen
{dataset_block({"test": os.path.join(data, "tr_gen_test.jsonl"),
                "train": os.path.join(data, "tr_gen_train.jsonl")})}
test_split: test
fewshot_split: train
output_type: generate_until
doc_to_text: {q(GEN_TEXT)}
doc_to_target: "{{{{answer}}}}"
num_fewshot: 2
generation_kwargs:
  until:
    - {q(chr(10))}
    - "."
  max_gen_toks: 12
  do_sample: false
{metric_block([("exact_match", "mean", True, {"ignore_case": "true", "ignore_punctuation": "true"})])}
filter_list:
  - name: strict
    filter:
      - function: regex
        regex_pattern: {q(GEN_REGEX)}
      - function: take_first
  - name: none
    filter:
      - function: take_first
metadata:
  version: 1.0
"""
    for name, body in yamls.items():
        write_text(os.path.join(tasks, name + ".yaml"), body)
    # nothing else: trainrun reads every *.yaml of the directory
    wanted = {os.path.join(tasks, n + ".yaml") for n in yamls}
    wanted |= {os.path.join(data, f"{t}_{split}.jsonl") for t in TASKS for split in ("test", "train")}
    for d in (tasks, data):
        for name in os.listdir(d):
            if os.path.join(d, name) not in wanted:
                os.remove(os.path.join(d, name))
    return tasks


# --------------------------------------------------------------------------- lm-eval
@contextlib.contextmanager
def output_to(path):
    """stdout and stderr, Python's and the file descriptors (git, native code), into `path`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "a", encoding="utf-8") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def reference_key(model_dir, tasks_dir):
    """What lm-eval's outputs depend on: the model's and tasks' files, the data they name, this
    script, and the reference packages' versions."""
    from importlib.metadata import PackageNotFoundError, version

    h = hashlib.sha256()
    files = sorted(glob.glob(os.path.join(model_dir, "*")) + glob.glob(os.path.join(tasks_dir, "*.yaml"))
                   + glob.glob(os.path.join(os.path.dirname(tasks_dir), "data", "*.jsonl")) + [__file__])
    for path in files:
        h.update(path.encode() + b"\0")
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    for pkg in ("lm_eval", "transformers", "torch", "tokenizers", "datasets", "numpy"):
        try:
            h.update(f"{pkg}={version(pkg)}\0".encode())
        except PackageNotFoundError:
            fail(f"{pkg} is not installed in {sys.executable} (scripts/venv installs the reference "
                 "packages of scripts/python-requirements.txt)")
    return h.hexdigest()


def cached_reference(out_dir, key):
    """lm-eval's outputs of an earlier run with the same inputs (WORK/lm_eval, KEY), or None."""
    try:
        with open(os.path.join(out_dir, "KEY")) as f:
            if f.read().strip() != key:
                return None
        with open(os.path.join(out_dir, "results.json"), encoding="utf-8") as f:
            res = json.load(f)
        samples = {}
        for task in TASKS:
            with open(os.path.join(out_dir, f"samples_{task}.jsonl"), encoding="utf-8") as f:
                samples[task] = [json.loads(line) for line in f]
        return res, samples
    except (OSError, ValueError):
        return None


def run_lm_eval(model_dir, tasks_dir, out_dir, fresh=False):
    key = reference_key(model_dir, tasks_dir)
    if not fresh and (hit := cached_reference(out_dir, key)):
        print(f"lm-eval: outputs of an earlier run on the same inputs ({out_dir}; --fresh-reference reruns it)")
        return hit
    t0 = time.time()
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    import lm_eval
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import handle_non_serializable

    t_import = time.time() - t0
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    # lm-eval's progress bars and warnings go to WORK/lm_eval/log.txt (shown if it fails).
    log_path = os.path.join(out_dir, "log.txt")
    with output_to(log_path):
        try:
            tm = TaskManager(include_path=tasks_dir, include_defaults=False)
            res = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model_dir},dtype=float32",
                                          tasks=TASKS, device="cpu", batch_size=1, log_samples=True,
                                          task_manager=tm)
        except Exception:
            traceback.print_exc()
            res = None
    if res is None:
        with open(log_path, encoding="utf-8") as f:
            fail("lm-eval failed:\n" + f.read()[-4000:])
    elapsed = time.time() - t0
    samples = res.pop("samples")
    # JSON round trip: tuples become lists, numpy scalars numbers, as trainrun writes them.
    samples = json.loads(json.dumps(samples, default=handle_non_serializable, ensure_ascii=False))
    res = json.loads(json.dumps(res, default=handle_non_serializable, ensure_ascii=False))
    with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(res, f, indent=2, ensure_ascii=False)
    for task, rows in samples.items():
        with open(os.path.join(out_dir, f"samples_{task}.jsonl"), "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    with open(os.path.join(out_dir, "KEY"), "w") as f:
        f.write(key + "\n")
    print(f"lm-eval {lm_eval.__version__}: {elapsed:.1f} s (import {t_import:.1f} s); outputs in {out_dir}")
    return res, samples


def print_reference(res, samples):
    print("\nlm-eval aggregates:")
    for task in TASKS:
        r = res["results"][task]
        vals = ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in r.items() if "," in k)
        print(f"  {task} (n-shot {res['n-shot'][task]}, version {res['versions'][task]}, "
              f"n-samples {res['n-samples'][task]}): {vals}")
    print("\nlm-eval's first sample of each task:")
    for task in TASKS:
        print(f"  {task}: {json.dumps(samples[task][0], ensure_ascii=False)[:1500]}")


# --------------------------------------------------------------------------- comparison
def normalize_args(args):
    """lm-eval's files write arguments as {"gen_args_0": {"arg_0": ..}}; in memory a list of
    tuples (lists after JSON)."""
    if isinstance(args, dict):
        return [[a[f"arg_{j}"] for j in range(len(a))] for a in (args[f"gen_args_{i}"] for i in range(len(args)))]
    return args


def canonical(rows, source, task):
    """{doc_id: {doc, target, arguments, resps, filters: {name: {filtered_resps, metrics}}}} from
    lm-eval's per-(document, filter) rows or from one row per document."""
    out = {}
    for row in rows:
        did = row["doc_id"]
        if source == "trainrun" and not ("filter" in row and isinstance(row.get("arguments"), dict)
                                         and isinstance(row.get("target"), str)):
            # trainrun writes the layout of lm-eval's own files (EvaluationTracker): one row per
            # document and filter, arguments {"gen_args_i": {"arg_j": ..}}, values through str().
            fail(f"trainrun {task}: doc {did}: not in the layout of lm-eval's sample files")
        entry = out.setdefault(did, {"doc": row.get("doc"), "target": row.get("target"),
                                     "arguments": normalize_args(row.get("arguments")),
                                     "resps": row.get("resps"), "filters": {},
                                     "hashes": {k: row[k] for k in HASHES if k in row}})
        if "filter" in row:  # lm-eval's layout
            names = row["metrics"] if isinstance(row.get("metrics"), list) else []
            if isinstance(row.get("metrics"), dict):
                metrics = row["metrics"]
            else:
                metrics = {m: row[m] for m in names if m in row}
            if row["filter"] in entry["filters"]:
                fail(f"{source} {task}: doc {did} has filter {row['filter']!r} twice")
            entry["filters"][row["filter"]] = {"filtered_resps": row.get("filtered_resps"), "metrics": metrics}
        else:
            fr, ms = row.get("filtered_resps"), row.get("metrics")
            if not isinstance(fr, dict) or not isinstance(ms, dict):
                fail(f"{source} {task}: doc {did}: without \"filter\", filtered_resps and metrics must be "
                     f"objects keyed by filter name; got {type(fr).__name__} and {type(ms).__name__}")
            if entry["filters"]:
                fail(f"{source} {task}: doc {did} appears twice")
            if ms and not all(isinstance(v, dict) for v in ms.values()):
                # flat {"<metric>,<filter>": value}, as results.json's keys
                flat = ms
                ms = {}
                for key, v in flat.items():
                    metric, _, fname = key.partition(",")
                    ms.setdefault(fname, {})[metric] = v
            for name in fr:
                entry["filters"][name] = {"filtered_resps": fr[name], "metrics": ms.get(name, {})}
    return out


class Stats:
    def __init__(self):
        self.rows = {}  # task -> {"what": count}
        self.max_rel = {}  # task -> max relative error of the loglikelihoods
        self.errors = []

    def count(self, task, what, n=1):
        self.rows.setdefault(task, {}).setdefault(what, 0)
        self.rows[task][what] += n

    def rel(self, task, a, b):
        r = abs(a - b) / max(abs(b), 1e-30)
        self.max_rel[task] = max(self.max_rel.get(task, 0.0), r if abs(a - b) > 0 else 0.0)

    def err(self, msg):
        self.errors.append(msg)


def close(a, b, rel=REL, abs_=ABS):
    return isinstance(a, (int, float)) and not isinstance(a, bool) and abs(a - b) <= max(rel * abs(b), abs_)


def unstring(x):
    """lm-eval's sample files write responses as strings ("-1.5", "False"): read them back."""
    if isinstance(x, list):
        return [unstring(v) for v in x]
    if isinstance(x, str):
        if x in ("True", "False"):
            return x == "True"
        try:
            return float(x)
        except ValueError:
            return x
    return x


def compare_ll(st, task, where, tr, ref, kind):
    """ref: [ll, is_greedy] or a bare ll (rolling)."""
    tr = unstring(tr)
    if isinstance(ref, list):
        if not (isinstance(tr, list) and len(tr) == 2):
            st.err(f"{where}: trainrun {tr!r}, lm-eval [ll, is_greedy] {ref!r}")
            return
        if not close(tr[0], ref[0]):
            st.err(f"{where}: loglikelihood {tr[0]!r} vs lm-eval {ref[0]!r}")
        else:
            st.rel(task, tr[0], ref[0])
        if tr[1] is not ref[1]:
            st.err(f"{where}: is_greedy {tr[1]!r} vs lm-eval {ref[1]!r}")
        st.count(task, kind)
    else:
        if isinstance(tr, list) and len(tr) == 1:
            tr = tr[0]
        if not close(tr, ref):
            st.err(f"{where}: rolling loglikelihood {tr!r} vs lm-eval {ref!r}")
        else:
            st.rel(task, tr, ref)
        st.count(task, kind)


def compare_value(st, task, where, tr, ref, kind):
    """A response or filtered response (kind: which, for the counts): a string, an [ll, greedy]
    pair or a number."""
    if isinstance(ref, str):
        if tr != ref:
            st.err(f"{where}: {tr!r} vs lm-eval {ref!r}")
        st.count(task, kind)
    else:
        compare_ll(st, task, where, tr, ref, kind)


def compare_metric(st, task, where, name, tr, ref):
    if isinstance(ref, list):  # (loglikelihood, words/bytes) of the perplexities
        if not (isinstance(tr, list) and len(tr) == 2 and close(tr[0], ref[0]) and tr[1] == ref[1]):
            st.err(f"{where}: metric {name} {tr!r} vs lm-eval {ref!r}")
    elif name in EXACT_METRICS:
        if not isinstance(tr, (int, float)) or isinstance(tr, bool) or tr != ref:
            st.err(f"{where}: metric {name} {tr!r} vs lm-eval {ref!r}")
    elif not close(tr, ref):
        st.err(f"{where}: metric {name} {tr!r} vs lm-eval {ref!r}")
    st.count(task, "doc metrics")


def compare_samples(st, task, tr_rows, ref_rows):
    tr = canonical(tr_rows, "trainrun", task)
    ref = canonical(ref_rows, "lm-eval", task)
    if sorted(tr) != sorted(ref):
        st.err(f"{task}: trainrun logged docs {sorted(tr)}, lm-eval {sorted(ref)}")
    for fname in {r.get("filter") for r in tr_rows}:  # lm-eval's layout: filter by filter
        order = [r["doc_id"] for r in tr_rows if r.get("filter") == fname]
        if order != sorted(order):
            st.err(f"{task}: trainrun's samples are not in doc_id order")
    for did in sorted(set(tr) & set(ref)):
        a, b = tr[did], ref[did]
        w = f"{task} doc {did}"
        if a["doc"] != b["doc"]:
            st.err(f"{w}: doc {a['doc']!r} vs lm-eval {b['doc']!r}")
        if a["target"] != b["target"] and str(a["target"]) != str(b["target"]):
            st.err(f"{w}: target {a['target']!r} vs lm-eval {b['target']!r}")
        for k, v in a["hashes"].items():  # optional in trainrun's samples; if there, lm-eval's
            if v != b["hashes"].get(k):
                st.err(f"{w}: {k} {v} vs lm-eval {b['hashes'].get(k)}")
        # arguments: the contexts (few-shot examples, their order, delimiters) and continuations
        aa, ba = a["arguments"] or [], b["arguments"]
        if len(aa) != len(ba):
            st.err(f"{w}: {len(aa)} requests vs lm-eval {len(ba)}")
            continue
        for i, (x, y) in enumerate(zip(aa, ba)):
            if not isinstance(x, list) or len(x) != len(y):
                st.err(f"{w} request {i}: arguments {x!r} vs lm-eval {y!r}")
                continue
            for j, (xs, ys) in enumerate(zip(x, y)):
                if isinstance(ys, dict):  # generation kwargs: what trainrun states must agree
                    if not isinstance(xs, dict) or any(k in ys and ys[k] != v for k, v in xs.items()):
                        st.err(f"{w} request {i}: generation kwargs {xs!r} vs lm-eval {ys!r}")
                elif xs != ys:
                    st.err(f"{w} request {i}: argument {j} differs:\n      trainrun {xs!r}\n      lm-eval  {ys!r}")
            st.count(task, "requests")
        # raw responses: per request a list of one response
        ar, br = a["resps"] or [], b["resps"]
        if len(ar) != len(br):
            st.err(f"{w}: {len(ar)} responses vs lm-eval {len(br)}")
        else:
            for i, (x, y) in enumerate(zip(ar, br)):
                if not isinstance(x, list) or len(x) != len(y):
                    st.err(f"{w} request {i}: resps {x!r} vs lm-eval {y!r}")
                    continue
                for xs, ys in zip(x, y):
                    compare_value(st, task, f"{w} request {i} resps", xs, ys, "resps")
        # per filter: filtered responses and the document's metrics
        if sorted(a["filters"]) != sorted(b["filters"]):
            st.err(f"{w}: filters {sorted(a['filters'])} vs lm-eval {sorted(b['filters'])}")
        for fname in sorted(set(a["filters"]) & set(b["filters"])):
            fa, fb = a["filters"][fname], b["filters"][fname]
            xf, yf = fa["filtered_resps"], fb["filtered_resps"]
            if not isinstance(xf, list) or len(xf) != len(yf):
                st.err(f"{w} filter {fname}: filtered_resps {xf!r} vs lm-eval {yf!r}")
            else:
                for i, (x, y) in enumerate(zip(xf, yf)):
                    compare_value(st, task, f"{w} request {i} filtered_resps[{fname}]", x, y, "filtered")
            if sorted(fa["metrics"]) != sorted(fb["metrics"]):
                st.err(f"{w} filter {fname}: metrics {sorted(fa['metrics'])} vs lm-eval {sorted(fb['metrics'])}")
            for m in sorted(set(fa["metrics"]) & set(fb["metrics"])):
                compare_metric(st, task, f"{w} filter {fname}", m, fa["metrics"][m], fb["metrics"][m])


def compare_results(st, tr, ref):
    for key in ("results", "versions", "n-shot", "higher_is_better", "n-samples"):
        if not isinstance(tr.get(key), dict):
            st.err(f'results.json: no "{key}" object')
            return
    for task in TASKS:
        a, b = tr["results"].get(task), ref["results"][task]
        if a is None:
            st.err(f"results.json: no results for {task}")
            continue
        if a.get("alias") != b["alias"]:
            st.err(f"results.json {task}: alias {a.get('alias')!r} vs lm-eval {b['alias']!r}")
        keys = sorted(k for k in b if "," in k)
        extra = sorted(k for k in a if "," in k and k not in b)
        if extra:
            st.err(f"results.json {task}: keys lm-eval does not have: {extra}")
        for k in keys:
            x, y = a.get(k), b[k]
            metric = k.split(",")[0]
            if k not in a:
                st.err(f"results.json {task}: no {k!r} (lm-eval {y!r})")
            elif y == "N/A" or x == "N/A":
                if x != y:
                    st.err(f"results.json {task} {k}: {x!r} vs lm-eval {y!r}")
            elif metric.endswith("_stderr"):
                if not close(x, y, STDERR_REL, 1e-12):
                    st.err(f"results.json {task} {k}: {x!r} vs lm-eval {y!r}")
            elif metric in EXACT_METRICS:
                if isinstance(x, bool) or x != y:
                    st.err(f"results.json {task} {k}: {x!r} vs lm-eval {y!r} (must be equal)")
            elif not close(x, y, REL, 0.0):
                st.err(f"results.json {task} {k}: {x!r} vs lm-eval {y!r}")
            st.count(task, "aggregates")
        for key in ("versions", "n-shot", "higher_is_better", "n-samples"):
            x, y = tr[key].get(task), ref[key][task]
            if x != y or isinstance(x, bool) != isinstance(y, bool) or isinstance(x, str) != isinstance(y, str):
                st.err(f"results.json {key}[{task}]: {x!r} vs lm-eval {y!r}")


def closest_calls(samples):
    """The smallest gap in lm-eval's loglikelihoods between the two best choices of a
    multiple-choice document: were it near float rounding, acc would hang on the last bits."""
    gaps = []
    for task in ("tr_mc", "tr_mc_fewshot", "tr_mc_selfshot"):
        for row in samples[task]:
            lls = sorted((r[0][0] for r in row["resps"]), reverse=True)
            gaps.append((lls[0] - lls[1], task, row["doc_id"]))
    return min(gaps)


def load_trainrun(out):
    path = os.path.join(out, "results.json")
    if not os.path.exists(path):
        fail(f"trainrun eval wrote no {path}")
    with open(path, encoding="utf-8") as f:
        res = json.load(f)
    samples = {}
    for task in TASKS:
        p = os.path.join(out, "samples", f"samples_{task}.jsonl")
        if not os.path.exists(p):
            fail(f"trainrun eval wrote no {p}")
        with open(p, encoding="utf-8") as f:
            samples[task] = [json.loads(line) for line in f if line.strip()]
    return res, samples


def case_main(tr_bin, work, reference_only, fresh_reference):
    model_dir = build_model(work)
    tasks_dir = build_tasks(work)
    res, samples = run_lm_eval(model_dir, tasks_dir, os.path.join(work, "lm_eval"), fresh_reference)
    gap = closest_calls(samples)
    if reference_only:
        print_reference(res, samples)
        print(f"\nclosest multiple-choice call: {gap[0]:.3g} nats ({gap[1]} doc {gap[2]})")
        return
    out = os.path.join(work, "trainrun")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    cmd = [tr_bin, "eval", "--model", model_dir, "--tasks", tasks_dir, "--output", os.path.join(out, "results.json"),
           "--log-samples", os.path.join(out, "samples")]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    t_tr = time.time() - t0
    if p.returncode != 0:
        fail(f"{' '.join(cmd)}: exit {p.returncode}\n{(p.stdout + p.stderr)[-4000:]}")
    print(f"trainrun eval: {t_tr:.1f} s")
    tr_res, tr_samples = load_trainrun(out)
    st = Stats()
    for task in TASKS:
        compare_samples(st, task, tr_samples[task], samples[task])
    compare_results(st, tr_res, res)
    print(f"\n{'task':<16}{'docs':>6}{'requests':>10}{'resps':>7}{'filtered':>10}{'doc metrics':>13}"
          f"{'aggregates':>12}{'max rel err (ll)':>18}")
    for task in TASKS:
        c = st.rows.get(task, {})
        print(f"{task:<16}{len({r['doc_id'] for r in samples[task]}):>6}{c.get('requests', 0):>10}"
              f"{c.get('resps', 0):>7}{c.get('filtered', 0):>10}{c.get('doc metrics', 0):>13}"
              f"{c.get('aggregates', 0):>12}{st.max_rel.get(task, 0.0):>18.2e}")
    print(f"closest multiple-choice call in lm-eval: {gap[0]:.3g} nats ({gap[1]} doc {gap[2]})")
    if st.errors:
        shown = st.errors[:40]
        fail(f"{len(st.errors)} mismatches between trainrun eval and lm-eval"
             f"{' (first 40)' if len(st.errors) > 40 else ''}:\n  " + "\n  ".join(shown)
             + f"\n(lm-eval's outputs: {os.path.join(work, 'lm_eval')}; trainrun's: {out})")
    print("OK: trainrun eval agrees with lm-eval on every task, document and aggregate")


# --------------------------------------------------------------------------- ranks
def case_ranks(tr_bin, work, strategy):
    """The [eval] tasks of a training run at world 2 under `strategy`: evaluated before the first
    step (eval_on_start) and at the end of one step at lr 0, each rank answering its share; both
    evaluations must agree with lm-eval as `trainrun eval` does, and their aggregates must reach
    metrics.jsonl."""
    model_dir = build_model(work)
    tasks_dir = build_tasks(work)
    res, samples = run_lm_eval(model_dir, tasks_dir, os.path.join(work, "lm_eval"), False)
    base = os.path.join(work, f"ranks-{strategy}")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    import numpy as np

    vocab = json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
    block = 32
    tokens = os.path.join(base, "tokens.u32")
    rng = np.random.default_rng(0)
    rng.integers(3, min(vocab, 96), size=40 * block).astype("<u4").tofile(tokens)
    run_dir = os.path.join(base, "run")
    job = os.path.join(base, "job.toml")
    with open(job, "w", encoding="utf-8") as f:
        f.write(f"""[launch]
nproc_per_node = 2

[trainer]
max_steps = 1
global_batch_size = 2
seed = 1
log_every = 1
eval_on_start = true
eval_max_batches = 1
save_final_model = false
run_dir = {q(run_dir)}

[model]
plugin = "llama"
path = {q(model_dir)}

[data]
plugin = "text"
format = "uint32"
vocab_size = {min(vocab, 96)}
block_size = {block}
eval_fraction = 0.1
paths = [{q(tokens)}]

[strategy]
plugin = "{strategy}"

[accelerator]
plugin = "gloo-cpu"
threads = 1

[optimizer]
plugin = "adamw"
lr = 0.0
weight_decay = 0.0

[eval]
tasks = [{q(tasks_dir)}]
""")
    # A task path that is not there: exit 2 before training, naming the job file, [eval] and the path.
    bad_job = os.path.join(base, "bad.toml")
    with open(bad_job, "w", encoding="utf-8") as f:
        f.write(open(job, encoding="utf-8").read().replace(q(tasks_dir), q(os.path.join(base, "no-such-tasks"))))
    p = subprocess.run([tr_bin, "--config", bad_job], capture_output=True, text=True, timeout=300)
    needles = [bad_job, "[eval] tasks path", os.path.join(base, "no-such-tasks")]
    if p.returncode != 2 or any(n not in p.stdout + p.stderr for n in needles):
        fail(f"a job whose [eval] tasks path is missing: exit {p.returncode} (expected 2 naming {needles})\n"
             f"{(p.stdout + p.stderr)[-2000:]}")
    cmd = [tr_bin, "--config", job]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        fail(f"{' '.join(cmd)}: exit {p.returncode}\n{(p.stdout + p.stderr)[-4000:]}")
    print(f"trainrun --config (world 2, {strategy}): {time.time() - t0:.1f} s")
    print("\n".join(ln for ln in p.stdout.splitlines() if "[eval tasks" in ln))
    st = Stats()
    for step in (0, 1):
        out = os.path.join(run_dir, "eval", f"step-{step}")
        path = os.path.join(out, "results.json")
        if not os.path.exists(path):
            fail(f"the run wrote no {path}")
        tr_res = json.load(open(path, encoding="utf-8"))
        for task in TASKS:
            sp = os.path.join(out, f"samples_{task}.jsonl")
            if not os.path.exists(sp):
                fail(f"the run wrote no {sp}")
            rows = [json.loads(line) for line in open(sp, encoding="utf-8") if line.strip()]
            compare_samples(st, task, rows, samples[task])
        compare_results(st, tr_res, res)
        if tr_res["config"].get("world_size") != 2:
            st.err(f"{path}: config.world_size {tr_res['config'].get('world_size')!r}, expected 2")
        # Each rank answered a share, together every request once.
        per_rank = tr_res["config"].get("requests_per_rank")
        total = sum(len(r["arguments"]) for task in TASKS for r in samples[task]
                    if r["filter"] == next(iter(sorted({x["filter"] for x in samples[task]}))))
        if not isinstance(per_rank, list) or len(per_rank) != 2 or min(per_rank) < 1 or sum(per_rank) != total:
            st.err(f"{path}: config.requests_per_rank {per_rank!r}: expected 2 shares of the {total} requests")
        elif step == 0:
            print(f"requests per rank: {per_rank} of {total}")
        # The aggregates as the callbacks got them.
        evals = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))
                 if '"eval_loss"' in line]
        row = next((r for r in evals if r["step"] == step), None)
        if row is None:
            st.err(f"metrics.jsonl: no evaluation at step {step}")
            continue
        for task in TASKS:
            for k, v in tr_res["results"][task].items():
                if "," not in k or "_stderr," in k or not isinstance(v, (int, float)):
                    continue
                got = row.get(f"eval_tasks/{task}/{k}")
                if got is None or not close(got, v, 1e-12, 0.0):
                    st.err(f"metrics.jsonl step {step}: eval_tasks/{task}/{k} = {got!r}, results.json {v!r}")
    # The report's table of task scores, one column per evaluation.
    report = os.path.join(run_dir, "report.html")
    page = open(report, encoding="utf-8").read() if os.path.exists(report) else ""
    if "<th>step 0</th><th>step 1</th>" not in page or "<td>tr_mc</td><td>acc,none</td>" not in page:
        st.err(f"{report}: no evaluation-task table with columns step 0 and step 1 and a tr_mc acc row")
    print(f"\n{'task':<16}{'requests':>10}{'doc metrics':>13}{'aggregates':>12}{'max rel err (ll)':>18}")
    for task in TASKS:
        c = st.rows.get(task, {})
        print(f"{task:<16}{c.get('requests', 0):>10}{c.get('doc metrics', 0):>13}"
              f"{c.get('aggregates', 0):>12}{st.max_rel.get(task, 0.0):>18.2e}")
    if st.errors:
        fail(f"{len(st.errors)} mismatches between the run's [eval] tasks and lm-eval (first 40):\n  "
             + "\n  ".join(st.errors[:40]) + f"\n(the run: {run_dir})")
    print(f"OK: at world 2 under {strategy}, the run's [eval] tasks agree with lm-eval before and after its step")


# --------------------------------------------------------------------------- errors
def case_errors(tr_bin, work):
    model_dir = build_model(work, steps=0)  # any valid model: the errors are the tasks
    base = os.path.join(work, "errors")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    data = os.path.join(base, "docs.jsonl")
    write_jsonl(data, [{"question": f"What is {i} plus one?", "answer": str(i + 1),
                        "choices": ["yes", "no"], "gold": i % 2} for i in range(4)])
    ds = dataset_block({"test": data})
    cases = {
        # name: (yaml body, what stderr must name besides the file/task)
        "bad_output_type": (f"""task: bad_output_type
{ds}
test_split: test
output_type: multiple_choise
doc_to_text: "{{{{question}}}}"
doc_to_choice: choices
doc_to_target: gold
metric_list:
  - metric: acc
metadata:
  version: 1.0
""", ["bad_output_type.yaml", "output_type"]),
        "bad_metric": (f"""task: bad_metric
{ds}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: choices
doc_to_target: gold
metric_list:
  - metric: accuracy_at_k
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
""", ["accuracy_at_k"]),
        "missing_field": (f"""task: missing_field
{ds}
test_split: test
output_type: generate_until
doc_to_text: {q(MISSING_TEXT)}
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until:
    - {q(chr(10))}
  max_gen_toks: 4
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
""", ["missing_field", "passage"]),
    }
    checks = []
    for name, (body, needles) in cases.items():
        # one directory per file: lm-eval's TaskManager indexes directories; trainrun gets the file
        os.makedirs(os.path.join(base, name))
        path = os.path.join(base, name, name + ".yaml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(body)
        checks.append((name, path, needles))
    missing = os.path.join(base, "no-such-tasks-dir")
    checks.append(("missing_path", missing, [missing]))

    # lm-eval's own verdict on the same files, for the record (no model needed).
    from lm_eval.tasks import TaskManager

    for name, path, _ in checks[:3]:
        try:
            with output_to(os.path.join(base, "lm_eval.log")):
                TaskManager(include_path=os.path.dirname(path), include_defaults=False).load([name])
            verdict = "loads it (logs an error)" if name == "bad_metric" else "loads it"
        except Exception as e:  # noqa: BLE001
            verdict = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        print(f"lm-eval on {name}: {verdict}")

    failures = []
    for name, path, needles in checks:
        out = os.path.join(base, f"out-{name}")
        cmd = [tr_bin, "eval", "--model", model_dir, "--tasks", path, "--output", os.path.join(out, "results.json"),
               "--log-samples", os.path.join(out, "samples")]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        err = p.stderr
        problems = []
        if p.returncode != 2:
            problems.append(f"exit {p.returncode}, expected 2")
        absent = [n for n in needles if n not in err]
        if absent:
            problems.append(f"stderr does not name {absent}")
        if os.path.exists(os.path.join(out, "results.json")):
            problems.append("results.json was written")
        lines = [ln for ln in err.splitlines() if ln.strip()]
        first = next((ln for ln in lines if "error:" in ln), lines[0] if lines else "")
        print(f"{name:<16} exit {p.returncode}  {first[:150]}")
        if problems:
            failures.append(f"{name}: {'; '.join(problems)}\n    stderr: {err[-1500:]!r}")
    if failures:
        fail("trainrun eval on bad input:\n  " + "\n  ".join(failures))
    print("OK: every bad input exits 2 naming the culprit")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trainrun")
    ap.add_argument("work")
    ap.add_argument("--case", choices=["main", "errors", "ranks"], default="main")
    ap.add_argument("--reference-only", action="store_true", help="run lm-eval only and print what it produced")
    ap.add_argument("--fresh-reference", action="store_true",
                    help="run lm-eval even if WORK/lm_eval holds its outputs for the same inputs")
    a = ap.parse_args()
    work = os.path.abspath(a.work)
    os.makedirs(work, exist_ok=True)
    setup_env(work)
    if not a.reference_only and not os.access(a.trainrun, os.X_OK):
        fail(f"no trainrun binary at {a.trainrun}")
    t0 = time.time()
    if a.case == "main":
        case_main(a.trainrun, work, a.reference_only, a.fresh_reference)
    elif a.case == "ranks":
        for strategy in ("ddp", "fsdp"):
            case_ranks(a.trainrun, work, strategy)
    else:
        case_errors(a.trainrun, work)
    print(f"total {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
