"""`trainrun tokenize` (issue 22) against HF `tokenizers`, then a training job reading the corpus.

Documents: text files that ship with Debian (common licenses) and this repository (docs, sources),
and a JSONL file with one paragraph of them per line (plus a line with emoji and CJK text). For
each fixture tokenizer the token file must equal tokenizers' encode(doc, add_special_tokens=False)
+ [eos] over the documents in order, in the dtype the sidecar names (uint16 for vocabularies up
to 65536, else uint32), with the sidecar's counts right. Then a tiny llama job (`text` dataset,
format = "auto") trains 3 steps on the mistral-tokenized corpus: the dataset takes dtype and
vocab_size from the sidecar (the model reports the tokenizer's vocabulary, not max id + 1) and the
losses are finite; without the sidecar, format = "auto" is an error naming it. Bad input: a JSONL line without "text" is an error naming file:line, exit 2,
and no output file.

usage: tokenize_ref.py TRAINRUN FIXTURES_DIR WORK
"""
import glob
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
from tokenizers import Tokenizer

TRAINRUN, FIXTURES, WORK = sys.argv[1:4]
HERE = os.path.dirname(os.path.abspath(__file__))


def fail(msg):
    print("FAIL:", msg, flush=True)
    sys.exit(1)


def documents():
    texts = sorted(glob.glob("/usr/share/common-licenses/*"))
    texts = [f for f in texts if os.path.isfile(f) and not os.path.islink(f)][:6]
    texts += sorted(glob.glob(os.path.join(HERE, "..", "..", "docs", "*.md")))[:4]
    texts += [os.path.join(HERE, "..", "..", "apps", "trainrun", "tokenize_cli.cpp"), os.path.abspath(__file__)]
    if len(texts) < 6:
        fail("too few input files found")
    docs = []
    for f in texts:
        with open(f, encoding="utf-8") as fh:
            docs.append(fh.read())
    paragraphs = [p for d in docs[:3] for p in d.split("\n\n") if p.strip()][:400]
    paragraphs.append("Emoji 🙂🚀 and 日本語のテキスト, Ünïcödé — and  runs   of    spaces\t\ttabs.")
    jsonl = os.path.join(WORK, "paragraphs.jsonl")
    with open(jsonl, "w", encoding="utf-8") as fh:
        for p in paragraphs:
            fh.write(json.dumps({"text": p, "source": "test"}, ensure_ascii=False) + "\n")
    return texts + [jsonl], docs + paragraphs


def check(name, files, docs):
    tdir = os.path.join(FIXTURES, name)
    out = os.path.join(WORK, f"{name}.bin")
    r = subprocess.run([TRAINRUN, "tokenize", "--tokenizer", tdir, "--output", out, "--threads", "2", *files],
                       capture_output=True, text=True)
    print(r.stdout + r.stderr, end="")
    if r.returncode != 0:
        fail(f"trainrun tokenize exited {r.returncode}")
    with open(out + ".json") as f:
        side = json.load(f)
    tok = Tokenizer.from_file(os.path.join(tdir, "tokenizer.json"))
    eos = side["eos_token_id"]
    with open(os.path.join(tdir, "tokenizer_config.json")) as f:
        eos_token = json.load(f)["eos_token"]
    eos_token = eos_token["content"] if isinstance(eos_token, dict) else eos_token
    if tok.token_to_id(eos_token) != eos:
        fail(f"{name}: sidecar eos_token_id {eos}, tokenizers says {eos_token!r} is {tok.token_to_id(eos_token)}")
    ref = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ref += enc.ids + [eos]
    vocab = tok.get_vocab_size(with_added_tokens=True)
    want_dtype = "uint16" if vocab <= 65536 else "uint32"
    if side["dtype"] != want_dtype or side["vocab_size"] != vocab:
        fail(f"{name}: sidecar says {side['dtype']} / vocab {side['vocab_size']}, expected {want_dtype} / {vocab}")
    ours = np.fromfile(out, dtype="<u2" if want_dtype == "uint16" else "<u4").astype(np.int64).tolist()
    if side["tokens"] != len(ours) or side["documents"] != len(docs):
        fail(f"{name}: sidecar counts {side['tokens']} tokens / {side['documents']} documents, file has "
             f"{len(ours)} tokens, {len(docs)} documents given")
    if ours != ref:
        i = next(i for i, (a, b) in enumerate(zip(ours + [-1], ref + [-1])) if a != b)
        fail(f"{name}: {len(ours)} ids vs tokenizers' {len(ref)}; first difference at {i}: "
             f"{ours[max(0, i - 3):i + 4]} vs {ref[max(0, i - 3):i + 4]}")
    print(f"{name}: {len(docs)} documents, {len(ours)} tokens ({want_dtype}) equal HF tokenizers' ids + EOS")
    return out, side


def train(corpus, side):
    run_dir = os.path.join(WORK, "run")
    job = os.path.join(WORK, "job.toml")
    with open(job, "w") as f:
        f.write(f"""[trainer]
max_steps = 3
global_batch_size = 4
seed = 1
log_every = 1
run_dir = "{run_dir}"
save_final_model = false

[model]
plugin = "llama"
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 2
save_hf = false

[data]
plugin = "text"
format = "auto"
block_size = 32
eval_fraction = 0.01
paths = ["{corpus}"]

[optimizer]
plugin = "adamw"
lr = 1e-3

[accelerator]
plugin = "cpu"
threads = 1
""")
    r = subprocess.run([TRAINRUN, "--config", job], capture_output=True, text=True)
    print(r.stdout + r.stderr, end="")
    if r.returncode != 0:
        fail(f"training on the corpus exited {r.returncode}")
    if f"vocab {side['vocab_size']}" not in r.stdout + r.stderr:
        fail(f"the model did not get the sidecar's vocabulary ({side['vocab_size']})")
    losses = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if "loss" in m and m.get("split", "train") == "train":
                losses.append(m["loss"])
    if len(losses) < 3 or not all(math.isfinite(x) for x in losses):
        fail(f"expected 3 finite training losses, got {losses}")
    print(f"training job on the token file (format auto, vocab {side['vocab_size']}): losses {losses}")
    # format = "auto" on a token file without its sidecar: an error naming the sidecar.
    bare = os.path.join(WORK, "bare.bin")
    shutil.copyfile(corpus, bare)
    with open(job) as f:
        text = f.read().replace(corpus, bare)
    with open(job, "w") as f:
        f.write(text)
    r = subprocess.run([TRAINRUN, "--config", job], capture_output=True, text=True)
    if r.returncode == 0 or "bare.bin.json" not in r.stderr:
        fail(f"format auto without a sidecar: rc {r.returncode}, stderr {r.stderr!r}")
    print(f"format auto without a sidecar: exit {r.returncode} naming bare.bin.json")


def bad():
    f = os.path.join(WORK, "bad.jsonl")
    with open(f, "w") as fh:
        fh.write('{"text": "fine"}\n{"txt": "no text key"}\n')
    out = os.path.join(WORK, "bad.bin")
    r = subprocess.run([TRAINRUN, "tokenize", "--tokenizer", os.path.join(FIXTURES, "mistral"), "--output", out, f],
                       capture_output=True, text=True)
    if r.returncode != 2 or "bad.jsonl:2" not in r.stderr or os.path.exists(out) or os.path.exists(out + ".tmp"):
        fail(f"bad JSONL: rc {r.returncode}, stderr {r.stderr!r}, output left: {os.path.exists(out)}")
    print("bad JSONL line: exit 2 naming bad.jsonl:2, nothing written")


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    files, docs = documents()
    corpus = None
    for name in ("mistral", "llama3", "qwen3"):
        out, side = check(name, files, docs)
        if name == "mistral":
            corpus = (out, side)
    train(*corpus)
    bad()
    print("PASS")


if __name__ == "__main__":
    main()
