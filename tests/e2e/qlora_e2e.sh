#!/usr/bin/env bash
# QLoRA end to end on real text, with the shipped configs cut down to a tiny gpt (issue 9).
#   qlora: pre-train on one corpus (single), then quant-nf4 + lora on a different corpus under fsdp
#          at 2 ranks (the config's strategy): held-out loss on the new corpus at least 20% below
#          the quantized base's (adapters on every block Linear and on lm_head); the packed base
#          sharded (each rank
#          holds about half of its bytes); the same run under ddp (base replicated) gives the same
#          held-out loss within 1e-5; the adapter files read back by an independent reader;
#          comm_bytes per step against full fine-tuning of the same model under fsdp.
#   merge: a LoRA run on the full-precision base (single), `trainrun merge-lora`, and the merged
#          model evaluated on its own: the same held-out loss as the adapted run.
#   qlora_merge: a QLoRA run (quant-nf4 + lora, single), `trainrun merge-lora` with the
#          full-precision base: by default the merged model's held-out loss equals the QLoRA
#          run's (within 1e-4 relative; the base is quantized as in training, as the adapter's
#          metadata records); --plain-base says it is not the trained model and gives a
#          different loss (both printed).
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 configs=$2 work=$3 mode=$4
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
tiny=(--set model.n_layer=2 --set model.n_embd=64 --set model.block_size=64 --set data.block_size=64
      --set accelerator.threads=1 --set trainer.eval_every=0 --set trainer.eval_max_batches=16
      --set trainer.log_every=25)
final_loss() { sed -n 's/.*final eval: loss \([0-9.]*\).*/\1/p' "$1" | tail -n 1; }
# variant <job> <out> [no-lora]: the job with fp32 instead of quant-nf4 (and without the lora callback).
variant() {
  py - "$1" "$2" "${3:-}" <<'PY'
import re, sys
src, out, drop_lora = sys.argv[1], sys.argv[2], sys.argv[3] == "no-lora"
blocks = re.split(r"(?m)^(?=\[)", open(src).read())
keep = []
for b in blocks:
    if b.startswith("[precision]"):
        b = '[precision]\nplugin = "fp32"\n\n'
    if drop_lora and b.startswith("[[callbacks]]") and 'plugin = "lora"' in b:
        continue
    keep.append(b)
open(out, "w").write("".join(keep))
PY
}

run "$work/pre.log" "$tr" --config "$configs/gpt-pretrain.toml" "${tiny[@]}" --set trainer.run_dir="$work/pre" \
  --set trainer.max_steps=${PRE_STEPS:-150} --set optimizer.warmup_steps=10
base="$work/pre/model.safetensors"
[ -f "$base" ] || fail "pre-training wrote no $base"

if [ "$mode" = qlora ]; then
  # The quantized base on the new corpus, before fine-tuning: one step at learning rate 0.
  run "$work/base.log" "$tr" --config "$configs/gpt-qlora.toml" "${tiny[@]}" --set trainer.run_dir="$work/base" \
    --set trainer.init_weights="$base" --set trainer.max_steps=1 --set optimizer.lr=0 --set optimizer.min_lr=0 \
    --set callbacks.0.save_adapter=false
  run "$work/qlora.log" "$tr" --config "$configs/gpt-qlora.toml" "${tiny[@]}" --set trainer.run_dir="$work/qlora" \
    --set trainer.init_weights="$base" --set trainer.max_steps=${FT_STEPS:-150} --set optimizer.warmup_steps=10
  expect_in "$work/qlora.log" "strategy fsdp"
  run "$work/ddp.log" "$tr" --config "$configs/gpt-qlora.toml" "${tiny[@]}" --set trainer.run_dir="$work/ddp" \
    --set trainer.init_weights="$base" --set trainer.max_steps=${FT_STEPS:-150} --set optimizer.warmup_steps=10 \
    --set strategy.plugin=ddp --set callbacks.0.save_adapter=false
  variant "$configs/gpt-qlora.toml" "$work/full.toml" no-lora
  run "$work/full.log" "$tr" --config "$work/full.toml" "${tiny[@]}" --set trainer.run_dir="$work/full" \
    --set trainer.init_weights="$base" --set trainer.max_steps=3
  l0=$(final_loss "$work/base.log") l1=$(final_loss "$work/qlora.log") l2=$(final_loss "$work/ddp.log")
  [ -n "$l0" ] && [ -n "$l1" ] && [ -n "$l2" ] || fail "no final eval lines"
  py -c "import sys; a, b = float('$l1'), float('$l2'); print('held-out loss: fsdp', a, 'ddp', b); sys.exit(0 if abs(a - b) <= 1e-5 * a else 1)" ||
    fail "QLoRA under fsdp ($l1) and ddp ($l2) disagree"
  expect_in "$work/qlora.log" "quant-nf4: 8 Linear layer\(s\) quantized"
  expect_in "$work/qlora.log" "lora: r 8"
  py "$here/check_adapter.py" "$work/qlora/adapter" 8 \
    blocks.0.attn.c_attn:64:192 blocks.0.attn.c_proj:64:64 blocks.0.mlp.c_fc:64:256 blocks.0.mlp.c_proj:256:64 \
    blocks.1.attn.c_attn:64:192 blocks.1.attn.c_proj:64:64 blocks.1.mlp.c_fc:64:256 blocks.1.mlp.c_proj:256:64 \
    lm_head:64:256
  py - "$work" "$l0" "$l1" <<'PY'
import json, re, sys
work, l0, l1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
def comm(run):
    rows = [json.loads(l) for l in open(f"{work}/{run}/metrics.jsonl") if '"comm_bytes"' in l]
    return rows[-1]["comm_bytes"]
q, f, d = comm("qlora"), comm("full"), comm("ddp")
rows = [json.loads(l) for l in open(f"{work}/qlora/metrics.jsonl") if '"fsdp_frozen_bytes"' in l]
frozen = rows[-1]["fsdp_frozen_bytes"]
log = open(f"{work}/qlora.log").read()
share = re.search(r"lora: .*trainable (\d+) of (\d+) parameters \(([0-9.]+)%\)", log)
quant = re.search(r"quant-nf4: .* (\d+) weights in (\d+) bytes = ([0-9.]+) bits/parameter \(bf16: (\d+) bytes\)", log)
print(f"held-out loss on the new corpus: quantized base {l0:.4f} -> after QLoRA {l1:.4f} "
      f"({100 * (1 - l1 / l0):.1f}% lower)")
print(f"trainable: {share.group(1)} of {share.group(2)} parameters ({share.group(3)}%)")
print(f"comm_bytes per step per rank: qlora {q:.0f}, full fine-tuning {f:.0f} ({f / q:.1f}x), both "
      f"under fsdp (gathers of the packed base and the adapters, reduce-scatter of the adapters' "
      f"gradients); under ddp qlora sends {d:.0f}")
print(f"base weights: {quant.group(2)} bytes nf4+dq ({quant.group(3)} bits/parameter) vs "
      f"{quant.group(4)} bytes bf16; per rank under fsdp at rest: {frozen:.0f} bytes")
packed = int(quant.group(2))
assert frozen < 0.6 * packed, f"fsdp holds {frozen} of the {packed} packed bytes per rank: not sharded"
assert l1 <= 0.8 * l0, f"held-out loss improved only {100 * (1 - l1 / l0):.1f}% (< 20%)"
assert q * 3 < f, "QLoRA under fsdp should move far fewer bytes than full fine-tuning"
# ddp all-reduces the adapters' float32 gradients only: 2 (W - 1) / W x 4 bytes x trainable = 4 x
# trainable at W = 2.
assert d == 4 * int(share.group(1)), f"ddp sent {d} bytes, not the adapters' gradients alone"
PY
elif [ "$mode" = merge ]; then
  variant "$configs/gpt-qlora.toml" "$work/lora.toml"
  variant "$configs/gpt-qlora.toml" "$work/plain.toml" no-lora
  single=(--set launch.nproc_per_node=1 --set strategy.plugin=single --set accelerator.plugin=cpu)
  run "$work/lora.log" "$tr" --config "$work/lora.toml" "${tiny[@]}" "${single[@]}" --set trainer.run_dir="$work/lora" \
    --set trainer.init_weights="$base" --set trainer.max_steps=20 --set optimizer.warmup_steps=5
  run "$work/merge.log" "$tr" merge-lora --base "$base" --adapter "$work/lora/adapter" --output "$work/merged.safetensors"
  expect_in "$work/merge.log" "merge-lora: 9 adapter\(s\) merged"
  run "$work/merged.log" "$tr" --config "$work/plain.toml" "${tiny[@]}" "${single[@]}" --set trainer.run_dir="$work/merged" \
    --set trainer.init_weights="$work/merged.safetensors" --set trainer.max_steps=1 --set optimizer.lr=0 --set optimizer.min_lr=0
  la=$(final_loss "$work/lora.log") lm=$(final_loss "$work/merged.log")
  py -c "import sys; a, m = float('$la'), float('$lm'); print('held-out loss: adapted', a, 'merged', m); sys.exit(0 if abs(a - m) <= 2e-4 * a else 1)" ||
    fail "merged model's loss $lm differs from the adapted run's $la"
  # Bad input: a quantized or mismatched base is an error naming the tensor (exit 2).
  rc=0; "$tr" merge-lora --base "$work/merged.safetensors" --adapter "$work/nowhere" --output "$work/x.safetensors" \
    >"$work/bad.log" 2>&1 || rc=$?
  expect_rc 2 "$rc"; expect_in "$work/bad.log" "no adapter_config.json"
elif [ "$mode" = qlora_merge ]; then
  variant "$configs/gpt-qlora.toml" "$work/plain.toml" no-lora
  single=(--set launch.nproc_per_node=1 --set strategy.plugin=single --set accelerator.plugin=cpu)
  run "$work/q.log" "$tr" --config "$configs/gpt-qlora.toml" "${tiny[@]}" "${single[@]}" --set trainer.run_dir="$work/q" \
    --set trainer.init_weights="$base" --set trainer.max_steps=${FT_STEPS:-40} --set optimizer.warmup_steps=5
  py - "$work/q/adapter/adapter_model.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
meta = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])["__metadata__"]
q = json.loads(meta["trainrun_base_quantization"])
print("adapter metadata:", json.dumps(q)[:200])
assert q["blocks.0.attn.c_attn"]["format"].startswith("nf4"), q
assert q["blocks.0.attn.c_attn"]["blocksize"] == 64, q
PY
  # The banner counts each quantized weight as its in x out elements (as lora's total does), not
  # its packed bytes and quantization constants.
  nb=$(sed -nE 's/^  model .*, ([0-9]+) parameters, .*/\1/p' "$work/q.log" | head -n 1)
  nl=$(sed -nE 's/^lora: .*trainable [0-9]+ of ([0-9]+) parameters.*/\1/p' "$work/q.log" | head -n 1)
  echo "banner: $nb parameters; lora: $nl in all"
  [ -n "$nb" ] && [ "$nb" = "$nl" ] || fail "the banner counts $nb parameters, lora $nl"
  run "$work/merge.log" "$tr" merge-lora --base "$base" --adapter "$work/q/adapter" --output "$work/merged.safetensors"
  expect_in "$work/merge.log" "trained against a nf4(\+dq)?-quantized base: merged into that base"
  run "$work/plainmerge.log" "$tr" merge-lora --base "$base" --adapter "$work/q/adapter" --output "$work/plain.safetensors" --plain-base
  expect_in "$work/plainmerge.log" "NOT the model that was trained"
  for m in merged plain; do
    run "$work/eval-$m.log" "$tr" --config "$work/plain.toml" "${tiny[@]}" "${single[@]}" --set trainer.run_dir="$work/eval-$m" \
      --set trainer.init_weights="$work/$m.safetensors" --set trainer.max_steps=1 --set optimizer.lr=0 --set optimizer.min_lr=0
  done
  lq=$(final_loss "$work/q.log") lm=$(final_loss "$work/eval-merged.log") lp=$(final_loss "$work/eval-plain.log")
  echo "measured: held-out loss: QLoRA run $lq, merged (default, dequantized NF4 base + BA) $lm, merged --plain-base $lp"
  py -c "import sys; q, m = float('$lq'), float('$lm'); sys.exit(0 if abs(q - m) <= 1e-4 * q else 1)" ||
    fail "the merged model's loss $lm differs from the QLoRA run's $lq"
  py -c "import sys; q, p = float('$lq'), float('$lp'); sys.exit(0 if abs(q - p) > 1e-4 * q else 1)" ||
    fail "--plain-base gave the trained model's loss: the test cannot tell the two merges apart"
else
  fail "mode must be qlora, merge or qlora_merge"
fi
