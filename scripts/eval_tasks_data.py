#!/usr/bin/env python3
"""Builds the data of trainrun's shipped evaluation tasks (eval/tasks/*.yaml, lm-eval's YAML task
format) from material on Debian, deterministically, into eval/tasks/data/:

  wordnet_define   multiple choice: the definition of a word, among 4 (WordNet 3.0 glosses)
  wordnet_word     multiple choice, 3-shot: the word a definition defines, among 4
  wordnet_pos      generate-until, 3-shot: a word's part of speech (noun, verb, adjective, adverb)
  gpl3_perplexity  rolling log-likelihood: the paragraphs of the GNU GPL 3 (word/byte perplexity,
                   bits per byte)

WordNet is package wordnet-base (Princeton University's WordNet 3.0 licence, which allows
redistribution with its notice: /usr/share/doc/wordnet-base/copyright); the GPL 3 text is
/usr/share/common-licenses/GPL-3 of base-files. The words configs/smollm2-sft.toml trains on
(scripts/smollm2_sft_data.py's WordNet sample) are left out, so its before/after scores are not
scores on its own training data.

  python3 scripts/eval_tasks_data.py [OUT_DIR] [--wordnet DIR]
"""
import argparse
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import smollm2_sft_data as sft  # noqa: E402


def write(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def sft_words(wordnet):
    """The quoted words of the SFT job's WordNet questions (same sample, same seed)."""
    picked, _ = sft.wordnet_examples(wordnet, 4000, random.Random(1))
    out = set()
    for q, r in picked:
        m = re.search(r'"([^"]+)"', q)
        out.add((m.group(1) if m else r).lower())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=os.path.join(os.path.dirname(__file__), "..", "eval", "tasks", "data"))
    ap.add_argument("--wordnet", default="/usr/share/wordnet")
    ap.add_argument("--gpl", default="/usr/share/common-licenses/GPL-3")
    a = ap.parse_args()
    if not os.path.isfile(os.path.join(a.wordnet, "data.noun")):
        sys.exit(f"eval_tasks_data: {a.wordnet}/data.noun not found (apt-get install wordnet-base)")
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(49)
    exclude = sft_words(a.wordnet)

    # The parts of speech each lemma has anywhere in WordNet (index.POS: lemma first).
    pos_of = {}
    for pos in sft.POS:
        with open(os.path.join(a.wordnet, f"index.{pos}"), encoding="latin-1") as f:
            for line in f:
                if not line.startswith("  "):
                    pos_of.setdefault(line.split(" ", 1)[0], set()).add(sft.POS_WORD[pos])
    # One entry per monosemous, single-word lemma: (word, part of speech, definition).
    entries = []
    for pos in sft.POS:
        single = sft.monosemous(a.wordnet, pos)
        for words, definition, _ in sft.synsets(a.wordnet, pos):
            w = words[0]
            if w.lower() not in single or "_" in w or "-" in w or not w.isalpha() or w.lower() in exclude:
                continue
            if not (12 <= len(definition) <= 90):
                continue
            entries.append((w, sft.POS_WORD[pos], definition))
    entries.sort()
    rng.shuffle(entries)
    by_pos = {}
    for e in entries:
        by_pos.setdefault(e[1], []).append(e)

    def distractors(e, field, k=3):
        pool = by_pos[e[1]]
        out = []
        while len(out) < k:
            d = pool[rng.randrange(len(pool))][field]
            if d != e[field] and d not in out:
                out.append(d)
        return out

    def mc(e, field):
        choices = distractors(e, field) + [e[field]]
        rng.shuffle(choices)
        return choices, choices.index(e[field])

    used = 0

    def take(n):
        nonlocal used
        out = entries[used:used + n]
        used += n
        return out

    rows = []
    for e in take(400):
        choices, gold = mc(e, 2)
        rows.append({"word": e[0], "pos": e[1], "choices": choices, "label": gold})
    write(os.path.join(a.out, "wordnet_define.jsonl"), rows)

    for split, n in (("train", 50), ("test", 300)):
        rows = []
        for e in take(n):
            choices, gold = mc(e, 0)
            rows.append({"definition": e[2], "pos": e[1], "choices": choices, "label": gold})
        write(os.path.join(a.out, f"wordnet_word_{split}.jsonl"), rows)

    for split, n in (("train", 40), ("test", 200)):
        rows = []
        for e in take(10 * n):
            if len(rows) == n:
                break
            if len(pos_of.get(e[0].lower(), {e[1]})) == 1:  # a word with one part of speech
                rows.append({"word": e[0], "pos": e[1]})
        write(os.path.join(a.out, f"wordnet_pos_{split}.jsonl"), rows)

    with open(a.gpl, encoding="utf-8") as f:
        text = f.read()
    paragraphs = [re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", text)]
    paragraphs = [p for p in paragraphs if len(p.split()) >= 20]
    write(os.path.join(a.out, "gpl3_perplexity.jsonl"), [{"text": p} for p in paragraphs])
    print(f"eval_tasks_data: {a.out}: wordnet_define 400, wordnet_word 50/300, wordnet_pos 40/200, "
          f"gpl3_perplexity {len(paragraphs)} ({len(entries)} WordNet entries, {len(exclude)} SFT words left out)")


if __name__ == "__main__":
    main()
