#!/usr/bin/env bash
# configs/smollm2-sft.toml cut short (issue 22, done-when 5): the job's data script on a slice of
# its sources (40 conversations, 10% held out), its model (SmolLM2-135M-Instruct, LoRA, fsdp at 2
# ranks) for one step at lr 0 (the base model's held-out loss: B = 0) and for a few steps; then
# scripts/check_sft_heldout.py recomputes both held-out losses with transformers and PEFT on the
# same conversations and counted targets: trainrun's must agree (1e-4 relative, same number of
# targets) and the loss must fall.
#   sft_e2e.sh TRAINRUN PYTHON SOURCE_DIR MODEL_DIR WORK
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 python=$2 src=$3 model=$4 work=$5
rm -rf "$work" && mkdir -p "$work"
quiet_run "$work/data.log" "$python" "$src/scripts/smollm2_sft_data.py" "$work/data.jsonl" \
  --wordnet-examples 30 --python-examples 10
expect_in "$work/data.log" "40 conversations"
short=(--set "model.path=\"$model\"" --set "data.tokenizer=\"$model\"" --set "data.paths=[\"$work/data.jsonl\"]"
       --set data.validation_fraction=0.1 --set data.max_seq_len=128
       --set trainer.global_batch_size=2 --set trainer.micro_batch_size=1 --set trainer.log_every=1
       --set optimizer.warmup_steps=0)
run "$work/before.log" "$tr" --config "$src/configs/smollm2-sft.toml" "${short[@]}" \
  --set trainer.max_steps=1 --set optimizer.lr=0 --set optimizer.min_lr=0 --set "trainer.run_dir=\"$work/before\""
run "$work/after.log" "$tr" --config "$src/configs/smollm2-sft.toml" "${short[@]}" \
  --set trainer.max_steps=6 --set optimizer.lr=3e-3 --set optimizer.min_lr=3e-3 --set "trainer.run_dir=\"$work/after\""
expect_in "$work/after.log" "chat: 40 conversations .* held out"
"$python" "$src/scripts/check_sft_heldout.py" "$src/configs/smollm2-sft.toml" "$work/after" --before-run "$work/before" \
  "${short[@]}" --json "$work/check.json" || fail "trainrun and transformers + PEFT disagree"
"$python" - "$work/check.json" <<'PY' || fail "the held-out loss did not fall"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"held-out loss before {r['before_trainrun']:.4f} -> after {r['after_trainrun']:.4f}")
sys.exit(0 if r["after_trainrun"] < r["before_trainrun"] - 0.05 else 1)
PY
