#!/usr/bin/env python3
"""Builds the preference pairs of configs/smollm2-dpo.toml from the WordNet 3.0 database that ships
with Debian 12 (package wordnet-base). Each pair asks what a word means; the chosen answer is the
word's own WordNet gloss, the rejected answer the gloss of a different, related synset of the same
part of speech: a plausible answer that is wrong. Deterministic: the same package gives the same
files. WordNet is read with scripts/smollm2_sft_data.py's functions (imported, not copied).

  python3 scripts/smollm2_dpo_data.py OUT_DIR [--wordnet DIR] [--train N] [--heldout N]
                                      [--sft-data FILE]

Writes OUT_DIR/train.jsonl and OUT_DIR/heldout.jsonl, one row per line in TRL's conversational
preference format (the `preference` dataset reads it):
  {"prompt": [{"role": "user", "content": "What does the noun \\"X\\" mean?"}],
   "chosen": [{"role": "assistant", "content": "X's gloss."}],
   "rejected": [{"role": "assistant", "content": "Another synset's gloss."}]}
and OUT_DIR/data.json (counts, how each rejected answer was chosen, sources, the licence).

The words: lemmas with one sense in their part of speech (index.POS), the first such lemma of a
synset, as smollm2_sft_data.py takes them; glosses of at least 12 characters, first letter
capitalised, a full stop added. About 75% nouns, 12.5% verbs, 8.5% adjectives, 4% adverbs (the
same shares in both files). The rejected gloss, in this order of preference:
  - "sibling": nouns and verbs: a synset sharing a direct hypernym (@, or @i for instances) with
    the word's synset; adjectives: a synset of the same cluster (the head adjective and its
    satellites, linked by "similar to", &). Among the siblings, those whose gloss is 0.5-2x as
    long as the chosen one are preferred; one is drawn at random.
  - "similar_length": adverbs, and words without a sibling: a random gloss of the same part of
    speech among the 40 closest in length to the chosen one.
A rejected gloss is never the chosen text itself. No lemma (case-insensitive, in any part of
speech) is in both files, and no held-out lemma is among the lemmas of the SFT data's WordNet
items (its 4,000 questions and answers: --sft-data FILE when given or when
build/cache/smollm2-sft/data.jsonl exists, else the same items recomputed with
smollm2_sft_data.wordnet_examples and its default count and seed).

Licence: WordNet 3.0 licence (Princeton University, permissive; /usr/share/doc/wordnet-base/copyright):
"WordNet 3.0 Copyright 2006 by Princeton University. All rights reserved." — the notice and the
disclaimer go with every copy, these files included (data.json carries them)."""
import argparse
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from smollm2_sft_data import POS, POS_WORD, monosemous, synsets, wordnet_examples  # noqa: E402

SHARES = {"noun": 0.75, "verb": 0.125, "adj": 0.085, "adv": 0.04}  # the rest goes to nouns
SFT_WORDNET_EXAMPLES = 4000  # smollm2_sft_data.py's default --wordnet-examples
SFT_SEED = 1                 # its random.Random(1) for the WordNet items
NEAREST = 40                 # the similar-length fallback draws among this many glosses
COPYRIGHT = "WordNet 3.0 Copyright 2006 by Princeton University. All rights reserved."


def records(wordnet, kind):
    """(offset, ss_type, pointers) per synset of data.KIND, in the order synsets() yields them;
    pointers are (symbol, target offset, target pos letter) (format: wndb(5WN))."""
    with open(os.path.join(wordnet, f"data.{kind}"), encoding="latin-1") as f:
        for line in f:
            if line.startswith("  "):
                continue
            parts = line.partition(" | ")[0].split()
            k = 4 + 2 * int(parts[3], 16)
            ptrs = [(parts[k + 1 + 4 * i], parts[k + 2 + 4 * i], parts[k + 3 + 4 * i]) for i in range(int(parts[k]))]
            yield parts[0], parts[2], ptrs


def sentence(definition):
    s = definition[0].upper() + definition[1:]
    return s if s.endswith((".", "!", "?")) else s + "."


def groups_of(offset, ss_type, ptrs, pos):
    """The keys of the sibling groups a synset belongs to."""
    if pos in ("n", "v"):
        return [p[1] for p in ptrs if p[0] in ("@", "@i") and p[2] == pos]
    if pos == "a":
        if ss_type == "a":
            return [offset]  # a head adjective heads its own cluster
        return [p[1] for p in ptrs if p[0] == "&" and p[2] == "a"]
    return []  # adverbs have no hypernyms nor clusters


def candidates(wordnet, kind, rng):
    """[(lemma, chosen, rejected, method)] for every monosemous lemma of one part of speech."""
    pos = POS[kind]  # the pointers' letter; the files are named by kind (data.noun, index.adj, ...)
    single = monosemous(wordnet, kind)
    syns = []
    for (words, definition, _), (offset, ss_type, ptrs) in zip(synsets(wordnet, kind), records(wordnet, kind)):
        syns.append({"words": words, "gloss": sentence(definition) if len(definition) >= 12 else None,
                     "groups": groups_of(offset, ss_type, ptrs, pos)})
    members = {}
    for i, s in enumerate(syns):
        for g in s["groups"]:
            members.setdefault(g, []).append(i)
    by_length = sorted((len(s["gloss"]), i) for i, s in enumerate(syns) if s["gloss"])
    rank = {i: r for r, (_, i) in enumerate(by_length)}
    out = []
    for i, s in enumerate(syns):
        lemmas = [w for w in s["words"] if w.lower() in single]
        if not lemmas or not s["gloss"]:
            continue
        chosen = s["gloss"]
        sibs = sorted({j for g in s["groups"] for j in members[g]} - {i})
        sibs = [j for j in sibs if syns[j]["gloss"] and syns[j]["gloss"] != chosen]
        if sibs:
            close = [j for j in sibs if 0.5 <= len(syns[j]["gloss"]) / len(chosen) <= 2.0]
            rejected, method = syns[rng.choice(close or sibs)]["gloss"], "sibling"
        else:
            r = rank[i]
            near = [j for _, j in by_length[max(0, r - NEAREST // 2):r + NEAREST // 2 + 1]
                    if j != i and syns[j]["gloss"] != chosen]
            rejected, method = syns[rng.choice(near)]["gloss"], "similar_length"
        out.append((lemmas[0].replace("_", " "), chosen, rejected, method))
    return out


def sft_lemmas(wordnet, path):
    """The lemmas of the SFT data's WordNet items (questions naming them or answers being them)."""
    if path and os.path.isfile(path):
        pairs, source = [], path
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    m = json.loads(line)["messages"]
                    pairs.append((m[0]["content"], m[1]["content"]))
    else:
        pairs = wordnet_examples(wordnet, SFT_WORDNET_EXAMPLES, random.Random(SFT_SEED))[0]
        source = f"recomputed: smollm2_sft_data.wordnet_examples(n={SFT_WORDNET_EXAMPLES}, seed={SFT_SEED})"
    named = re.compile(r'^(?:What does|Use) the (?:noun|verb|adjective|adverb) "(.+)" (?:mean\?|in a sentence\.)$')
    out, items = set(), 0
    for q, r in pairs:
        if m := named.match(q):
            out.add(m.group(1).lower())
            items += 1
        elif re.match(r"^Which (?:noun|verb|adjective|adverb) means: ", q):
            out.add(r.lower())
            items += 1
    return out, items, source


def row(kind, lemma, chosen, rejected):
    return {"prompt": [{"role": "user", "content": f'What does the {POS_WORD[kind]} "{lemma}" mean?'}],
            "chosen": [{"role": "assistant", "content": chosen}],
            "rejected": [{"role": "assistant", "content": rejected}]}


def quotas(n):
    q = {k: int(round(share * n)) for k, share in SHARES.items()}
    q["noun"] += n - sum(q.values())
    return q


def write_jsonl(path, rows):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)  # complete or absent


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--wordnet", default="/usr/share/wordnet")
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--heldout", type=int, default=200)
    ap.add_argument("--sft-data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build",
                                                       "cache", "smollm2-sft", "data.jsonl"))
    a = ap.parse_args()
    if not os.path.isfile(os.path.join(a.wordnet, "data.noun")):
        sys.exit(f"smollm2_dpo_data: {a.wordnet}/data.noun not found (apt-get install wordnet-base)")
    sft, sft_items, sft_source = sft_lemmas(a.wordnet, a.sft_data)
    cands = {}
    for k, kind in enumerate(POS):
        c = candidates(a.wordnet, kind, random.Random(10 + k))
        random.Random(20 + k).shuffle(c)
        cands[kind] = c
    used = set()
    splits = {"heldout": [], "train": []}
    counts = {"heldout": {}, "train": {}}
    for split, n in (("heldout", a.heldout), ("train", a.train)):  # held-out first: it has the stricter rule
        for kind, want in quotas(n).items():
            got = 0
            methods = {"sibling": 0, "similar_length": 0}
            for lemma, chosen, rejected, method in cands[kind]:
                if got == want:
                    break
                key = lemma.lower()
                if key in used or (split == "heldout" and key in sft):
                    continue
                used.add(key)
                splits[split].append((kind, lemma, chosen, rejected))
                methods[method] += 1
                got += 1
            if got < want:
                sys.exit(f"smollm2_dpo_data: only {got} {kind} pairs for {split} (wanted {want})")
            counts[split][kind] = {"pairs": got, "rejected_from": methods}
    for split in splits:
        random.Random(3).shuffle(splits[split])
    os.makedirs(a.out_dir, exist_ok=True)
    meta = {"train": sum(v["pairs"] for v in counts["train"].values()),
            "heldout": sum(v["pairs"] for v in counts["heldout"].values()),
            "counts": counts,
            "candidates": {kind: len(c) for kind, c in cands.items()},
            "prompt": 'What does the {noun|verb|adjective|adverb} "LEMMA" mean?',
            "chosen": "the lemma's WordNet gloss (monosemous lemmas; first letter capitalised, full stop added)",
            "rejected": {"sibling": "the gloss of a synset sharing a direct hypernym (nouns, verbs) or the "
                                    "adjective cluster (head + satellites), preferring 0.5-2x the chosen length",
                         "similar_length": f"a random gloss of the same part of speech among the {NEAREST} "
                                           "closest in length (adverbs; words without a sibling)"},
            "heldout_excludes": {"sft_lemmas": len(sft), "sft_wordnet_items": sft_items, "sft_source": sft_source},
            "wordnet": {"dir": a.wordnet, "package": "wordnet-base",
                        "license": "WordNet 3.0 license (Princeton University)",
                        "copyright": COPYRIGHT,
                        "license_file": "/usr/share/doc/wordnet-base/copyright"}}
    with open(os.path.join(a.out_dir, "data.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
    write_jsonl(os.path.join(a.out_dir, "heldout.jsonl"), [row(*r) for r in splits["heldout"]])
    write_jsonl(os.path.join(a.out_dir, "train.jsonl"), [row(*r) for r in splits["train"]])  # last: marks done
    sib = sum(v["rejected_from"]["sibling"] for s in counts.values() for v in s.values())
    print(f"smollm2_dpo_data: {meta['train']} train + {meta['heldout']} held-out pairs from WordNet "
          f"({sib} rejected answers from a sibling synset, the rest of similar length; held-out lemmas "
          f"avoid {len(sft)} SFT lemmas) -> {a.out_dir}")


if __name__ == "__main__":
    main()
