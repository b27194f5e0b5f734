"""Tiny random configurations of each model family the llama plugin opens, as transformers
defines them, for the tests that build a model with transformers and compare trainrun with it
(llama_e2e.py, generate_ref.py). `common` carries the sizes every variant shares.

  llama3    Llama 3 style: rope_type llama3, GQA, tied embeddings
  qwen2     Qwen2: q/k/v biases
  qwen3     Qwen3: q_norm/k_norm, head_dim 16 != hidden / heads
  mistral   Mistral: sliding_window 8 on every layer
  gemma     Gemma: (1 + w) norms, embeddings scaled by sqrt(hidden), GeGLU, head_dim 16, tied
  gemma2    Gemma 2: (1 + w) norms, scaled embeddings, GeGLU, sandwich norms, head_dim 16,
            query_pre_attn_scalar 24, attention and final soft-capping (2 and 3: they bite at the
            test's initializer_range 0.2), layer 0 sliding (window 8), layer 1 global
  gemma3    Gemma 3 (text): as Gemma 2 without soft-capping, with (1 + w) q/k norms and a RoPE per
            layer type (linear x4 at base 1e6 for the global layer, default 1e4 for the sliding one)
  phi3      Phi-3: fused qkv_proj and gate_up_proj, sliding_window 12 on every layer
  mixtral   Mixtral: 4 experts (w1/w2/w3 under block_sparse_moe), top 2 renormalised, the
            router's load-balancing loss on (output_router_logits, coefficient 0.1 so it shows)
  qwen3moe  Qwen3-MoE: q/k norm, layer 0 sparse (4 experts of width 24, top 2 without
            renormalisation), layer 1 dense (mlp_only_layers), load-balancing loss x 0.1
  phi3long  Phi-3 with longrope (original context 8, so the long factors apply past 8 positions,
            attention factor from max / original) and partial_rotary_factor 0.5 (Phi-4-mini's kind)
"""

VARIANTS = ("llama3", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3", "phi3", "phi3long", "mixtral", "qwen3moe")

# LoRA targets covering every projection of each family, by its HF names.
LORA_TARGETS = {
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
    "phi3long": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
}
# MoE: attention only, since PEFT on transformers 5 sees the experts as fused 3-D parameters.
LORA_TARGETS.update({v: ["q_proj", "k_proj", "v_proj", "o_proj"] for v in ("mixtral", "qwen3moe")})
DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lora_targets(variant):
    return LORA_TARGETS.get(variant, DEFAULT_LORA_TARGETS)


def config(variant, **common):
    import transformers as t

    if variant == "llama3":
        return t.LlamaConfig(**common, tie_word_embeddings=True,
                             rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 16})
    if variant == "qwen2":
        return t.Qwen2Config(**common, tie_word_embeddings=False)
    if variant == "qwen3":
        return t.Qwen3Config(**common, head_dim=16, tie_word_embeddings=False)
    if variant == "mistral":
        return t.MistralConfig(**common, sliding_window=8, tie_word_embeddings=False)
    if variant == "gemma":
        return t.GemmaConfig(**common, head_dim=16, hidden_act="gelu_pytorch_tanh", pad_token_id=0,
                             tie_word_embeddings=True, initializer_range=0.2)
    gemma = dict(head_dim=16, query_pre_attn_scalar=24, sliding_window=8, pad_token_id=0,
                 layer_types=["sliding_attention", "full_attention"] * (common["num_hidden_layers"] // 2)
                 + ["sliding_attention"] * (common["num_hidden_layers"] % 2),
                 hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, initializer_range=0.2)
    if variant == "gemma2":
        return t.Gemma2Config(**common, **gemma, attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if variant == "gemma3":
        return t.Gemma3TextConfig(**common, **gemma, rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    if variant == "phi3":
        return t.Phi3Config(**common, sliding_window=12, pad_token_id=0, tie_word_embeddings=False)
    if variant == "phi3long":
        changes = dict(common, max_position_embeddings=max(64, common.get("max_position_embeddings", 64)))
        return t.Phi3Config(**changes, original_max_position_embeddings=8, pad_token_id=0, tie_word_embeddings=False,
                            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                             "partial_rotary_factor": 0.5,
                                             "short_factor": [1.0, 1.25], "long_factor": [2.0, 5.0]})
    moe = dict(num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.1, pad_token_id=0,
               tie_word_embeddings=False)
    if variant == "mixtral":
        return t.MixtralConfig(**common, **moe, num_local_experts=4)
    if variant == "qwen3moe":
        return t.Qwen3MoeConfig(**common, **moe, head_dim=16, num_experts=4, moe_intermediate_size=24,
                                norm_topk_prob=False, mlp_only_layers=[1])
    raise ValueError(f"unknown variant {variant}")


def perturb(model):
    """Norm gains and biases start at 1 and 0, Gemma's gains and Qwen3-MoE's router at 0: perturb
    them (and make every router decisive, so that no top-k choice is a tie) so that a wrong use
    shows."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 1.0)
            elif p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))


# A chat template that marks each message with BOS, its role and EOS, for tokenizers made here.
CHAT_TEMPLATE = ("{% for m in messages %}{{ bos_token }}{{ m['role'] }}\n{{ m['content'] }}{{ eos_token }}\n"
                 "{% endfor %}{% if add_generation_prompt %}{{ bos_token }}assistant\n{% endif %}")


def stable_text():
    """A text that never changes with this repository, to train the tiny tokenizers on: the GPL 3
    as Debian's base-files ships it. Trained on the docs and tests, a tokenizer changed with every
    edit, and with it the prompts' token counts some cases rely on."""
    with open("/usr/share/common-licenses/GPL-3", encoding="utf-8") as f:
        return f.read()


def bpe_tokenizer(texts, vocab_size=400):
    """A byte-level BPE trained on `texts` as transformers' PreTrainedTokenizerFast: ids 0-2 are
    <unk>, <s>, </s>; <s> is prepended; CHAT_TEMPLATE is its chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    return fast
