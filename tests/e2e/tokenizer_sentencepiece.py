"""A tokenizer.model-only directory: `trainrun encode`/`decode` equal Debian's spm_encode /
spm_decode (the sentencepiece library itself, package `sentencepiece`) line by line, with BOS
added as tokenizer_config.json's add_bos_token / add_eos_token say; and trainrun, which loads
LibTorch's libprotobuf, survives loading the module.

usage: tokenizer_sentencepiece.py TRAINRUN WORK_DIR"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_corpus  # noqa: E402


def run(cmd, payload):
    p = subprocess.run(cmd, input=payload.encode("utf-8"), capture_output=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.decode(errors='replace')}")
    return p.stdout.decode("utf-8").split("\n")[:-1]


def main():
    trainrun, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    docs = tokenizer_corpus.assemble()
    lines = [l for d in docs for l in d.split("\n") if l.strip() and "\r" not in l][:4000]
    train = os.path.join(work, "train.txt")
    with open(train, "w", encoding="utf-8") as f:
        f.write("\n".join(lines[::2]) + "\n")
    prefix = os.path.join(work, "m")
    subprocess.run(["spm_train", f"--input={train}", f"--model_prefix={prefix}", "--vocab_size=2000",
                    "--model_type=bpe", "--byte_fallback=true", "--character_coverage=0.9995", "--minloglevel=2"],
                   check=True, capture_output=True)
    failures = 0
    text_in = "\n".join(lines) + "\n"
    want = [[int(x) for x in l.split()] for l in run(["spm_encode", "--model", prefix + ".model", "--output_format=id"], text_in)]
    assert len(want) == len(lines)
    for config, bos, eos in ((None, True, False), ({"add_bos_token": False, "add_eos_token": True}, False, True)):
        d = os.path.join(work, "model-" + ("default" if config is None else "eos"))
        os.makedirs(d)
        shutil.copy(prefix + ".model", os.path.join(d, "tokenizer.model"))
        if config is not None:
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump(config, f)
        payload = "".join(json.dumps({"text": l}) + "\n" for l in lines)
        for special in (False, True):
            got = [json.loads(l)["ids"] for l in run([trainrun, "encode", "--tokenizer", d, "--jsonl"] +
                                                     (["--add-special-tokens"] if special else []), payload)]
            exp = [([1] if special and bos else []) + w + ([2] if special and eos else []) for w in want]
            bad = sum(g != e for g, e in zip(got, exp)) + abs(len(got) - len(exp))
            print(f"{os.path.basename(d)} encode special={special}: {len(lines)} lines, {bad} mismatches")
            failures += bad
    ids_in = "\n".join(" ".join(map(str, w)) for w in want) + "\n"
    want_text = run(["spm_decode", "--model", prefix + ".model", "--input_format=id"], ids_in)
    got_text = [json.loads(l)["text"] for l in run([trainrun, "decode", "--tokenizer", os.path.join(work, "model-default"), "--jsonl"],
                                                   "".join(json.dumps({"ids": [1] + w + [2]}) + "\n" for w in want))]
    got_plain = [json.loads(l)["text"] for l in run([trainrun, "decode", "--tokenizer", os.path.join(work, "model-default"),
                                                     "--jsonl", "--skip-special-tokens"],
                                                    "".join(json.dumps({"ids": [1] + w + [2]}) + "\n" for w in want))]
    bad = sum(g != e for g, e in zip(got_plain, want_text)) + abs(len(got_plain) - len(want_text))
    print(f"decode --skip-special-tokens: {len(want_text)} lines, {bad} mismatches against spm_decode")
    failures += bad
    # Without skipping, sentencepiece renders control tokens as nothing; the text stays the same.
    bad = sum(g != e for g, e in zip(got_text, want_text))
    print(f"decode: {bad} mismatches against spm_decode")
    failures += bad
    lossless = sum(t == l for t, l in zip(got_plain, lines))
    print(f"decode(encode(x)) == x for {lossless} of {len(lines)} lines (sentencepiece's own normalization, NFKC, changes the rest)")
    print("tokenizer sentencepiece: " + ("OK" if failures == 0 else f"{failures} mismatches"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
