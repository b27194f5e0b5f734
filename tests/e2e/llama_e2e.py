"""The llama plugin against transformers and PEFT (issues 21 and 46), on tiny random models that
transformers builds and saves here (save_pretrained), one variant per run: the families of
tiny_models.py (llama3, qwen2, qwen3, mistral, gemma2, gemma3, phi3, phi3long), GQA (4 query / 2
key-value heads), 16-token sequences.

Modes:
  logits   (a) trainrun's logits (tests/tools/llama_logits.cpp) equal transformers' (eager attention)
           within 1e-5 relative, fp32.
  long     the same on 300-token sequences: past the 128-query blocks in which the plugin
           computes causal attention without SDPA (LibTorch < 2.1) and without gradient, so a
           block's keys, its mask slice and the last, shorter block are all checked.
  longtrain  (b) on 2 sequences of 300 tokens: past the 64-query blocks of the training path
           without SDPA (LibTorch < 2.1: query heads grouped by key/value head, scale folded
           into q, only the diagonal square masked when the mask is causal alone, mistral's
           sliding window masking whole blocks), whose attention has a backward of its own, and
           the loss's and RMSNorm's own backwards; the trained weights give the reference's
           logits (1e-4).
  train    (b) 10 AdamW steps through `trainrun` on a uint32 token file: per-step losses within
           1e-4 relative of a transformers + torch.optim.AdamW loop on the same batches;
           (c) <run_dir>/hf/ loads in AutoModelForCausalLM.from_pretrained with no missing or
           unexpected keys and gives trainrun's logits (1e-5); save_dtype/max_shard_size write
           bf16 shards + index that load too.
  lora     (d) a LoRA run's adapter loads in peft.PeftModel.from_pretrained with the stated
           adapter_config keys and gives trainrun's logits within 1e-5; (e) `trainrun merge-lora`
           on the HF base gives an HF directory whose logits equal the adapter model's; onto a
           base it was not trained on (other shapes, fewer layers, same shapes but another
           model_type) it exits 2 naming the tensor or key and writes nothing.
  shardload  loading by shard (ABI 1.7 DeferredWeights): at 2 ranks under fsdp and zero stage 3
           each rank reads only its shard's bytes from model.safetensors (the two ranks' reads add
           up to the file's tensor bytes, neither reads more than half plus one tensor's
           alignment; with LoRA, whose frozen tensors outside the decoder layers stay whole, each
           reads part), and the losses of 4 AdamW steps, with and without LoRA, are identical to
           the read-whole path (forced by [trainer] init_weights = the same file).
  export   `trainrun export` on a sharded checkpoint (fsdp, 2 ranks) of a full fine-tuning run:
           the HF directory loads in from_pretrained with no missing or unexpected keys, gives
           trainrun's logits on it (1e-5) and equals the run's own <run_dir>/hf/ (same step);
           --dtype bfloat16 with a small --max-shard-size writes bf16 shards + index that load
           too; tokenizer files are copied; an existing --output and a LoRA checkpoint are errors
           (exit 2, nothing written).
  bad      bad input, each exit 2 with a message naming the fault and no <run_dir>/hf/: no
           config.json, an unsupported model_type, a shard listed in the index but missing, a
           truncated safetensors file, a tensor of the wrong shape, a LoRA target matching nothing.

"Relative" is max|x - ref| / max|ref| over the whole tensor.

  strategies  (MoE) single, ddp, fsdp, zero 3 at 2 ranks, accumulation off and on: without the
           router's load-balancing loss all equal (1e-5); with it each rank's micro-batch has its
           own (as transformers under DDP), so the sharded strategies equal ddp.
  ep       (MoE) expert parallelism ([parallel] ep), router loss off, 10 AdamW steps: ep 2 under
           ddp (accumulation off and on) and fsdp at 2 ranks, ep 4 under ddp and ep 2 under fsdp
           at 4 ranks (experts replicated twice) reproduce the single process (losses 1e-5, gradient
           norms 1e-4; the gathered <run_dir>/hf/ weights 1e-3, where plain ddp's are already
           ~2e-4 away after 10 AdamW steps at lr 1e-2); ep 4's checkpoint loads at ep 2 and at world 1
           bitwise (model.safetensors), and a run stopped at step 5 at ep 4 resumed at ep 2 and at
           world 1 matches the uninterrupted one (1e-5); each rank's measured expert bytes at ep 2
           are half those at ep 1 and equal `trainrun check`'s estimate; bad ep degrees exit 2.
  epvariants  (MoE) expert parallelism beside the rest of a job, ep 2 against ep 1 (ddp, 2 ranks,
           6 steps, losses 1e-5 unless said): LoRA on attention and on the experts (the adapter
           files hold the same tensors, 1e-3; ep 2's loads in PEFT with trainrun's logits, 1e-5), QLoRA with 4-bit experts (nf4 + LoRA on every
           projection), LoRA over int8 experts (quant-int8, whose int8 weights no communicator
           carries: gathered as bytes), bf16-mixed (2e-3: bf16 products of other batch compositions), activation
           checkpointing (against ep 2 without it: identical losses).
  family   (issue 46's families) the modes FAMILY lists for the variant, in one process.

usage: llama_e2e.py TRAINRUN LLAMA_LOGITS WORK MODE VARIANT
"""
import json
import os
import shutil
import subprocess
import sys

import torch
from tiny_models import lora_targets, perturb

LLAMA_LIKE = ("llama3", "qwen2", "qwen3", "mistral")  # config.json written in full by trainrun
TRAINRUN, LOGITS_EXE, WORK, MODE, VARIANT = sys.argv[1:6]
T, B = (300, 2) if MODE == "longtrain" else (16, 4)  # sequence length, sequences per batch
torch.set_num_threads(1)


def fail(msg):
    print("FAIL:", msg, flush=True)
    sys.exit(1)


def rel(x, ref):
    return ((x.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def make_model(variant, out, **changes):
    from transformers import AutoModelForCausalLM
    from tiny_models import config

    common = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
    common.update(changes)
    cfg = config(variant, **common)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    perturb(model)
    model.save_pretrained(out)
    return model


def hf_model(path, adapter=None):
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager",
                                                       output_loading_info=True, dtype=torch.float32)
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        if info.get(k):
            fail(f"{path}: from_pretrained reports {k} {info[k]}")
    if adapter:
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, adapter)
    return model.eval()


def ids_file(path, seed=1, length=T):
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 96, (3, length), generator=g)
    save_file({"input_ids": ids}, path)
    return ids


def trainrun_logits(model_dir, ids_path, adapter=None):
    from safetensors.torch import load_file

    out = os.path.join(WORK, "logits-%d.safetensors" % len(os.listdir(WORK)))
    cmd = [LOGITS_EXE, model_dir, ids_path, out] + ([adapter] if adapter else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    print(r.stdout + r.stderr, end="")
    if r.returncode != 0:
        fail(f"llama_logits exited {r.returncode}")
    return load_file(out)["logits"]


def compare_logits(model_dir, what, adapter=None, ref_model=None, tol=1e-5, length=T):
    ids_path = os.path.join(WORK, "ids.safetensors")
    ids = ids_file(ids_path, length=length)
    ours = trainrun_logits(model_dir, ids_path, adapter)
    model = ref_model or hf_model(model_dir, adapter)
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    r = rel(ours, ref)
    print(f"{VARIANT} {what}: logits {tuple(ref.shape)}, max relative difference {r:.2e} (tolerance {tol:g})")
    if not r <= tol:
        fail(f"{what}: trainrun's logits differ from the reference by {r:.2e} > {tol:g}")
    return ours


def token_file(path):
    """B training windows of T+1 tokens (one optimizer step sees all of them), then T+1 held-out
    tokens; raw little-endian uint32 (the text dataset's format = "uint32")."""
    g = torch.Generator().manual_seed(2)
    n_train = T + B
    toks = torch.randint(3, 96, (n_train + T + 1,), generator=g)
    toks.to(torch.int32).numpy().astype("<u4").tofile(path)
    frac = (T + 1.5) / toks.numel()  # the dataset holds out int(n * frac) = T + 1 tokens
    return toks[:n_train], frac


def job(path, model_dir, tokens, frac, run_dir, steps, lr, extra=""):
    with open(path, "w") as f:
        f.write(f"""[trainer]
max_steps = {steps}
global_batch_size = {B}
seed = 3
log_every = 1
run_dir = "{run_dir}"

[model]
plugin = "llama"
path = "{model_dir}"

[data]
plugin = "text"
format = "uint32"
vocab_size = 96
block_size = {T}
eval_fraction = {frac!r}
paths = ["{tokens}"]

[optimizer]
plugin = "adamw"
lr = {lr}
weight_decay = 0.1

[accelerator]
plugin = "cpu"
threads = 1
{extra}""")


def run_trainrun(args, expect_rc=0):
    r = subprocess.run([TRAINRUN] + args, capture_output=True, text=True)
    print(r.stdout + r.stderr, end="")
    if r.returncode != expect_rc:
        fail(f"trainrun {' '.join(args)} exited {r.returncode}, expected {expect_rc}")
    return r.stdout + r.stderr


def losses(run_dir):
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    return [r["loss"] for r in rows if "loss" in r and "eval_loss" not in r]


def reference_losses(model_dir, train_tokens, steps, lr):
    model = hf_model(model_dir).train()
    windows = torch.stack([train_tokens[i:i + T + 1] for i in range(B)])
    x, y = windows[:, :T], windows[:, 1:]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.999), eps=1e-8)
    out = []
    for _ in range(steps):
        res = model(input_ids=x)
        logits = res.logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))
        if getattr(model.config, "output_router_logits", False):  # MoE: as *ForCausalLM adds it
            loss = loss + model.config.router_aux_loss_coef * res.aux_loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out, model.eval()


# Mode "family": the modes CI runs on one of issue 46's families, in one process on one model.
FAMILY = {"gemma": ["logits"], "gemma2": ["logits", "train"], "gemma3": ["logits", "train", "lora"],
          "phi3": ["logits", "lora"], "phi3long": ["logits", "train", "bad"], "mixtral": ["logits", "train", "bad"],
          "qwen3moe": ["logits", "train", "lora", "strategies"]}


def main():
    global WORK, MODE
    root = WORK
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    base = os.path.join(root, "base")
    make_model(VARIANT, base, **({"max_position_embeddings": 512} if MODE in ("long", "longtrain") else {}))
    modes = FAMILY[VARIANT] if MODE == "family" else [MODE]
    for mode in modes:
        MODE = mode
        if len(modes) > 1:
            WORK = os.path.join(root, mode)
            os.makedirs(WORK)
            print(f"--- {VARIANT}: mode {mode}")
        run_mode(base)
    print("OK")


def run_mode(base):
    if MODE == "logits":
        ours = compare_logits(base, "transformers")
        visible_features(base, ours)
        legacy_spelling(base, ours)
    elif MODE == "long":
        compare_logits(base, "transformers, 300 tokens", length=300)
    elif MODE in ("train", "longtrain"):
        tokens = os.path.join(WORK, "tokens.u32")
        train, frac = token_file(tokens)
        run_dir = os.path.join(WORK, "run")
        job(os.path.join(WORK, "job.toml"), base, tokens, frac, run_dir, 10, 1e-2)
        run_trainrun(["--config", os.path.join(WORK, "job.toml")])
        ours = losses(run_dir)
        ref, trained = reference_losses(base, train, 10, 1e-2)
        worst = max(abs(a - b) / abs(b) for a, b in zip(ours, ref))
        print(f"{VARIANT} train: trainrun {['%.6f' % l for l in ours]}\n{VARIANT} train: torch    "
              f"{['%.6f' % l for l in ref]}\n{VARIANT} train: worst relative difference {worst:.2e} (tolerance 1e-4)")
        if len(ours) != 10 or not worst <= 1e-4:
            fail(f"losses differ: worst {worst:.2e}")
        if not ref[-1] < ref[0] * 0.9:
            fail("the reference did not train")
        if getattr(trained.config, "output_router_logits", False):
            # The router's load-balancing loss must show in step 1's loss, or agreeing would not
            # prove it is added.
            windows = torch.stack([train[i:i + T + 1] for i in range(B)])
            with torch.no_grad():
                logits = hf_model(base)(input_ids=windows[:, :T]).logits
            ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), windows[:, 1:].reshape(-1)).item()
            print(f"{VARIANT} train: step 1 loss {ours[0]:.6f}, of which cross-entropy {ce:.6f}")
            if not (ours[0] - ce) / ce > 1e-3:
                fail("the router's load-balancing loss does not show in the loss")
        hf_dir = os.path.join(run_dir, "hf")
        for f in ("config.json", "generation_config.json", "model.safetensors"):
            if not os.path.isfile(os.path.join(hf_dir, f)):
                fail(f"{hf_dir} has no {f}")
        cfg = json.load(open(os.path.join(hf_dir, "config.json")))
        for k in ("torch_dtype", "dtype") + (("rope_theta", "rope_parameters") if VARIANT in LLAMA_LIKE else ()):
            if k not in cfg:
                fail(f"{hf_dir}/config.json lacks {k}")
        compare_logits(hf_dir, "<run_dir>/hf/ in from_pretrained")
        # The trained weights, not only a loadable file: the reference after the same 10 steps.
        compare_logits(hf_dir, "<run_dir>/hf/ vs the reference's trained model", ref_model=trained, tol=1e-4)
        if MODE == "longtrain":
            return
        # bf16 shards with an index.
        run2 = os.path.join(WORK, "run-bf16")
        job(os.path.join(WORK, "job2.toml"), base, tokens, frac, run2, 1, 1e-2)
        run_trainrun(["--config", os.path.join(WORK, "job2.toml"), "--set", "model.save_dtype=bfloat16",
                      "--set", "model.max_shard_size=20KB"])
        idx = json.load(open(os.path.join(run2, "hf", "model.safetensors.index.json")))
        shards = sorted(set(idx["weight_map"].values()))
        print(f"{VARIANT} bf16 save: {len(shards)} shards {shards}")
        if len(shards) < 2:
            fail("max_shard_size 20KB wrote a single shard")
        from safetensors import safe_open
        with safe_open(os.path.join(run2, "hf", shards[0]), "pt") as f:
            if f.metadata().get("format") != "pt":
                fail("shard metadata lacks format = pt")
            if f.get_tensor(next(iter(f.keys()))).dtype != torch.bfloat16:
                fail("save_dtype bfloat16 wrote another dtype")
        hf_model(os.path.join(run2, "hf"))
    elif MODE == "lora":
        tokens = os.path.join(WORK, "tokens.u32")
        train, frac = token_file(tokens)
        run_dir = os.path.join(WORK, "run")
        job(os.path.join(WORK, "job.toml"), base, tokens, frac, run_dir, 5, 5e-2,
            '\n[[callbacks]]\nplugin = "lora"\nr = 4\nlora_alpha = 8.0\n'
            f'target_modules = {json.dumps(lora_targets(VARIANT))}\n')
        out = run_trainrun(["--config", os.path.join(WORK, "job.toml")])
        if "hf/ not written" not in out:
            fail("a LoRA run should not write <run_dir>/hf/ (the adapter holds the result)")
        adapter = os.path.join(run_dir, "adapter")
        # The frozen head's fused projection + loss (a reused logits buffer overwritten by its
        # gradient) trains exactly as the projection through autograd then the loss does.
        run_plain = os.path.join(WORK, "run-plain")
        run_trainrun(["--config", os.path.join(WORK, "job.toml"), "--set", f"trainer.run_dir={run_plain}",
                      "--set", "model.fused_head_loss=false"])
        fused, plain = losses(run_dir), losses(run_plain)
        worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(fused, plain))
        print(f"lora: fused head loss {fused}\nlora: plain head loss {plain} (worst {worst:.1e})")
        if len(fused) != 5 or len(plain) != 5 or worst > 1e-6:
            fail(f"fused_head_loss changed the LoRA run's losses: worst relative difference {worst:.2e}")
        from safetensors.torch import load_file
        a_fused = load_file(os.path.join(adapter, "adapter_model.safetensors"))
        a_plain = load_file(os.path.join(run_plain, "adapter", "adapter_model.safetensors"))
        for k, v in a_plain.items():
            if not torch.allclose(a_fused[k], v, rtol=1e-5, atol=1e-7):
                fail(f"fused_head_loss changed the trained adapter: {k} differs by {(a_fused[k] - v).abs().max().item():.2e}")
        acfg = json.load(open(os.path.join(adapter, "adapter_config.json")))
        want = {"peft_type": "LORA", "r": 4, "lora_alpha": 8.0, "task_type": "CAUSAL_LM", "bias": "none",
                "use_rslora": False, "base_model_name_or_path": os.path.abspath(base)}
        for k, v in want.items():
            if acfg.get(k) != v:
                fail(f"adapter_config.json: {k} = {acfg.get(k)!r}, expected {v!r}")
        from safetensors import safe_open
        with safe_open(os.path.join(adapter, "adapter_model.safetensors"), "pt") as f:
            name = f"base_model.model.model.layers.0.self_attn.{lora_targets(VARIANT)[0]}.lora_A.weight"
            if name not in f.keys():
                fail(f"adapter has no {name}: {sorted(f.keys())[:4]}")
            if f.get_tensor(name.replace("lora_A", "lora_B")).abs().max() == 0:
                fail("lora_B is still zero after training")
        peft_logits = compare_logits(base, "PEFT adapter", adapter=adapter)
        merged = os.path.join(WORK, "merged")
        run_trainrun(["merge-lora", "--base", base, "--adapter", adapter, "--output", merged])
        model = hf_model(merged)
        ids = ids_file(os.path.join(WORK, "ids.safetensors"))
        with torch.no_grad():
            m = model(input_ids=ids).logits
        r = rel(m, peft_logits)
        print(f"{VARIANT} merged: max relative difference to the adapter model {r:.2e} (tolerance 1e-5)")
        if not r <= 1e-5:
            fail(f"merged model differs from the adapter model by {r:.2e}")
        if lora_targets(VARIANT) == lora_targets("llama3"):
            mismatched_bases(adapter, base)
    elif MODE == "qlora":
        # QLoRA on the llama (nf4 base with double quantization + LoRA on all-linear) at 2 ranks:
        # fsdp (the packed base sharded per decoder layer) and ddp give the same losses.
        tokens = os.path.join(WORK, "tokens.u32")
        _, frac = token_file(tokens)
        runs = {}
        for strategy in ("fsdp", "ddp"):
            run_dir = os.path.join(WORK, strategy)
            job(os.path.join(WORK, strategy + ".toml"), base, tokens, frac, run_dir, 6, 2e-2,
                '\n[precision]\nplugin = "quant-nf4"\ntarget_modules = ["all-linear"]\nblocksize = 16\n'
                'double_quant = true\n\n[[callbacks]]\nplugin = "lora"\nr = 4\nlora_alpha = 8.0\n'
                'target_modules = ["all-linear"]\n')
            out = run_trainrun(["--config", os.path.join(WORK, strategy + ".toml"), "--set", f"strategy.plugin={strategy}",
                                "--set", "launch.nproc_per_node=2", "--set", "accelerator.plugin=gloo-cpu"])
            n = 2 * len(lora_targets(VARIANT))  # every projection of the 2 layers
            if f"quant-nf4: {n} Linear layer(s) quantized" not in out:
                fail(f"expected the {n} decoder projections quantized (lm_head is tied or skipped)")
            runs[strategy] = losses(run_dir)
            if not os.path.isfile(os.path.join(run_dir, "adapter", "adapter_model.safetensors")):
                fail(f"{strategy}: no adapter written")
        a, b = runs["fsdp"], runs["ddp"]
        worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
        print(f"{VARIANT} qlora: fsdp {['%.6f' % l for l in a]}\n{VARIANT} qlora: ddp  {['%.6f' % l for l in b]}\n"
              f"{VARIANT} qlora: worst relative difference {worst:.2e} (tolerance 1e-5)")
        if len(a) != 6 or len(b) != 6 or not worst <= 1e-5:
            fail("QLoRA under fsdp and ddp disagree")
        if not a[-1] < a[0]:
            fail("QLoRA did not lower the loss")
    elif MODE == "strategies":
        strategies(base)
    elif MODE == "ep":
        expert_parallel(base)
    elif MODE == "epvariants":
        expert_parallel_variants(base)
    elif MODE == "export":
        export(base)
    elif MODE == "shardload":
        shardload(base)
    elif MODE == "bad":
        bad(base)
    else:
        fail(f"unknown mode {MODE}")


# Each family's own features must show in these tiny models' logits, or agreeing within 1e-5
# would not prove they are computed: transformers' logits with the feature changed (config keys
# passed to from_pretrained) must differ from trainrun's by more than 1e-3 relative.
FEATURES = {
    "gemma2": {"attention soft-capping": dict(attn_logit_softcapping=None),
               "final soft-capping": dict(final_logit_softcapping=None),
               "sliding window": dict(sliding_window=64),
               "query_pre_attn_scalar": dict(query_pre_attn_scalar=16)},
    "gemma3": {"sliding window": dict(sliding_window=64),
               "RoPE per layer type": dict(rope_parameters={
                   "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                   "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})},
    "phi3": {"sliding window": dict(sliding_window=None)},
    "phi3long": {"longrope's long factors": dict(original_max_position_embeddings=32)},
    "mixtral": {"top-2 routing": dict(num_experts_per_tok=1)},
    "qwen3moe": {"unnormalised top-k weights": dict(norm_topk_prob=True)},
}


def visible_features(base, ours):
    from transformers import AutoModelForCausalLM

    ids = ids_file(os.path.join(WORK, "ids.safetensors"))
    for name, change in FEATURES.get(VARIANT, {}).items():
        model = AutoModelForCausalLM.from_pretrained(base, attn_implementation="eager", dtype=torch.float32,
                                                     **change).eval()
        with torch.no_grad():
            r = rel(ours, model(input_ids=ids).logits)
        print(f"{VARIANT}: without {name} transformers' logits move {r:.2e} from trainrun's")
        if not r > 1e-3:
            fail(f"{name} does not show in the tiny model's logits ({r:.2e}): the check would prove nothing")


# config.json as transformers 4.x wrote these families (the files of most checkpoints on the Hub):
# RoPE at the top level and in rope_scaling, Gemma 3's rope_local_base_freq and
# sliding_window_pattern, no layer_types.
def legacy_config(c):
    rp = c["rope_parameters"]
    c = {k: v for k, v in c.items() if k not in ("rope_parameters", "layer_types")}
    if VARIANT == "gemma3":
        c.update(rope_theta=rp["full_attention"]["rope_theta"], rope_local_base_freq=rp["sliding_attention"]["rope_theta"],
                 rope_scaling={"rope_type": "linear", "factor": rp["full_attention"]["factor"]}, sliding_window_pattern=2)
    elif VARIANT == "gemma2":
        c.update(rope_theta=rp["rope_theta"])
    elif VARIANT == "phi3long":
        c.update(rope_theta=rp["rope_theta"], partial_rotary_factor=rp["partial_rotary_factor"],
                 rope_scaling={"type": "longrope", "short_factor": rp["short_factor"], "long_factor": rp["long_factor"]})
    return c


def legacy_spelling(base, ours):
    if VARIANT not in ("gemma2", "gemma3", "phi3long"):
        return
    legacy = os.path.join(WORK, "legacy")
    shutil.copytree(base, legacy)
    path = os.path.join(legacy, "config.json")
    json.dump(legacy_config(json.load(open(path))), open(path, "w"), indent=2)
    r = rel(compare_logits(legacy, "transformers 4.x spelling of config.json"), ours)
    if r != 0:
        fail(f"the 4.x spelling gives other logits than the 5.x one ({r:.2e})")


def strategies(base):
    """MoE under the data-parallel strategies at 2 ranks, 6 AdamW steps: without the router's
    load-balancing loss ddp (with accumulation), fsdp and zero 3 reproduce the single process
    (1e-5); with it the loss is each rank's micro-batch's, as transformers' under DDP, so the
    sharded strategies reproduce ddp (1e-5) and differ from the single process (whose
    micro-batch is all 4 rows)."""
    tokens = os.path.join(WORK, "tokens.u32")
    _, frac = token_file(tokens)
    cases = [("single", "single", 1, []), ("ddp-accum", "ddp", 2, ["--set", "trainer.micro_batch_size=1"]),
             ("fsdp", "fsdp", 2, []), ("zero3", "zero", 2, ["--set", "strategy.stage=3"]),
             ("ddp", "ddp", 2, [])]
    runs = {}
    # Router loss off: every strategy; on: one process, ddp and the sharded strategies (not with
    # accumulation, whose micro-batches of 1 row have another loss by definition).
    for aux in ("off", "on"):
        for name, strategy, n, extra in cases:
            if (aux == "off" and name == "ddp") or (aux == "on" and name.endswith("accum")):
                continue
            run_dir = os.path.join(WORK, f"{name}-{aux}")
            job(os.path.join(WORK, f"{name}-{aux}.toml"), base, tokens, frac, run_dir, 6, 1e-2)
            run_trainrun(["--config", os.path.join(WORK, f"{name}-{aux}.toml"), "--set", f"strategy.plugin={strategy}",
                          "--set", f"launch.nproc_per_node={n}", "--set", "accelerator.plugin=gloo-cpu",
                          "--set", f"model.router_aux_loss={aux}", *extra])
            runs[name, aux] = losses(run_dir)
            print(f"{VARIANT} {name:10s} router loss {aux}: {['%.6f' % l for l in runs[name, aux]]}")

    def worst(a, b):
        return max(abs(x - y) / abs(y) for x, y in zip(a, b))

    for name in ("ddp-accum", "fsdp", "zero3"):
        w = worst(runs[name, "off"], runs["single", "off"])
        print(f"{VARIANT} {name} vs single, router loss off: worst relative difference {w:.2e} (tolerance 1e-5)")
        if len(runs[name, "off"]) != 6 or not w <= 1e-5:
            fail(f"{name} does not reproduce the single process")
    for name in ("fsdp", "zero3"):
        w = worst(runs[name, "on"], runs["ddp", "on"])
        print(f"{VARIANT} {name} vs ddp, router loss on: worst relative difference {w:.2e} (tolerance 1e-5)")
        if not w <= 1e-5:
            fail(f"{name} does not reproduce ddp with the router's loss")
    if not worst(runs["ddp", "on"], runs["single", "on"]) > 1e-5:
        fail("with the router's loss ddp should differ from the single process (per-rank micro-batches)")


def safetensors_tensors(path):
    from safetensors.torch import load_file
    out = {}
    for f in sorted(os.listdir(path)) if os.path.isdir(path) else [path]:
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, f) if os.path.isdir(path) else f))
    return out


def expert_parallel(base):
    """[parallel] ep against the single process, checkpoints across ep degrees, expert memory."""
    tokens = os.path.join(WORK, "tokens.u32")
    _, frac = token_file(tokens)
    ckpt = ["--set", 'callbacks=[{plugin="checkpoint", every_n_steps=5}]']

    def run(name, strategy, n, ep, *extra, rc=0, steps=10):
        run_dir = os.path.join(WORK, name)
        job(os.path.join(WORK, f"{name}.toml"), base, tokens, frac, run_dir, steps, 1e-2)
        out = run_trainrun(["--config", os.path.join(WORK, f"{name}.toml"), "--set", f"strategy.plugin={strategy}",
                            "--set", f"launch.nproc_per_node={n}", "--set", "accelerator.plugin=" + ("cpu" if n == 1 else "gloo-cpu"),
                            "--set", "model.router_aux_loss=off", "--set", f"parallel.ep={ep}", *extra], expect_rc=rc)
        return run_dir, out

    def worst(a, b):
        return max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(a, b))

    def worst_weights(a, b):
        wa, wb = safetensors_tensors(os.path.join(a, "hf")), safetensors_tensors(os.path.join(b, "hf"))
        if set(wa) != set(wb):
            fail(f"{a}/hf and {b}/hf hold other tensors: {sorted(set(wa) ^ set(wb))[:6]}")
        return max(((wa[k] - wb[k]).abs().max() / wb[k].abs().max().clamp_min(1e-30)).item() for k in wa)

    def grad_norms(run_dir):
        return [json.loads(l)["grad_norm"] for l in open(os.path.join(run_dir, "metrics.jsonl")) if '"grad_norm"' in l]

    single, _ = run("single", "single", 1, 1)
    ref = losses(single)
    # The data-parallel baseline: plain ddp's final weights are this far from the single
    # process's already (AdamW at lr 1e-2 magnifies float rounding in near-zero gradients).
    ddp1, _ = run("ddp-ep1", "ddp", 2, 1)
    base_w = worst_weights(ddp1, single)
    print(f"{VARIANT} ddp-ep1 (baseline) vs single: losses {worst(losses(ddp1), ref):.2e}, "
          f"grad norms {worst(grad_norms(ddp1), grad_norms(single)):.2e}, final weights {base_w:.2e}")
    cases = [("ddp-ep2", "ddp", 2, 2, []), ("ddp-ep2-accum", "ddp", 2, 2, ["--set", "trainer.micro_batch_size=1"]),
             ("fsdp-ep2", "fsdp", 2, 2, []), ("ddp-ep4", "ddp", 4, 4, ckpt), ("fsdp-ep2-w4", "fsdp", 4, 2, [])]
    for name, strategy, n, ep, extra in cases:
        run_dir, out = run(name, strategy, n, ep, *extra)
        if f"{4 // ep} of 4 experts per MoE layer on each rank" not in out:
            fail(f"{name}: no expert-parallel line in the log")
        got = losses(run_dir)
        w, wg, ww = worst(got, ref), worst(grad_norms(run_dir), grad_norms(single)), worst_weights(run_dir, single)
        print(f"{VARIANT} {name:14s} vs single: losses {w:.2e} (tolerance 1e-5), grad norms {wg:.2e} (1e-4), "
              f"final weights {ww:.2e} (tolerance 1e-3; ddp baseline {base_w:.2e})")
        if len(got) != 10 or not w <= 1e-5 or not wg <= 1e-4 or not ww <= 1e-3:
            fail(f"{name} does not reproduce the single process")

    # Checkpoints: ep 4's step-10 checkpoint loads at ep 2 and at world 1, training nothing: the
    # full state dict is the writer's bit for bit.
    writer = os.path.join(WORK, "ddp-ep4")
    step10 = os.path.join(writer, "checkpoints", "step-0000010")
    for name, strategy, n, ep in (("load-ep2", "fsdp", 2, 2), ("load-w1", "single", 1, 1)):
        run_dir, out = run(name, strategy, n, ep, "--set", f"trainer.resume={step10}")
        if "resumed from" not in out:
            fail(f"{name}: did not resume")
        a, b = safetensors_tensors(os.path.join(writer, "model.safetensors")), safetensors_tensors(os.path.join(run_dir, "model.safetensors"))
        if set(a) != set(b) or any(not torch.equal(a[k], b[k]) for k in a):
            fail(f"{name}: model.safetensors differs from the ep 4 writer's")
        print(f"{VARIANT} ep 4 checkpoint -> {name}: {len(a)} tensors bitwise equal")
    # Stopped at step 5 at ep 4, resumed at ep 2 and at world 1: the optimizer state of the
    # experts travels too.
    run("first-ep4", "ddp", 4, 4, *ckpt, "--set", "trainer.stop_after_steps=5")
    step5 = os.path.join(WORK, "first-ep4", "checkpoints", "step-0000005")
    for name, strategy, n, ep in (("resume-ep2", "ddp", 2, 2), ("resume-w1", "single", 1, 1)):
        run_dir, _ = run(name, strategy, n, ep, "--set", f"trainer.resume={step5}")
        got = losses(run_dir)
        w = worst(got, ref[5:])
        print(f"{VARIANT} ep 4 stopped at 5 -> {name}, steps 6-10: {w:.2e} vs single (tolerance 1e-5)")
        if len(got) != 5 or not w <= 1e-5:
            fail(f"{name}: the resumed steps differ")

    # Memory: each rank's expert parameters, gradients and optimizer state, measured after the
    # first step, at ep 1 and ep 2 (ddp, 2 ranks), beside `trainrun check`'s estimate.
    def expert_bytes(run_dir):
        rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
        return [r["expert_state_bytes"] for r in rows if "expert_state_bytes" in r][0]

    m1, m2 = expert_bytes(ddp1), expert_bytes(os.path.join(WORK, "ddp-ep2"))
    check = run_trainrun(["check", "--config", os.path.join(WORK, "ddp-ep2.toml"), "--set", "strategy.plugin=ddp",
                          "--set", "launch.nproc_per_node=2", "--set", "parallel.ep=2"])
    import re
    est = re.search(r"split over \[parallel\] ep = 2: .* per rank \((\d+) bytes\)", check)
    if est is None:
        fail("trainrun check printed no expert estimate for ep = 2")
    est = int(est.group(1))
    print(f"{VARIANT} expert bytes per rank: ep 1 {m1:.0f}, ep 2 {m2:.0f} (ratio {m1 / m2:.3f}); estimate at ep 2 {est}")
    if m1 != 2 * m2 or abs(est - m2) > 0.01 * m2:
        fail("the experts' bytes per rank at ep 2 are not half of ep 1's, or differ from the estimate")

    # Bad degrees: exit 2 naming the key.
    for ep, n, what in ((3, 2, "does not divide the world size"), (8, 8, "does not divide the model's 4 experts")):
        r = subprocess.run([TRAINRUN, "check", "--config", os.path.join(WORK, "ddp-ep2.toml"),
                            "--set", "strategy.plugin=ddp", "--set", f"launch.nproc_per_node={n}",
                            "--set", f"parallel.ep={ep}", "--set", "trainer.global_batch_size=8"],
                           capture_output=True, text=True)
        if r.returncode != 2 or "[parallel] ep" not in r.stderr or what not in r.stderr:
            fail(f"ep = {ep} at {n} ranks: exit {r.returncode}, {r.stderr[-400:]}")
        print(f"{VARIANT} ep = {ep} at {n} ranks: exit 2: {r.stderr.strip().splitlines()[-1]}")


def expert_parallel_variants(base):
    """[parallel] ep with LoRA (attention and experts), QLoRA, bf16-mixed, activation checkpointing."""
    tokens = os.path.join(WORK, "tokens.u32")
    _, frac = token_file(tokens)
    targets = lora_targets(VARIANT) + (["w1", "w2", "w3"] if VARIANT == "mixtral" else ["gate_proj", "up_proj", "down_proj"])
    lora = ('\n[[callbacks]]\nplugin = "lora"\nr = 4\nlora_alpha = 8.0\n'
            f'target_modules = {json.dumps(targets)}\n')
    qlora = ('\n[precision]\nplugin = "quant-nf4"\ntarget_modules = ["all-linear"]\nblocksize = 16\n'
             'double_quant = true\n' + lora)

    def run(name, ep, extra="", *sets):
        run_dir = os.path.join(WORK, name)
        job(os.path.join(WORK, f"{name}.toml"), base, tokens, frac, run_dir, 6, 1e-2, extra)
        out = run_trainrun(["--config", os.path.join(WORK, f"{name}.toml"), "--set", "strategy.plugin=ddp",
                            "--set", "launch.nproc_per_node=2", "--set", "accelerator.plugin=gloo-cpu",
                            "--set", "model.router_aux_loss=off", "--set", f"parallel.ep={ep}", *sets])
        return run_dir, out

    def worst(a, b):
        return max(abs(x - y) / abs(y) for x, y in zip(a, b))

    int8 = '\n[precision]\nplugin = "quant-int8"\ntarget_modules = ["all-linear"]\n' + lora
    for name, extra, sets, tol in (("lora", lora, [], 1e-5), ("qlora", qlora, [], 1e-5), ("int8", int8, [], 1e-5),
                                   ("bf16", "", ["--set", "precision.plugin=bf16-mixed"], 2e-3)):
        d1, _ = run(f"{name}-ep1", 1, extra, *sets)
        d2, out = run(f"{name}-ep2", 2, extra, *sets)
        w = worst(losses(d2), losses(d1))
        print(f"{VARIANT} {name}: ep 2 vs ep 1, 6 steps: worst loss difference {w:.2e} (tolerance {tol:g})")
        if len(losses(d2)) != 6 or not w <= tol:
            fail(f"{name}: ep 2 does not reproduce ep 1")
        if name == "qlora":
            # The experts this rank holds are 4-bit: under half of what LoRA on float32 experts
            # holds (the same adapters, which are a large share of a tiny model's experts).
            import re
            held = {n: int(re.search(r"\((\d+) bytes of experts on rank 0\)", o).group(1))
                    for n, o in (("qlora", out), ("lora", open(os.path.join(WORK, "lora-ep2", "logs", "rank-0.log")).read()))}
            print(f"{VARIANT} qlora: rank 0 holds {held['qlora']} bytes of experts (LoRA on float32: {held['lora']})")
            if not held["qlora"] < held["lora"] / 2:
                fail("qlora: the experts are not held 4-bit")
        if name in ("lora", "qlora", "int8"):  # int8: the gathered experts travel as bytes
            a = safetensors_tensors(os.path.join(d1, "adapter", "adapter_model.safetensors"))
            b = safetensors_tensors(os.path.join(d2, "adapter", "adapter_model.safetensors"))
            experts = [k for k in a if ".experts." in k]
            if set(a) != set(b) or not experts:
                fail(f"{name}: the adapters differ in names or hold no expert adapter: {sorted(set(a) ^ set(b))[:6]}")
            ww = max(((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-30)).item() for k in a)
            print(f"{VARIANT} {name}: adapter files, {len(a)} tensors ({len(experts)} on experts): worst {ww:.2e} (tolerance 1e-3)")
            if not ww <= 1e-3:
                fail(f"{name}: the ep 2 adapter differs from ep 1's")
            if name == "lora" and VARIANT == "mixtral":
                # PEFT (0.21 on transformers 5, whose MoE layers hold each layer's experts as fused
                # 3-D parameters) converts the per-expert adapters when it loads them. Not the tiny
                # Qwen3-MoE's: its dense layer's MLP shares the experts' names, and PEFT's
                # conversion retargets those names to the experts, leaving that layer's adapters
                # unloaded ("UNEXPECTED").
                compare_logits(base, "ep 2 adapter on attention and experts in PEFT", adapter=os.path.join(d2, "adapter"))
    d2 = os.path.join(WORK, "lora-ep2")
    dc, out = run("ckpt-ep2", 2, lora, "--set", "trainer.activation_checkpointing=true")
    if "activation checkpointing" not in out:
        fail("no activation checkpointing in the banner")
    w = worst(losses(dc), losses(d2))
    print(f"{VARIANT} activation checkpointing at ep 2: {w:.2e} from ep 2 without it (tolerance 0)")
    if w != 0:
        fail("activation checkpointing changes the losses at ep 2")


def mismatched_bases(adapter, base):
    """(e) merge-lora onto a base the adapter was not trained on: exit 2 naming the tensor or the
    config key, and no output written."""
    qwen3 = {}  # make_model gives qwen3 its head_dim itself

    def case(name, variant, changes, expect):
        other = os.path.join(WORK, "base-" + name)
        make_model(variant, other, **changes)
        merged = os.path.join(WORK, "merged-" + name)
        out = run_trainrun(["merge-lora", "--base", other, "--adapter", adapter, "--output", merged], expect_rc=2)
        import re
        if not re.search(expect, out):
            fail(f"merge-lora onto {name}: the error does not match /{expect}/")
        if os.path.exists(merged):
            fail(f"merge-lora onto {name}: {merged} was written")
        print(f"merge-lora onto a base with {name}: exit 2, message matches /{expect}/, nothing written")

    # Adapter tensors are merged in name order: layers.0.mlp.down_proj comes first.
    case("other-shapes", VARIANT, dict(intermediate_size=48, **qwen3),
         r"adapter of 'model\.layers\.0\.mlp\.down_proj': lora_A \[4, 64\], lora_B \[32, 4\] do not fit "
         r"the base weight \[32, 48\]")
    case("fewer-layers", VARIANT, dict(num_hidden_layers=1, **qwen3),
         r"no tensor 'model\.layers\.1\.mlp\.down_proj\.weight' for the adapter of 'model\.layers\.1\.mlp\.down_proj'")
    # Same tensor names and shapes, another architecture: only config.json tells them apart.
    other = "mistral" if VARIANT != "mistral" else "llama3"
    theirs = json.load(open(os.path.join(base, "config.json")))["model_type"]
    case("another-model_type", other, qwen3,
         rf'config\.json key "model_type" is "{"mistral" if other == "mistral" else "llama"}", but the adapter '
         rf'was trained on .*base .*whose model_type is "{theirs}"')


def export(base):
    from safetensors import safe_open

    with open(os.path.join(base, "tokenizer_config.json"), "w") as f:
        f.write('{"model_max_length": 64}\n')
    tokens = os.path.join(WORK, "tokens.u32")
    _, frac = token_file(tokens)
    ckpt = '\n[[callbacks]]\nplugin = "checkpoint"\nevery_n_steps = 0\nsave_last = true\n'
    run_dir = os.path.join(WORK, "run")
    job(os.path.join(WORK, "run.toml"), base, tokens, frac, run_dir, 3, 2e-2,
        '\n[strategy]\nplugin = "fsdp"\n' + ckpt)
    run_trainrun(["--config", os.path.join(WORK, "run.toml"), "--set", "launch.nproc_per_node=2",
                  "--set", "accelerator.plugin=gloo-cpu"])
    checkpoints = os.path.join(run_dir, "checkpoints")
    out = os.path.join(WORK, "exported")
    run_trainrun(["export", checkpoints, "--output", out])
    for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer_config.json"):
        if not os.path.isfile(os.path.join(out, f)):
            fail(f"export wrote no {f}")
    with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
        if f.metadata() != {"format": "pt"}:
            fail(f"export: __metadata__ is {f.metadata()}")
        if any(f.get_tensor(k).dtype != torch.float32 for k in f.keys()):
            fail("export: the weights are not float32 (as trained)")
    with safe_open(os.path.join(run_dir, "hf", "model.safetensors"), "pt") as a, \
            safe_open(os.path.join(out, "model.safetensors"), "pt") as b:
        if sorted(a.keys()) != sorted(b.keys()) or any(not torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys()):
            fail("export: the weights differ from the run's own <run_dir>/hf/ at the same step")
    compare_logits(out, "export")  # from_pretrained (no missing/unexpected keys) vs trainrun
    bf16 = os.path.join(WORK, "exported-bf16")
    run_trainrun(["export", checkpoints, "--output", bf16, "--dtype", "bfloat16", "--max-shard-size", "20KB"])
    index = os.path.join(bf16, "model.safetensors.index.json")
    if not os.path.isfile(index):
        fail("export --max-shard-size 20KB wrote no index")
    shards = sorted(set(json.load(open(index))["weight_map"].values()))
    config = json.load(open(os.path.join(bf16, "config.json")))
    if config.get("torch_dtype") != "bfloat16" and config.get("dtype") != "bfloat16":
        fail(f"export --dtype bfloat16: config.json says {config.get('dtype')}")
    from transformers import AutoModelForCausalLM
    m, info = AutoModelForCausalLM.from_pretrained(bf16, output_loading_info=True)
    if any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")):
        fail(f"bf16 export: from_pretrained reports {info}")
    if next(m.parameters()).dtype != torch.bfloat16:
        fail("bf16 export: from_pretrained did not load bfloat16 weights")
    print(f"{VARIANT} export: bf16 in {len(shards)} shards loads in from_pretrained")
    msg = run_trainrun(["export", checkpoints, "--output", out], expect_rc=2)
    if "exists" not in msg:
        fail("export onto an existing directory: the message does not say so")
    lora_dir = os.path.join(WORK, "lora")
    job(os.path.join(WORK, "lora.toml"), base, tokens, frac, lora_dir, 2, 2e-2,
        ckpt + '\n[[callbacks]]\nplugin = "lora"\nr = 4\nlora_alpha = 8.0\ntarget_modules = ["all-linear"]\n')
    run_trainrun(["--config", os.path.join(WORK, "lora.toml")])
    lora_out = os.path.join(WORK, "exported-lora")
    msg = run_trainrun(["export", os.path.join(lora_dir, "checkpoints"), "--output", lora_out], expect_rc=2)
    if "merge-lora" not in msg or os.path.exists(lora_out):
        fail("export of a LoRA checkpoint: expected exit 2 pointing to merge-lora and nothing written")


def shardload(base):
    import re
    from safetensors import safe_open

    tokens = os.path.join(WORK, "tokens.u32")
    _, frac = token_file(tokens)
    weights = os.path.join(base, "model.safetensors")
    with safe_open(weights, "pt") as f:
        total = sum(f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in f.keys())
        largest = max(f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in f.keys())
    lora = ('\n[[callbacks]]\nplugin = "lora"\nr = 4\nlora_alpha = 8.0\n'
            'target_modules = ["all-linear"]\n')
    cases = [("fsdp", "fsdp", ""), ("zero3", "zero", "\nstage = 3\nparam_persistence_threshold = 0\n"), ("fsdp-lora", "fsdp", lora)]
    for name, strategy, extra in cases:
        runs = {}
        for load in ("shard", "whole"):
            run_dir = os.path.join(WORK, f"{name}-{load}")
            cfg = os.path.join(WORK, f"{name}-{load}.toml")
            strat = f'\n[strategy]\nplugin = "{strategy}"\n' + (extra if strategy == "zero" else "")
            job(cfg, base, tokens, frac, run_dir, 4, 2e-2, strat + (extra if strategy != "zero" else ""))
            args = ["--config", cfg, "--set", "launch.nproc_per_node=2", "--set", "accelerator.plugin=gloo-cpu"]
            if load == "whole":
                args += ["--set", f"trainer.init_weights={weights}"]
            out = run_trainrun(args)
            reads = {int(r): int(b) for r, b in re.findall(r"llama: rank (\d) read (\d+) bytes of weights", out)}
            if sorted(reads) != [0, 1]:
                fail(f"{name} {load}: expected a read report from ranks 0 and 1, got {reads}")
            if load == "shard" and extra == lora:
                # The frozen base is sharded per decoder layer; frozen tensors outside the layers
                # (the tied embedding, the final norm) stay whole on every rank and are read whole.
                print(f"{name}: bytes read per rank {reads} of {total} in the file")
                if not max(reads.values()) < total or not sum(reads.values()) > total:
                    fail(f"{name}: expected each rank to read part of the file, got {reads}")
            elif load == "shard":
                print(f"{name}: bytes read per rank {reads} of {total} in the file")
                if sum(reads.values()) != total:
                    fail(f"{name}: the ranks read {sum(reads.values())} bytes together, the file holds {total}")
                if max(reads.values()) > total / 2 + largest:
                    fail(f"{name}: a rank read {max(reads.values())} bytes, more than half of {total} plus one tensor")
            elif any(b != total for b in reads.values()):
                fail(f"{name} whole: every rank should read all {total} bytes, got {reads}")
            runs[load] = losses(run_dir)
        a, b = runs["shard"], runs["whole"]
        print(f"{name}: losses by shard {a}\n{name}: losses whole    {b}")
        if len(a) != 4 or a != b:
            fail(f"{name}: losses after loading by shard differ from the read-whole path")


def bad(base):
    tokens = os.path.join(WORK, "tokens.u32")
    _, frac = token_file(tokens)

    def case(name, mutate, expect, extra="", model_dir=None):
        d = os.path.join(WORK, "bad-" + name)
        shutil.copytree(base, d)
        mutate(d)
        run_dir = os.path.join(WORK, "run-" + name)
        job(os.path.join(WORK, name + ".toml"), model_dir or d, tokens, frac, run_dir, 2, 1e-2, extra)
        out = run_trainrun(["--config", os.path.join(WORK, name + ".toml")], expect_rc=2)
        import re
        if not re.search(expect, out):
            fail(f"{name}: the error does not match /{expect}/")
        for f in ("hf", "model.safetensors", "adapter"):
            if os.path.exists(os.path.join(run_dir, f)):
                fail(f"{name}: {run_dir}/{f} was written")
        print(f"bad input '{name}': exit 2, message matches /{expect}/")

    def edit_config(d, **kv):
        p = os.path.join(d, "config.json")
        c = json.load(open(p))
        c.update(kv)
        json.dump(c, open(p, "w"))

    def shard(d):
        from transformers import AutoModelForCausalLM
        os.remove(os.path.join(d, "model.safetensors"))
        AutoModelForCausalLM.from_pretrained(base).save_pretrained(d, max_shard_size="20KB")
        idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
        os.remove(os.path.join(d, sorted(set(idx["weight_map"].values()))[-1]))

    def truncate(d):
        p = os.path.join(d, "model.safetensors")
        os.truncate(p, os.path.getsize(p) - 100)

    if VARIANT == "mixtral":
        # Mixture-of-experts keys (issue 46): the checkpoint's experts against config.json's count.
        case("expert-count", lambda d: edit_config(d, num_local_experts=3),
             r"model\.safetensors: tensor 'model\.layers\.0\.block_sparse_moe\.gate\.weight' has shape \[4, 32\], "
             r"config\.json makes it \[3, 32\]")
        case("top-k", lambda d: edit_config(d, num_experts_per_tok=5),
             r"num_experts_per_tok \(5\) must be between 1 and the number of experts \(4\)")
        case("jitter", lambda d: edit_config(d, router_jitter_noise=0.1), r"router_jitter_noise 0\.1 is not supported")
        return
    if VARIANT == "phi3long":
        # The families' own keys (issue 46).
        def factors(d):
            c = json.load(open(os.path.join(d, "config.json")))
            edit_config(d, rope_parameters=dict(c["rope_parameters"], short_factor=[1.0]))
        case("longrope-factors", factors, r"short_factor has 1 entries; the rotated width / 2 is 2")
        case("dropout", lambda d: edit_config(d, resid_pdrop=0.1), r"resid_pdrop 0\.1 is not supported \(only 0\)")
        case("gemma3-multimodal", lambda d: edit_config(d, model_type="gemma3"),
             r'model_type "gemma3" is Gemma 3\'s image-text model.*"gemma3_text"')
        case("activation", lambda d: edit_config(d, hidden_act="relu"),
             r'hidden_act "relu" is not supported .*"silu" \(SwiGLU\), "gelu_pytorch_tanh" \(GeGLU\)')
        case("rope-type", lambda d: edit_config(d, rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0}),
             r'rope_parameters rope_type "dynamic" is not supported \(supported: default, linear, llama3, longrope\)')
        return
    case("no-config", lambda d: os.remove(os.path.join(d, "config.json")), r"has no config\.json")
    case("architecture", lambda d: edit_config(d, model_type="gpt2", architectures=["GPT2LMHeadModel"]),
         r'model_type "gpt2" is not supported.*supported: llama, mistral, qwen2, qwen3')
    case("missing-shard", shard, r"shard 'model-0000\d-of-0000\d\.safetensors' is listed in the index but missing")
    case("truncated", truncate, r"model\.safetensors.*truncated")
    case("shape", lambda d: edit_config(d, intermediate_size=48),
         r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \[64, 32\], config\.json makes it \[48, 32\]")
    case("lora-target", lambda d: None, r"target_modules entry \"qproj\" matches no layer of the model .*; "
         r"its Linear layers are named q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj",
         extra='\n[[callbacks]]\nplugin = "lora"\ntarget_modules = ["qproj"]\n')


main()
