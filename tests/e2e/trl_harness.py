"""What the TRL cross-checks share (preference_vs_trl.py, kto_vs_trl.py, reward_vs_trl.py,
grpo_vs_trl.py): their tiny random model, job files written from dicts, trainrun's metrics read
back, TRL's trainer arguments matching trainrun's AdamW step, trainrun's data order for TRL,
trainrun's initial LoRA A for PEFT."""
import json
import os
import shutil

import torch

# trainrun's adamw defaults, which TRL is given
ADAMW = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}


def make_tiny_model(out, tokenizer_dir, family="llama", eos_boost=0.0):
    """A tiny random Llama (or Qwen3) made by transformers: hidden 32, 2 layers, GQA 4/2, 320 ids
    (chat_data.py's tokenizer, already written to tokenizer_dir and copied beside the weights),
    EOS id 2, every norm weight perturbed so that none is 1. eos_boost > 0 makes EOS likelier
    (grpo_vs_trl.py: some completions end before their maximum length)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    common = dict(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None, eos_token_id=2,
                  pad_token_id=None)
    cfg = LlamaConfig(**common) if family == "llama" else Qwen3Config(head_dim=8, **common)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
        if eos_boost:
            model.lm_head.weight[2].add_(eos_boost * model.model.norm.weight.sign())
    model.save_pretrained(out)
    for name in os.listdir(tokenizer_dir):
        shutil.copy(os.path.join(tokenizer_dir, name), out)


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(v)


def table(name, d, array=False):
    """A TOML table ([name], or [[name]] with array) of the dict d."""
    head = f"[[{name}]]" if array else f"[{name}]"
    return head + "\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in d.items()) + "\n"


def metrics_files(run_dir):
    """{metrics file: {step: training row}} for every metrics*.jsonl of run_dir (one per rank with
    the metrics callback's all_ranks); {} when run_dir does not exist."""
    out = {}
    for name in sorted(os.listdir(run_dir)) if os.path.isdir(run_dir) else []:
        if name.startswith("metrics") and name.endswith(".jsonl"):
            rows = [json.loads(l) for l in open(os.path.join(run_dir, name)) if l.strip()]
            out[name] = {r["step"]: r for r in rows if "loss" in r and "eval_loss" not in r}
    return out


def trl_common_args(out_dir, per_device, lr, steps, seed, max_length, accumulation=1):
    """TRL config keywords for a run equal to trainrun's: constant lr, trainrun's AdamW, no
    clipping, fp32 on the CPU, no dropout, a log row per step, nothing saved."""
    return dict(output_dir=out_dir, per_device_train_batch_size=per_device,
                gradient_accumulation_steps=accumulation, learning_rate=lr, lr_scheduler_type="constant",
                warmup_steps=0, weight_decay=ADAMW["weight_decay"], adam_beta1=ADAMW["beta1"],
                adam_beta2=ADAMW["beta2"], adam_epsilon=ADAMW["eps"], optim="adamw_torch", max_grad_norm=0.0,
                max_steps=steps, logging_steps=1, save_strategy="no", eval_strategy="no", report_to="none",
                seed=seed, data_seed=seed, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
                disable_dropout=True, dataloader_drop_last=True, dataloader_num_workers=0,
                max_length=max_length, disable_tqdm=True)


def trainrun_order_sampler(n, batch, seed):
    """trainrun's order (core/src/sampler.cpp): epoch e is randperm(n) from a CPU generator
    seeded seed * 1000003 + e, cut into global batches (drop_last); a step's batch is a set, so
    one process reading it in order sees what the ranks see together."""
    class Sampler(torch.utils.data.Sampler):
        def __init__(self):
            self.epoch = 0

        def __len__(self):
            return (n // batch) * batch

        def __iter__(self):
            g = torch.Generator().manual_seed(seed * 1000003 + self.epoch)
            self.epoch += 1
            return iter(torch.randperm(n, generator=g)[: len(self)].tolist())
    return Sampler()


def load_initial_lora_a(model, adapter_dir):
    """Copy trainrun's initial lora_A (PEFT layout, base_model.model.<module>.lora_A.weight) into
    the PeftModel's lora_A.default weights (PEFT draws its own); lora_B must be zero on both sides.
    Returns the modules copied; raises when the two target other modules."""
    from safetensors.torch import load_file
    sd = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    done = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_A.default." in name:
                key = name.replace(".lora_A.default.", ".lora_A.")
                if key not in sd or sd[key].shape != p.shape:
                    raise RuntimeError(f"trainrun's initial adapter has no {key} of shape {tuple(p.shape)}")
                p.copy_(sd[key])
                done += 1
            elif ".lora_B.default." in name and p.abs().max() != 0:
                raise RuntimeError(f"{name} is not zero at initialisation")
    if done != len([k for k in sd if ".lora_A." in k]):
        raise RuntimeError("trainrun's adapter and TRL's model target other modules")
    return done
