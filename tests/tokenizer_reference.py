"""Token-for-token equality of `trainrun encode`/`decode` with Hugging Face `tokenizers` (PyPI).

usage: tokenizer_reference.py TRAINRUN WORK_DIR TOKENIZER_DIR...

For each tokenizer directory, on the corpus of tokenizer_corpus.py: ids with and without special
tokens, decode with and without skip_special_tokens (of the encoded ids and of random id
sequences, which exercise invalid UTF-8 and byte fallback), and decode(encode(x)) == x where the
tokenizer is lossless for x. Prints the counts compared; exits 1 on any mismatch."""
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


def main():
    trainrun, work, dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
    os.makedirs(work, exist_ok=True)
    failures = 0
    for d in dirs:
        name = os.path.basename(os.path.normpath(d))
        ref = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        specials = [t.content for t in ref.get_added_tokens_decoder().values()]
        docs = tokenizer_corpus.assemble(specials)
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
            if not skip:
                decoded = got[:len(docs)]
        # Lossless where the tokenizer's components say so: byte-level BPE without a normalizer
        # keeps every text; NFC changes only non-NFC text; SentencePiece's legacy prefix space is
        # added per stretch between special tokens, so texts holding one do not come back.
        lossless = [i for i, x in enumerate(docs)
                    if (name != "qwen3" or unicodedata.normalize("NFC", x) == x)
                    and (name != "mistral" or not any(s in x for s in specials))]
        # Without special tokens in the ids (mistral's BOS would decode as "<s>").
        plain = [json.loads(line)["text"] for line in run(
            trainrun, ["decode", "--tokenizer", d, "--jsonl"],
            jsonl({"ids": json.loads(line)["ids"]} for line in run(
                trainrun, ["encode", "--tokenizer", d, "--jsonl"], jsonl({"text": docs[i]} for i in lossless)).split("\n")[:-1])).split("\n")[:-1]]
        mism["decode(encode(x)) == x"] = [lossless[k] for k in range(len(lossless)) if plain[k] != docs[lossless[k]]]
        for i in mism["decode(encode(x)) == x"][:3]:
            print(f"  {name} round trip doc {i}: {docs[i][:120]!r}")
        del decoded
        print(f"{name}: {len(docs)} texts, {nbytes} bytes, {total_tokens} tokens (both encodes); "
              f"{len(id_lists)} id lists decoded twice; {len(lossless)} lossless round trips; {time.time() - t0:.1f} s")
        for what, bad in mism.items():
            print(f"  {what}: {len(bad)} mismatches")
            failures += len(bad)
    print("tokenizer reference: " + ("OK, 0 mismatches" if failures == 0 else f"{failures} mismatches"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
