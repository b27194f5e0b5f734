"""`trainrun generate` (KV-cache decoding, issue 22 done-when 4) against transformers'
generate(do_sample=False), fp32, token for token.

Modes:
  tiny VARIANT  A tiny random model that transformers builds here (the families of tiny_models.py;
                sliding windows exceeded by prompt + generation) with a small byte-level
                BPE tokenizer trained here by `tokenizers` and a chat template:
                (1) the KV-cache logits (llama_logits --kv-cache: half prefill, then one token per
                call), batch 2 and batch 1, equal the full forward's within 1e-5 relative;
                (2) greedy ids equal transformers' on 4 prompts x 24 new tokens, plain and --chat
                (prompt ids equal tokenizer(...) / apply_chat_template(..., tokenize=True));
                (3) with a second EOS id in generation_config.json (the token transformers emits
                at step 6), both stop at its first occurrence and trainrun says finish "eos";
                (4) --temperature 1 --top-p 1e-9 (only the most likely token survives) equals
                greedy; (5) llama3 only: a random PEFT LoRA adapter (--adapter) equals
                PeftModel.generate, and bad input (no config.json, a bad prompts-file line, an
                adapter of the wrong shape, --top-p 0) exits 2 naming the fault.
  batch VARIANT Batched generation (issue 44) on the tiny model: (a) greedy --batch-size 16 over 16
                prompts of different lengths equals transformers' left-padded batched
                generate(do_sample=False) token for token (cut at EOS); (b) it also equals
                --batch-size 1, and seeded sampling (--num-generations 2, top-k, top-p) gives the
                same completions at --batch-size 1 and 16; (c) the first sampled token of 6000
                completions of one prompt, at (T 0.7, top-k 50, top-p 0.9) and (T 1.3, no filter),
                matches softmax(logits / T) after transformers' TopK/TopP warpers: no draw outside
                the kept set, and Pearson's chi-square over the kept tokens (expected counts < 5
                pooled) has p > 0.001; (d) --stop ends a completion at the token whose text
                completes the string (finish "stop"); (e) llama_logits --padded (rows of 4 lengths,
                left-padded, through PaddedDecoder) equals the full forward within 1e-5 relative,
                with and without a random PEFT LoRA adapter as unmerged LoRA modules.
  smollm2       SmolLM2-135M-Instruct (scripts/gguf_to_hf.py, cached): 8 prompts x 32 new tokens
                equal transformers' greedy ids (plus 2 --chat prompts); KV-cache logits vs full
                forward on one prompt; tokens/s of both (1 thread each) printed.

"Relative" is max|x - ref| / max|ref|.

usage: generate_ref.py TRAINRUN LLAMA_LOGITS WORK MODE [VARIANT | CACHE_DIR SCRIPTS_DIR [smollm2 only: batch]]
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import torch

TRAINRUN, LOGITS_EXE, WORK, MODE = sys.argv[1:5]
torch.set_num_threads(1)

TINY_PROMPTS = ["The quick brown fox", "def main():\n    return 0", "Hello, world! 123",
                "Once upon a time there was"]
SMOL_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "Once upon a time, in a small village by the sea,",
    "The derivative of x squared is",
    "Translate to German: Good morning, how are you?",
    "Water boils at 100 degrees Celsius at sea level because",
    "1, 1, 2, 3, 5, 8, 13,",
    "The three primary colors are",
]


def fail(msg):
    print("FAIL:", msg, flush=True)
    sys.exit(1)


def rel(x, ref):
    return ((x.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def make_tiny(variant, out):
    from transformers import AutoModelForCausalLM
    from tiny_models import bpe_tokenizer, config, stable_text

    # A byte-level BPE over a fixed text (tiny_models.stable_text): cases (b) and the EOS choice
    # rely on the prompts' token counts. Ids 0-2: <unk>, <s>, </s>.
    fast = bpe_tokenizer([stable_text()])
    vocab = len(fast)
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
    cfg = config(variant, **common)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            # Larger weights than the default init: sharper distributions, fewer near-ties (the
            # Gemma configurations start from initializer_range 0.2 already).
            p.add_(0.1 * torch.randn_like(p)) if p.dim() == 1 else p.mul_(3.0 if cfg.initializer_range < 0.1 else 1.0)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return model.eval(), fast


def hf_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32).eval()


def prompt_ids(tok, prompt, chat):
    if not chat:
        return tok(prompt)["input_ids"]
    r = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
    return list(r["input_ids"]) if hasattr(r, "keys") else list(r)


def reference(model, tok, prompts, chat, max_new):
    """transformers' greedy new ids per prompt, and the seconds generate() took in all."""
    out, seconds = [], 0.0
    for p in prompts:
        ids = torch.tensor([prompt_ids(tok, p, chat)])
        t0 = time.perf_counter()
        with torch.no_grad():
            g = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new)
        seconds += time.perf_counter() - t0
        out.append((ids[0].tolist(), g[0, ids.size(1):].tolist()))
    return out, seconds


def trainrun_generate(model_dir, prompts, max_new, extra=(), expect=None, quiet=False):
    pf = os.path.join(WORK, "prompts.jsonl")
    with open(pf, "w", encoding="utf-8") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p}) + "\n")
    cmd = [TRAINRUN, "generate", "--model", model_dir, "--prompts-file", pf, "--max-new-tokens", str(max_new),
           "--jsonl", "--threads", "1", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if not quiet or r.returncode != 0:
        sys.stdout.write(r.stderr)
    if r.returncode != 0:
        print(r.stdout)
        fail(f"trainrun generate exited {r.returncode}: {' '.join(cmd)}")
    global LAST_TIMES
    m = re.search(r"prefill ([0-9.e+-]+) s; \d+ new tokens, decode ([0-9.e+-]+) s", r.stderr)
    LAST_TIMES = (float(m.group(1)), float(m.group(2))) if m else None
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    if len(rows) != (rows_expected := len(prompts) if expect is None else expect):
        fail(f"trainrun generate printed {len(rows)} results, expected {rows_expected}")
    return rows


def compare(what, ours, ref, eos=None):
    for i, (row, (pids, new)) in enumerate(zip(ours, ref)):
        if row["prompt_ids"] != pids:
            fail(f"{what}, prompt {i}: prompt ids {row['prompt_ids']} != transformers' {pids}")
        if row["ids"] != new:
            fail(f"{what}, prompt {i}: trainrun {row['ids']} != transformers {new}")
        if eos is not None and new and new[-1] in eos and row["finish_reason"] != "eos":
            fail(f"{what}, prompt {i}: ended on EOS {new[-1]} but finish_reason is {row['finish_reason']}")
    print(f"{what}: {len(ref)} prompts, {sum(len(n) for _, n in ref)} new tokens equal transformers' greedy ids")


def kv_logits(model_dir, ids, mode="--kv-cache", adapter=None):
    """llama_logits' KV-cache logits (`mode`: --kv-cache, or --padded: row b cut to T - 2b tokens and
    left-padded) against its full forward, optionally with a PEFT adapter as unmerged LoRA modules."""
    from safetensors.torch import load_file, save_file

    ids_path = os.path.join(WORK, "kv-ids.safetensors")
    save_file({"input_ids": ids}, ids_path)
    outs = []
    for extra in ([], [mode]):
        out = os.path.join(WORK, f"kv-logits{len(outs)}.safetensors")
        r = subprocess.run([LOGITS_EXE, model_dir, ids_path, out, *([adapter] if adapter else []), *extra],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            fail(f"llama_logits {' '.join(extra)} exited {r.returncode}")
        outs.append(load_file(out)["logits"])
    if mode == "--padded":
        for b in range(ids.size(0)):
            outs[0][b, ids.size(1) - 2 * b:] = 0
    d = rel(outs[1], outs[0])
    print(f"KV-cache logits ({mode}{', LoRA' if adapter else ''}) vs full forward, ids {list(ids.shape)}: "
          f"max relative difference {d:.2e} "
          f"(max abs {(outs[1] - outs[0]).abs().max().item():.2e})")
    if d > 1e-5:
        fail(f"KV-cache logits differ from the full forward by {d:.2e} (tolerance 1e-5)")
    return outs[0]


def tiny(variant):
    model_dir = os.path.join(WORK, "model")
    model, tok = make_tiny(variant, model_dir)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, len(tok), (2, 20), generator=g)
    kv_logits(model_dir, ids)  # batch 2: the layers' own forward
    kv_logits(model_dir, ids[:1])  # batch 1: the decode steps' matrix-vector path
    model = hf_model(model_dir)
    max_new = 24
    refs = {}
    for chat in (False, True):
        refs[chat], _ = reference(model, tok, TINY_PROMPTS, chat, max_new)
        ours = trainrun_generate(model_dir, TINY_PROMPTS, max_new, ["--chat"] if chat else [])
        compare(f"{variant} greedy{' --chat' if chat else ''}", ours, refs[chat])
    # A second EOS id: the token transformers emits at step 6 of the first plain prompt that runs
    # that long (the tokenizer is trained on the docs, so which one changes with them).
    first = next((i for i, (_, new) in enumerate(refs[False]) if len(new) >= 6), None)
    if first is None:
        fail(f"no plain prompt ran 6 tokens: {refs[False]}")
    stop = refs[False][first][1][5]
    gc_path = os.path.join(model_dir, "generation_config.json")
    with open(gc_path) as f:
        gc = json.load(f)
    gc["eos_token_id"] = [2, stop]
    with open(gc_path, "w") as f:
        json.dump(gc, f)
    model = hf_model(model_dir)
    ref, _ = reference(model, tok, TINY_PROMPTS, False, max_new)
    if not ref[first][1] or ref[first][1][-1] != stop or len(ref[first][1]) > 6:
        fail(f"transformers did not stop at EOS {stop}: {ref[first][1]}")
    ours = trainrun_generate(model_dir, TINY_PROMPTS, max_new)
    compare(f"{variant} with eos_token_id [2, {stop}]", ours, ref, eos={2, stop})
    ours = trainrun_generate(model_dir, TINY_PROMPTS, max_new, ["--temperature", "1", "--top-p", "1e-9", "--seed", "5"])
    compare(f"{variant} --temperature 1 --top-p 1e-9", ours, ref)
    if variant == "llama3":
        bad_cases(model_dir)
        from peft import LoraConfig, PeftModel, get_peft_model

        torch.manual_seed(1)
        peft_model = get_peft_model(hf_model(model_dir), LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False))
        adapter = os.path.join(WORK, "adapter")
        peft_model.save_pretrained(adapter)
        ref_adapter, _ = reference(PeftModel.from_pretrained(hf_model(model_dir), adapter).eval(), tok,
                                   TINY_PROMPTS, False, max_new)
        if [n for _, n in ref_adapter] == [n for _, n in ref]:
            fail("the adapter does not change transformers' output: the check would prove nothing")
        ours = trainrun_generate(model_dir, TINY_PROMPTS, max_new, ["--adapter", adapter])
        compare(f"{variant} --adapter (PEFT LoRA r 4)", ours, ref_adapter, eos={2, stop})


BATCH_TEXT = ("Batched generation pads the shorter prompts on the left, so that every row's last prompt "
              "token sits in the same slot, and masks the padding out of attention.")
BATCH_PROMPTS = [BATCH_TEXT[i: i + 3 + 7 * i] for i in range(16)]  # 16 different lengths


def hf_batched(model, tok, prompts, max_new, eos):
    """transformers' greedy generate over one left-padded batch; each row cut after its first EOS."""
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    enc = tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        g = model.generate(**enc, do_sample=False, max_new_tokens=max_new, pad_token_id=tok.pad_token_id)
    out = []
    for row in g[:, enc["input_ids"].size(1):].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        out.append(row[:cut])
    return out


def chi_square_p(counts, probs, n):
    """Pearson's chi-square p-value of `counts` (n draws) against `probs`; bins with expected < 5 pooled."""
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    if exp[-1] < 5:  # too little mass to pool: fold it into the last big bin
        obs, exp = torch.cat([obs[:-2], (obs[-2] + obs[-1]).view(1)]), torch.cat([exp[:-2], (exp[-2] + exp[-1]).view(1)])
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = obs.numel() - 1
    return torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2).item(), stat.item(), dof


def batch(variant):
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    model_dir = os.path.join(WORK, "model")
    model, tok = make_tiny(variant, model_dir)
    model = hf_model(model_dir)
    max_new, eos = 24, {2}
    if len({len(prompt_ids(tok, p, False)) for p in BATCH_PROMPTS}) < 12:
        fail("the batch prompts do not have enough different lengths")
    ref = hf_batched(model, tok, BATCH_PROMPTS, max_new, eos)
    ours = trainrun_generate(model_dir, BATCH_PROMPTS, max_new, ["--batch-size", "16"])
    compare(f"(a) {variant} greedy, one left-padded batch of 16", ours,
            [(prompt_ids(tok, p, False), r) for p, r in zip(BATCH_PROMPTS, ref)], eos=eos)
    single = trainrun_generate(model_dir, BATCH_PROMPTS, max_new, ["--batch-size", "1"])
    if variant == "phi3long":
        # longrope takes its long factors when a forward's longest position passes the pretraining
        # context, over the whole batch (transformers too), so a row's completion depends on its
        # batch mates: batch 1 is checked against transformers' generate of each prompt alone.
        alone, _ = reference(model, tok, BATCH_PROMPTS, False, max_new)
        compare("(b) phi3long --batch-size 1 vs transformers' generate of each prompt alone", single, alone,
                eos=eos)
        if [r["ids"] for r in single] == [r["ids"] for r in ours]:
            fail("(b) the batch does not change longrope's completions: the check would prove nothing")
        return
    if [r["ids"] for r in single] != [r["ids"] for r in ours]:
        fail("(b) greedy --batch-size 1 differs from --batch-size 16")
    sampled = ["--temperature", "0.9", "--top-k", "30", "--top-p", "0.95", "--num-generations", "2", "--seed", "11"]
    s16 = trainrun_generate(model_dir, BATCH_PROMPTS, 12, ["--batch-size", "16", *sampled], expect=32)
    s1 = trainrun_generate(model_dir, BATCH_PROMPTS, 12, ["--batch-size", "1", *sampled], expect=32)
    if [r["ids"] for r in s16] != [r["ids"] for r in s1]:
        fail("(b) seeded sampling differs between --batch-size 1 and 16")
    if all(s16[2 * i]["ids"] == s16[2 * i + 1]["ids"] for i in range(16)):
        fail("(b) the two sampled completions of every prompt are equal: sampling is not sampling")
    print("(b) greedy and seeded sampling: --batch-size 1 equals --batch-size 16")

    prompt, n = BATCH_PROMPTS[9], 6000
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids(tok, prompt, False)])).logits[:, -1].double()
    for temp, top_k, top_p in ((0.7, 50, 0.9), (1.3, 0, 1.0)):
        scores = TemperatureLogitsWarper(temp)(None, logits)
        if top_k:
            scores = TopKLogitsWarper(top_k)(None, scores)
        if top_p < 1:
            scores = TopPLogitsWarper(top_p)(None, scores)
        probs = scores.softmax(-1)[0]
        rows = trainrun_generate(model_dir, [prompt], 1, ["--temperature", str(temp), "--top-k", str(top_k), "--top-p",
                                                          str(top_p), "--num-generations", str(n), "--batch-size",
                                                          "2000", "--seed", "3"], expect=n, quiet=True)
        counts = torch.bincount(torch.tensor([r["ids"][0] for r in rows]), minlength=probs.numel()).double()
        outside = int(counts[probs == 0].sum())
        if outside:
            fail(f"(c) T {temp} top-k {top_k} top-p {top_p}: {outside} draws outside the kept tokens")
        kept = probs > 0
        p, stat, dof = chi_square_p(counts[kept], probs[kept], n)
        print(f"(c) T {temp} top-k {top_k} top-p {top_p}: {int(kept.sum())} kept tokens, {n} draws, "
              f"chi-square {stat:.1f} on {dof} dof, p = {p:.3f}")
        if not p > 1e-3:
            fail(f"(c) sampled frequencies do not match the filtered softmax (p = {p:.2e} <= 0.001)")

    # (e) Left-padded KV-cache logits equal the full forward's, also with LoRA adapters active as the
    # lora callback's own (unmerged) modules, which generation then runs through.
    ids = torch.randint(0, len(tok), (4, 20), generator=torch.Generator().manual_seed(5))
    base = kv_logits(model_dir, ids, "--padded")
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(2)
    adapter = os.path.join(WORK, "adapter")
    get_peft_model(hf_model(model_dir), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                                   init_lora_weights=False)).save_pretrained(adapter)
    if rel(kv_logits(model_dir, ids, "--padded", adapter), base) < 1e-3:
        fail("(e) the adapter does not change the logits: the check would prove nothing")

    # (d) A stop string: the text of new tokens 4-5 of prompt 0's greedy completion.
    row = ours[0]["ids"]
    if len(row) < 6:
        fail("(d) the greedy completion is too short to take a stop string from")
    target = tok.decode(row[3:5], skip_special_tokens=True)
    stopped = trainrun_generate(model_dir, BATCH_PROMPTS[:1], max_new, ["--stop", target])[0]
    ids = stopped["ids"]
    if (stopped["finish_reason"] != "stop" or ids != row[: len(ids)] or
            target not in tok.decode(ids, skip_special_tokens=True) or
            target in tok.decode(ids[:-1], skip_special_tokens=True)):
        fail(f"(d) --stop {target!r}: got {ids} ({stopped['finish_reason']}) from {row}")
    print(f"(d) --stop {target!r} ended the completion after {len(ids)} tokens")


def bad_cases(model_dir):
    """Bad input: exit 2 with a message naming the fault."""
    bad_prompts = os.path.join(WORK, "bad.jsonl")
    with open(bad_prompts, "w") as f:
        f.write('{"prompt": "fine"}\n{"prompt": 3}\n')
    bad_adapter = os.path.join(WORK, "bad-adapter")
    os.makedirs(bad_adapter)
    with open(os.path.join(bad_adapter, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": 2, "lora_alpha": 2}, f)
    from safetensors.torch import save_file
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(2, 7),
               "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(32, 2)},
              os.path.join(bad_adapter, "adapter_model.safetensors"))
    cases = [(["--model", WORK, "--prompt", "x"], "no config.json"),
             (["--model", model_dir, "--prompts-file", bad_prompts], "bad.jsonl:2"),
             (["--model", model_dir, "--prompt", "x", "--adapter", bad_adapter], "does not fit"),
             (["--model", model_dir, "--prompt", "x", "--top-p", "0"], "--top-p")]
    for args, expect in cases:
        r = subprocess.run([TRAINRUN, "generate", "--max-new-tokens", "4", *args], capture_output=True, text=True)
        if r.returncode != 2 or expect not in r.stderr:
            fail(f"generate {' '.join(args)}: expected exit 2 naming {expect!r}, got {r.returncode}: {r.stderr}")
    print(f"bad input: {len(cases)} cases exit 2 naming the fault")


def smollm2(cache, scripts):
    from transformers import AutoTokenizer

    model_dir = os.path.join(cache, "smollm2-135m-instruct")
    if subprocess.run([sys.executable, os.path.join(scripts, "gguf_to_hf.py"), model_dir]).returncode != 0:
        fail("gguf_to_hf.py failed")
    tok = AutoTokenizer.from_pretrained(model_dir)
    kv_logits(model_dir, torch.tensor([tok(SMOL_PROMPTS[2] + " " + SMOL_PROMPTS[5])["input_ids"]]))
    model = hf_model(model_dir)
    max_new = 32
    ref, hf_s = reference(model, tok, SMOL_PROMPTS, False, max_new)
    t0 = time.perf_counter()
    ours = trainrun_generate(model_dir, SMOL_PROMPTS, max_new)
    wall = time.perf_counter() - t0
    ours_s = sum(LAST_TIMES)  # trainrun's own prefill + decode time, without model loading
    compare("SmolLM2-135M-Instruct greedy, fp32", ours, ref)
    chat_prompts = ["What is 2 + 2?", "Name a fruit that is yellow."]
    compare("SmolLM2-135M-Instruct greedy --chat", trainrun_generate(model_dir, chat_prompts, max_new, ["--chat"]),
            reference(model, tok, chat_prompts, True, max_new)[0])
    new = sum(len(r["ids"]) for r in ours)
    # Issue 44 done-when 2: 16 prompts of different lengths in one left-padded batch.
    prompts16 = SMOL_PROMPTS + [p.split(",")[0][:12] + " and" for p in SMOL_PROMPTS]
    with open(os.path.join(model_dir, "generation_config.json")) as f:
        eos = json.load(f).get("eos_token_id")
    eos = set(eos if isinstance(eos, list) else [eos]) | {tok.eos_token_id}
    ref16 = hf_batched(model, tok, prompts16, max_new, eos)
    compare("SmolLM2-135M-Instruct greedy, one left-padded batch of 16", trainrun_generate(
        model_dir, prompts16, max_new, ["--batch-size", "16"]), [(prompt_ids(tok, p, False), r)
                                                                  for p, r in zip(prompts16, ref16)], eos=eos)
    print(f"tokens/s (1 thread, {new} new tokens over 8 prompts, prefill included): trainrun (one batch) "
          f"{new / ours_s:.1f}, transformers generate (one prompt at a time) {new / hf_s:.1f} (ratio "
          f"{hf_s / ours_s:.2f}x; bench/generate.py compares batch with batch); trainrun process wall "
          f"{wall:.1f} s incl. loading")


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    if MODE == "tiny":
        tiny(sys.argv[5])
    elif MODE == "batch":
        batch(sys.argv[5])
    elif MODE == "smollm2":
        smollm2(sys.argv[5], sys.argv[6])
    else:
        fail(f"unknown mode {MODE}")
    print("PASS")


if __name__ == "__main__":
    main()
