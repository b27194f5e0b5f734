"""`trainrun generate` (KV-cache decoding, issue 22 done-when 4) against transformers'
generate(do_sample=False), fp32, token for token.

Modes:
  tiny VARIANT  A tiny random model that transformers builds here (llama3: llama3 rope, GQA, tied
                embeddings; qwen2: q/k/v biases; qwen3: q/k norm, head_dim != hidden/heads;
                mistral: sliding_window 8, exceeded by prompt + generation) with a small byte-level
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
  smollm2       SmolLM2-135M-Instruct (scripts/gguf_to_hf.py, cached): 8 prompts x 32 new tokens
                equal transformers' greedy ids (plus 2 --chat prompts); KV-cache logits vs full
                forward on one prompt; tokens/s of both (1 thread each) printed.

"Relative" is max|x - ref| / max|ref|.

usage: generate_ref.py TRAINRUN LLAMA_LOGITS WORK MODE [VARIANT | CACHE_DIR SCRIPTS_DIR]
"""
import json
import os
import shutil
import subprocess
import sys
import time

import torch

TRAINRUN, LOGITS_EXE, WORK, MODE = sys.argv[1:5]
torch.set_num_threads(1)

CHAT_TEMPLATE = ("{% for m in messages %}{{ bos_token }}{{ m['role'] }}\n{{ m['content'] }}{{ eos_token }}\n"
                 "{% endfor %}{% if add_generation_prompt %}{{ bos_token }}assistant\n{% endif %}")
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
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import (AutoModelForCausalLM, LlamaConfig, MistralConfig, PreTrainedTokenizerFast,
                              Qwen2Config, Qwen3Config)

    # A byte-level BPE over this repository's prose (any text does): ids 0-2 are <unk>, <s>, </s>.
    here = os.path.dirname(os.path.abspath(__file__))
    texts = []
    for root in (os.path.join(here, "..", "..", "docs"), here):
        for name in sorted(os.listdir(root)):
            if name.endswith((".md", ".py")):
                with open(os.path.join(root, name), encoding="utf-8") as f:
                    texts.append(f.read())
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    vocab = len(fast)
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
    if variant == "llama3":
        cfg = LlamaConfig(**common, tie_word_embeddings=True,
                          rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 16})
    elif variant == "qwen2":
        cfg = Qwen2Config(**common, tie_word_embeddings=False)
    elif variant == "qwen3":
        cfg = Qwen3Config(**common, head_dim=16, tie_word_embeddings=False)
    elif variant == "mistral":
        cfg = MistralConfig(**common, sliding_window=8, tie_word_embeddings=False)
    else:
        fail(f"unknown variant {variant}")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            # Larger weights than the default init: sharper distributions, fewer near-ties.
            p.add_(0.1 * torch.randn_like(p)) if p.dim() == 1 else p.mul_(3.0)
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


def trainrun_generate(model_dir, prompts, max_new, extra=()):
    pf = os.path.join(WORK, "prompts.jsonl")
    with open(pf, "w", encoding="utf-8") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p}) + "\n")
    cmd = [TRAINRUN, "generate", "--model", model_dir, "--prompts-file", pf, "--max-new-tokens", str(max_new),
           "--jsonl", "--threads", "1", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(r.stderr)
    if r.returncode != 0:
        print(r.stdout)
        fail(f"trainrun generate exited {r.returncode}: {' '.join(cmd)}")
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    if len(rows) != len(prompts):
        fail(f"trainrun generate printed {len(rows)} results for {len(prompts)} prompts")
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


def kv_logits(model_dir, ids):
    from safetensors.torch import load_file, save_file

    ids_path = os.path.join(WORK, "kv-ids.safetensors")
    save_file({"input_ids": ids}, ids_path)
    outs = []
    for extra in ([], ["--kv-cache"]):
        out = os.path.join(WORK, f"kv-logits{len(outs)}.safetensors")
        r = subprocess.run([LOGITS_EXE, model_dir, ids_path, out, *extra], capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            fail(f"llama_logits {' '.join(extra)} exited {r.returncode}")
        outs.append(load_file(out)["logits"])
    d = rel(outs[1], outs[0])
    print(f"KV-cache logits vs full forward, ids {list(ids.shape)}: max relative difference {d:.2e} "
          f"(max abs {(outs[1] - outs[0]).abs().max().item():.2e})")
    if d > 1e-5:
        fail(f"KV-cache logits differ from the full forward by {d:.2e} (tolerance 1e-5)")


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
    # A second EOS id: the token transformers emits at step 6 of the first plain prompt.
    stop = refs[False][0][1][5]
    gc_path = os.path.join(model_dir, "generation_config.json")
    with open(gc_path) as f:
        gc = json.load(f)
    gc["eos_token_id"] = [2, stop]
    with open(gc_path, "w") as f:
        json.dump(gc, f)
    model = hf_model(model_dir)
    ref, _ = reference(model, tok, TINY_PROMPTS, False, max_new)
    if not ref[0][1] or ref[0][1][-1] != stop or len(ref[0][1]) > 6:
        fail(f"transformers did not stop at EOS {stop}: {ref[0][1]}")
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
    compare("SmolLM2-135M-Instruct greedy, fp32", ours, ref)
    chat_prompts = ["What is 2 + 2?", "Name a fruit that is yellow."]
    compare("SmolLM2-135M-Instruct greedy --chat", trainrun_generate(model_dir, chat_prompts, max_new, ["--chat"]),
            reference(model, tok, chat_prompts, True, max_new)[0])
    new = sum(len(r["ids"]) for r in ours)
    # trainrun's time from its own per-prompt rates (prefill + decode), without model loading.
    ours_s = sum(len(r["prompt_ids"]) / r["prefill_tokens_per_s"] +
                 ((len(r["ids"]) - 1) / r["decode_tokens_per_s"] if r["decode_tokens_per_s"] else 0) for r in ours)
    print(f"tokens/s (1 thread, {new} new tokens over 8 prompts, prefill included): trainrun {new / ours_s:.1f}, "
          f"transformers generate {new / hf_s:.1f} (ratio {hf_s / ours_s:.2f}x); trainrun process wall "
          f"{wall:.1f} s incl. loading")


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    if MODE == "tiny":
        tiny(sys.argv[5])
    elif MODE == "smollm2":
        smollm2(sys.argv[5], sys.argv[6])
    else:
        fail(f"unknown mode {MODE}")
    print("PASS")


if __name__ == "__main__":
    main()
