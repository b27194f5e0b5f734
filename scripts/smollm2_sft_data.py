#!/usr/bin/env python3
"""Builds the instruction data of configs/smollm2-sft.toml from text that ships with Debian 12:
the WordNet 3.0 database (package wordnet-base: glosses, example sentences) and the docstrings of
Python's standard library (package libpython3.11-stdlib). Questions are fixed phrasings; every
answer is the packages' text (a gloss with its first letter capitalised, an example sentence, a
lemma, the first paragraph of a docstring). Deterministic: the same packages give the same file.

  python3 scripts/smollm2_sft_data.py OUT.jsonl [--wordnet DIR] [--stdlib DIR]
                                      [--wordnet-examples N] [--python-examples N]

Writes OUT.jsonl (one {"messages": [user, assistant]} per line, the `chat` dataset's OpenAI
format) and OUT.jsonl.json (counts, sources, licences). Licences: WordNet 3.0 licence (Princeton
University, permissive; /usr/share/doc/wordnet-base/copyright); the Python docstrings are under
the PSF License Version 2 (/usr/share/doc/libpython3.11-stdlib/copyright)."""
import argparse
import ast
import inspect
import json
import os
import random
import re
import sys
import sysconfig

POS = {"noun": "n", "verb": "v", "adj": "a", "adv": "r"}
POS_WORD = {"noun": "noun", "verb": "verb", "adj": "adjective", "adv": "adverb"}


def monosemous(wordnet, pos):
    """Lemmas with one sense in this part of speech (index.POS: lemma pos synset_cnt ...)."""
    out = set()
    with open(os.path.join(wordnet, f"index.{pos}"), encoding="latin-1") as f:
        for line in f:
            if line.startswith("  "):  # the licence header
                continue
            parts = line.split()
            if len(parts) > 2 and parts[2] == "1":
                out.add(parts[0])
    return out


def synsets(wordnet, pos):
    """(words, definition, examples) per synset of data.POS (format: wndb(5WN))."""
    with open(os.path.join(wordnet, f"data.{pos}"), encoding="latin-1") as f:
        for line in f:
            if line.startswith("  "):
                continue
            head, _, gloss = line.partition(" | ")
            parts = head.split()
            w_cnt = int(parts[3], 16)
            # adjective markers such as "(a)", "(p)", "(ip)" follow some lemmas
            words = [re.sub(r"\(\w+\)$", "", parts[4 + 2 * i]) for i in range(w_cnt)]
            gloss = gloss.strip()
            examples = re.findall(r'"([^"]+)"', gloss)
            definition = gloss.split('; "')[0].strip().rstrip(";").strip()
            if definition.startswith('"'):
                definition = ""
            yield words, definition, examples


def wordnet_examples(wordnet, n, rng):
    cands = []
    for pos in POS:
        single = monosemous(wordnet, pos)
        for words, definition, examples in synsets(wordnet, pos):
            lemmas = [w for w in words if w.lower() in single]
            if not lemmas or len(definition) < 12:
                continue
            word = lemmas[0].replace("_", " ")
            kind = POS_WORD[pos]
            gloss = definition[0].upper() + definition[1:]
            if not gloss.endswith((".", "!", "?")):
                gloss += "."
            cands.append((f'What does the {kind} "{word}" mean?', gloss))
            used = [e for e in examples if re.search(r"\b" + re.escape(word) + r"\b", e, re.I)]
            if used:
                cands.append((f'Use the {kind} "{word}" in a sentence.', used[0][0].upper() + used[0][1:]))
            if len(words) == 1 and "_" not in words[0]:
                cands.append((f"Which {kind} means: {definition}?", word))
    return rng.sample(cands, min(n, len(cands))), len(cands)


SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "ensurepip", "site-packages", "dist-packages",
             "__pycache__", "turtledemo", "tkinter", "pydoc_data"}


def python_examples(stdlib, n, rng):
    cands = []
    for dirpath, dirnames, filenames in os.walk(stdlib):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("config-"))
        for fn in sorted(filenames):
            if not fn.endswith(".py") or fn.startswith("_") and fn != "__init__.py":
                continue
            rel = os.path.relpath(os.path.join(dirpath, fn), stdlib)[:-3].split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            if not rel or any(p.startswith("_") for p in rel):
                continue
            module = ".".join(rel)
            try:
                with open(os.path.join(dirpath, fn), encoding="utf-8") as f:
                    tree = ast.parse(f.read())
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for node in tree.body:
                if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith("_"):
                    continue
                doc = ast.get_docstring(node)
                if not doc:
                    continue
                para = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())
                if not 20 <= len(para) <= 500 or para.startswith(">>>"):
                    continue
                if isinstance(node, ast.FunctionDef):
                    q = f"What does the Python function {module}.{node.name}({ast.unparse(node.args)}) do?"
                else:
                    q = f"What is the Python class {module}.{node.name} for?"
                cands.append((q, para))
    return rng.sample(cands, min(n, len(cands))), len(cands)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--wordnet", default="/usr/share/wordnet")
    ap.add_argument("--stdlib", default=sysconfig.get_paths()["stdlib"])
    ap.add_argument("--wordnet-examples", type=int, default=4000)
    ap.add_argument("--python-examples", type=int, default=1000)
    a = ap.parse_args()
    if not os.path.isfile(os.path.join(a.wordnet, "data.noun")):
        sys.exit(f"smollm2_sft_data: {a.wordnet}/data.noun not found (apt-get install wordnet-base)")
    wn, wn_all = wordnet_examples(a.wordnet, a.wordnet_examples, random.Random(1))
    py, py_all = python_examples(a.stdlib, a.python_examples, random.Random(2))
    rows = [("wordnet", q, r) for q, r in wn] + [("python", q, r) for q, r in py]
    random.Random(3).shuffle(rows)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tmp = a.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for _, q, r in rows:
            f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": r}]},
                               ensure_ascii=False) + "\n")
    meta = {"examples": len(rows), "wordnet": {"examples": len(wn), "candidates": wn_all, "dir": a.wordnet,
                                               "package": "wordnet-base", "license": "WordNet 3.0 license (Princeton University)"},
            "python": {"examples": len(py), "candidates": py_all, "stdlib": a.stdlib,
                       "package": "libpython3.11-stdlib", "license": "PSF-2.0"}}
    with open(a.out + ".json", "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
    os.replace(tmp, a.out)  # complete or absent
    print(f"smollm2_sft_data: {len(rows)} conversations ({len(wn)} WordNet of {wn_all}, "
          f"{len(py)} Python docstrings of {py_all}) -> {a.out}")


if __name__ == "__main__":
    main()
