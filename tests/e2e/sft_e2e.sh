#!/usr/bin/env bash
# configs/smollm2-sft.toml cut short (issue 22, done-when 5): the job's data script on a slice of
# its sources (40 conversations, 10% held out), its model (SmolLM2-135M-Instruct, LoRA, fsdp at 2
# ranks) for one step at lr 0 (the base model's held-out loss: B = 0) and for a few steps; then
# scripts/check_sft_heldout.py recomputes both held-out losses with transformers and PEFT on the
# same conversations and counted targets: trainrun's must agree (1e-4 relative, same number of
# targets) and the loss must fall. The job's [eval] tasks run too, on 2 documents each: before
# training their scores equal `trainrun eval` on the base model.
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
       --set optimizer.warmup_steps=0
       --set "eval.tasks=[\"$src/eval/tasks\"]" --set eval.limit=2)
run "$work/before.log" "$tr" --config "$src/configs/smollm2-sft.toml" "${short[@]}" \
  --set trainer.max_steps=1 --set optimizer.lr=0 --set optimizer.min_lr=0 --set "trainer.run_dir=\"$work/before\""
run "$work/after.log" "$tr" --config "$src/configs/smollm2-sft.toml" "${short[@]}" \
  --set trainer.max_steps=6 --set optimizer.lr=3e-3 --set optimizer.min_lr=3e-3 --set "trainer.run_dir=\"$work/after\""
expect_in "$work/after.log" "chat: 40 conversations .* held out"
# The job's [eval] tasks before training (world 2, fsdp, adapters at B = 0) against trainrun eval
# on the base model in one process: the same aggregates.
run "$work/eval.log" "$tr" eval --model "$model" --tasks "$src/eval/tasks" --limit 2 \
  --output "$work/eval.json"
"$python" - "$work/before/eval/step-0/results.json" "$work/eval.json" "$work/after/eval/step-6/results.json" <<'PY' || fail "the job's [eval] tasks disagree with trainrun eval"
import json, math, sys
job, one, after = (json.load(open(p)) for p in sys.argv[1:4])
bad = []
for task, want in one["results"].items():
    for k, v in want.items():
        if "," not in k or "_stderr," in k or not isinstance(v, (int, float)):
            continue
        got = job["results"].get(task, {}).get(k)
        if got is None or not math.isclose(got, v, rel_tol=1e-4, abs_tol=1e-9):
            bad.append(f"{task} {k}: job {got!r}, trainrun eval {v!r}")
        if not isinstance(after["results"].get(task, {}).get(k), (int, float)):
            bad.append(f"{task} {k}: not in the trained run's results")
print(f"[eval] before training = trainrun eval on {len(one['results'])} tasks" if not bad else "\n".join(bad))
sys.exit(1 if bad else 0)
PY
"$python" "$src/scripts/check_sft_heldout.py" "$src/configs/smollm2-sft.toml" "$work/after" --before-run "$work/before" \
  "${short[@]}" --json "$work/check.json" || fail "trainrun and transformers + PEFT disagree"
"$python" - "$work/check.json" <<'PY' || fail "the held-out loss did not fall"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"held-out loss before {r['before_trainrun']:.4f} -> after {r['after_trainrun']:.4f}")
sys.exit(0 if r["after_trainrun"] < r["before_trainrun"] - 0.05 else 1)
PY
