#!/usr/bin/env bash
# precision_e2e.sh <trainrun> <jobs-dir> <work-dir> <test-plugin-dir> <case> <gpt-job>
#   inf_injection  2 ranks of ddp under fp16-mixed; rank 1's gradients get +inf at steps 3, 4
#                  and 6 (test model ddp-test-mlp): both ranks skip exactly those steps, the
#                  scale holds at the first overflow (hysteresis 2) and halves at the next two;
#                  with hysteresis 1 (rank 0 injecting) it halves at once.
#   clipping       gradient_clip_algorithm = "value" bounds every weight change of one SGD step
#                  (lr 1) by the clip value, "norm" makes the change's global L2 norm the clip
#                  value; under fp16-mixed the clipped step equals fp32's (unscaled first).
#   divergence     a broken run ends with exit code 3 and a diagnosis: fp32 with +inf gradients
#                  at every step (8 of 8 skipped > max_skipped_fraction 0.5); lr 1e37 (the loss
#                  goes NaN, named as a non-finite loss, the weights non-finite: stops at once,
#                  no model written); 3 of 8 skipped passes. NaN/inf float options (clip, weight
#                  decay, data std, dropout) are refused with exit 2 naming the key, as are NaN
#                  values in init_weights naming the tensor.
#   checkpointing  gpt with activation_checkpointing = true equals the run without (losses and
#                  final weights within 1e-5, single and 2-rank ddp); per-unit selection; bad
#                  unit names and a model without units are errors naming the key.
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 jobs=$2 work=$3 plugins=$4 case=$5 gpt_job=$6
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"

job=$work/job.toml
cat "$jobs/mlp-small.toml" - >"$job" <<'EOF'

[[callbacks]]
plugin = "metrics"
all_ranks = true
EOF

# fails_with <regex> -- args...: exit code 2 (bad input), output matching <regex>.
fails_with() {
  local re=$1; shift 2
  local rc=0
  timeout 100 "$tr" "$@" >"$work/fail.log" 2>&1 || rc=$?
  cat "$work/fail.log"
  [ "$rc" -ne 124 ] || fail "the run hung"
  expect_rc 2 "$rc"
  expect_in "$work/fail.log" "$re"
}

case $case in
  inf_injection)
    ddp2=(--set strategy.plugin=ddp --set accelerator.plugin=gloo-cpu --set accelerator.timeout_s=60
          --set launch.nproc_per_node=2 --set trainer.micro_batch_size=32 --set trainer.max_steps=8
          --set model.plugin=ddp-test-mlp --set precision.plugin=fp16-mixed
          --set precision.fp16_range_check=false)
    run "$work/h2.log" "$tr" --config "$job" --plugin-path "$plugins" --set trainer.run_dir="$work/h2" \
      "${ddp2[@]}" --set model.inf_rank=1 --set 'model.inf_steps=[3, 4, 6]'
    expect_in "$work/h2.log" "step 3: non-finite gradients, step skipped \(loss scale 65536\)"
    run "$work/h1.log" "$tr" --config "$job" --plugin-path "$plugins" --set trainer.run_dir="$work/h1" \
      "${ddp2[@]}" --set model.inf_rank=0 --set 'model.inf_steps=[3]' --set precision.hysteresis=1
    # The same under zero stage 2, where each rank checks only its own gradient shard after the
    # reduce-scatter. (Here the inf reaches both shards, as it does every gradient of the
    # layers below it; the agreement itself is unit-tested with a fake second rank.)
    run "$work/h3.log" "$tr" --config "$job" --plugin-path "$plugins" --set trainer.run_dir="$work/h3" \
      "${ddp2[@]}" --set strategy.plugin=zero --set strategy.stage=2 --set model.inf_rank=1 \
      --set 'model.inf_steps=[3]' --set precision.hysteresis=1
    py - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def rows(run, rank):
    return [json.loads(l) for l in open(f"{work}/{run}/metrics-rank-{rank}.jsonl")
            if "eval_loss" not in l]
cases = {
    # run: (skipped steps, loss scale after each step 1..8)
    "h2": ({3, 4, 6}, [65536, 65536, 65536, 32768, 32768, 16384, 16384, 16384]),
    "h1": ({3}, [65536, 65536, 32768, 32768, 32768, 32768, 32768, 32768]),
    "h3": ({3}, [65536, 65536, 32768, 32768, 32768, 32768, 32768, 32768]),
}
for run, (skipped, scales) in cases.items():
    for rank in (0, 1):
        r = rows(run, rank)
        got_skipped = {x["step"] for x in r if x.get("skipped")}
        got_scales = [x["loss_scale"] for x in r]
        print(f"{run} rank {rank}: skipped {sorted(got_skipped)}, loss_scale {got_scales}, "
              f"skipped_steps {r[-1].get('skipped_steps', 0)}")
        assert got_skipped == skipped, f"{run} rank {rank}: skipped {sorted(got_skipped)}, expected {sorted(skipped)}"
        assert got_scales == scales, f"{run} rank {rank}: loss_scale {got_scales}, expected {scales}"
        assert r[-1].get("skipped_steps") == len(skipped)
        assert all(x["loss"] == x["loss"] for x in r), "a NaN loss was logged"
    # The ranks logged the same global loss at every step.
    assert [x["loss"] for x in rows(run, 0)] == [x["loss"] for x in rows(run, 1)]
PY
    ;;

  divergence)
    fp32=(--set trainer.max_steps=8 --set trainer.micro_batch_size=64 --set model.plugin=ddp-test-mlp
          --set trainer.log_every=1)
    rc=0
    timeout 100 "$tr" --config "$job" --plugin-path "$plugins" --set trainer.run_dir="$work/a" "${fp32[@]}" \
      --set 'model.inf_steps=[1, 2, 3, 4, 5, 6, 7, 8]' >"$work/a.log" 2>&1 || rc=$?
    cat "$work/a.log"
    expect_rc 3 "$rc"
    expect_in "$work/a.log" "^trainrun: error: training diverged: 8 of 8 steps skipped \(\[trainer\] max_skipped_fraction = 0.5\); non-finite gradients \(with a finite loss\) at 8 step\(s\), first at step 1; no step of this run had a finite loss and gradients"
    grep -q "^final eval" "$work/a.log" && fail "a diverged run reported a final evaluation"
    [ -f "$work/a/model.safetensors" ] && fail "a diverged run wrote model.safetensors"
    # 3 of 8 skipped is within the default fraction.
    run "$work/a2.log" "$tr" --config "$job" --plugin-path "$plugins" --set trainer.run_dir="$work/a2" "${fp32[@]}" \
      --set 'model.inf_steps=[2, 4, 6]'
    expect_in "$work/a2.log" "final eval"
    # lr 1e37: huge but finite weights after step 1, a non-finite loss from then on: every later
    # step is skipped, named as a non-finite loss (not as gradients), and the run fails.
    rc=0
    timeout 100 "$tr" --config "$job" --set trainer.run_dir="$work/b" --set trainer.log_every=1 \
      --set optimizer.lr=1e37 --set optimizer.momentum=0 >"$work/b.log" 2>&1 || rc=$?
    cat "$work/b.log"
    expect_rc 3 "$rc"
    expect_in "$work/b.log" "step [0-9]+: non-finite loss \((-?nan|-?inf)\), step skipped"
    grep -q "non-finite gradients, step skipped" "$work/b.log" && fail "a NaN loss was reported as non-finite gradients"
    expect_in "$work/b.log" "^trainrun: error: training diverged: .*non-finite loss at [0-9]+ step\(s\), first at step [0-9]+; last step with a finite loss and gradients: [0-9]+"
    # lr 1e20 with weight decay 1e20: the weights themselves become infinite at step 1 (lr x
    # decay x w overflows float32); the run stops at the next step.
    rc=0
    timeout 100 "$tr" --config "$job" --set trainer.run_dir="$work/c" --set trainer.log_every=1 \
      --set optimizer.lr=1e20 --set optimizer.weight_decay=1e20 --set optimizer.momentum=0 >"$work/c.log" 2>&1 || rc=$?
    cat "$work/c.log"
    expect_rc 3 "$rc"
    expect_in "$work/c.log" "^trainrun: error: training diverged: the weights are non-finite after step 1; "
    grep -q "^\[step 3/20\]" "$work/c.log" && fail "the run went on after its weights became non-finite"
    [ -f "$work/c/model.safetensors" ] && fail "a diverged run wrote model.safetensors"
    # Float options refuse NaN and infinities (exit 2, the key named).
    for kv in trainer.gradient_clip_val=nan optimizer.weight_decay=nan model.dropout=nan \
              trainer.gradient_clip_val=inf optimizer.weight_decay=-inf; do
      rc=0; "$tr" check --config "$job" --set "$kv" >"$work/opt.log" 2>&1 || rc=$?
      cat "$work/opt.log"
      expect_rc 2 "$rc"
      expect_in "$work/opt.log" "${kv%%=*}"
      expect_in "$work/opt.log" "is not a valid value"
    done
    rc=0; "$tr" check --config "$job" --set data.std=nan >"$work/opt.log" 2>&1 || rc=$?
    cat "$work/opt.log"; expect_rc 2 "$rc"; expect_in "$work/opt.log" "std: NaN is not a valid value"
    # init_weights with a NaN: refused before training, naming the tensor.
    run "$work/w.log" "$tr" --config "$job" --set trainer.run_dir="$work/w" --set trainer.max_steps=1
    py - "$work/w/model.safetensors" "$work/nan.safetensors" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
name = sorted(k for k in h if k != "__metadata__")[0]
start = 8 + n + h[name]["data_offsets"][0]
b[start:start + 4] = struct.pack("<f", float("nan"))
open(sys.argv[2], "wb").write(b)
print(name)
PY
    rc=0
    "$tr" --config "$job" --set trainer.run_dir="$work/w2" --set trainer.init_weights="$work/nan.safetensors" >"$work/w2.log" 2>&1 || rc=$?
    cat "$work/w2.log"
    expect_rc 2 "$rc"
    expect_in "$work/w2.log" "init_weights = \".*nan.safetensors\": tensor '.*' holds 1 NaN and 0 infinite value"
    ;;

  clipping)
    one=(--set trainer.max_steps=1 --set optimizer.momentum=0 --set trainer.log_every=1)
    run "$work/init.log" "$tr" --config "$job" --set trainer.run_dir="$work/init" "${one[@]}" --set optimizer.lr=0
    run "$work/value.log" "$tr" --config "$job" --set trainer.run_dir="$work/value" "${one[@]}" --set optimizer.lr=1 \
      --set trainer.gradient_clip_val=0.001 --set trainer.gradient_clip_algorithm=value
    run "$work/norm.log" "$tr" --config "$job" --set trainer.run_dir="$work/norm" "${one[@]}" --set optimizer.lr=1 \
      --set trainer.gradient_clip_val=0.01 --set trainer.gradient_clip_algorithm=norm
    run "$work/value16.log" "$tr" --config "$job" --set trainer.run_dir="$work/value16" "${one[@]}" --set optimizer.lr=1 \
      --set trainer.gradient_clip_val=0.001 --set trainer.gradient_clip_algorithm=value \
      --set precision.plugin=fp16-mixed --set precision.initial_scale_power=10
    fails_with "gradient_clip_algorithm.*norm, value" -- check --config "$job" --set trainer.gradient_clip_algorithm=valeu
    py - "$work" "$here" <<'PY'
import json, math, sys
work, here = sys.argv[1], sys.argv[2]
sys.path.insert(0, here)
from compare_runs import tensors
w0 = tensors(f"{work}/init/model.safetensors")
def delta(run):
    w = tensors(f"{work}/{run}/model.safetensors")
    return {k: [a - b for a, b in zip(w[k], w0[k])] for k in w0}
def metrics(run):
    return [json.loads(l) for l in open(f"{work}/{run}/metrics-rank-0.jsonl") if "eval_loss" not in l][0]
dv = delta("value")
m = max(abs(x) for d in dv.values() for x in d)
frac = sum(1 for d in dv.values() for x in d if abs(x) >= 0.999e-3) / sum(len(d) for d in dv.values())
print(f"value: max |dw| = {m:.6g} (clip 1e-3), {100 * frac:.1f}% of elements at the clip, grad_norm {metrics('value')['grad_norm']:.4g}")
assert 0.999e-3 <= m <= 1.001e-3, m
assert 0 < frac < 1, frac
dn = delta("norm")
n = math.sqrt(sum(x * x for d in dn.values() for x in d))
g = metrics("norm")["grad_norm"]
print(f"norm: ||dw|| = {n:.7g} (clip 0.01), grad_norm before clipping {g:.4g}")
assert g > 0.01, "the gradient norm was already below the clip value"
assert abs(n - 0.01) < 2e-6, n
d16 = delta("value16")
worst = max(abs(a - b) for k in dv for a, b in zip(dv[k], d16[k]))
g16 = metrics("value16")
print(f"fp16-mixed (loss scale {g16.get('loss_scale')}): max |dw - dw(fp32)| = {worst:.3g}, grad_norm {g16['grad_norm']:.6g} vs {metrics('value')['grad_norm']:.6g}")
assert worst <= 1e-7, worst
assert abs(g16["grad_norm"] - metrics("value")["grad_norm"]) <= 1e-5 * metrics("value")["grad_norm"]
PY
    ;;

  checkpointing)
    gjob=$work/gpt.toml
    cat "$gpt_job" - >"$gjob" <<'EOF'

[[callbacks]]
plugin = "metrics"
all_ranks = true
EOF
    # The shipped gpt job made small (2 blocks, 12 steps, dropout on so recomputation must
    # replay the masks), one thread.
    small=(--set model.n_layer=2 --set model.n_embd=64 --set model.dropout=0.1 --set trainer.max_steps=12
           --set trainer.eval_every=0 --set trainer.eval_max_batches=2 --set accelerator.threads=1
           --set optimizer.warmup_steps=2 --set trainer.global_batch_size=8 --set trainer.micro_batch_size=0
           --set trainer.log_every=4)
    run "$work/plain.log" "$tr" --config "$gjob" --set trainer.run_dir="$work/plain" "${small[@]}"
    run "$work/ckpt.log" "$tr" --config "$gjob" --set trainer.run_dir="$work/ckpt" "${small[@]}" \
      --set trainer.activation_checkpointing=true
    expect_in "$work/ckpt.log" "activation checkpointing 2 of 2 units"
    py "$here/compare_runs.py" "$work/plain" "$work/ckpt" --rtol 1e-5 --label "checkpointing, single"
    run "$work/one.log" "$tr" --config "$gjob" --set trainer.run_dir="$work/one" "${small[@]}" \
      --set trainer.activation_checkpointing=true --set 'trainer.activation_checkpointing_units=["blocks.1"]'
    expect_in "$work/one.log" "activation checkpointing 1 of 2 units"
    py "$here/compare_runs.py" "$work/plain" "$work/one" --rtol 1e-5 --label "checkpointing blocks.1"
    # ddp's gradient hooks fire from inside the recomputation: 2 ranks with checkpointing against
    # 2 ranks without (dropout streams differ per rank, so the reference is ddp too).
    dist=(--set strategy.plugin=ddp --set accelerator.plugin=gloo-cpu --set launch.nproc_per_node=2
          --set accelerator.timeout_s=60)
    run "$work/ddp.log" "$tr" --config "$gjob" --set trainer.run_dir="$work/ddp" "${small[@]}" "${dist[@]}"
    run "$work/ddp-ckpt.log" "$tr" --config "$gjob" --set trainer.run_dir="$work/ddp-ckpt" "${small[@]}" "${dist[@]}" \
      --set trainer.activation_checkpointing=true
    py - "$work" <<'PY'
import json, sys
work = sys.argv[1]
for rank in (0, 1):
    a = [json.loads(l) for l in open(f"{work}/ddp/metrics-rank-{rank}.jsonl") if "eval_loss" not in l]
    b = [json.loads(l) for l in open(f"{work}/ddp-ckpt/metrics-rank-{rank}.jsonl") if "eval_loss" not in l]
    assert len(a) == len(b) == 12
    worst = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
    print(f"ddp rank {rank}: worst relative loss difference with checkpointing {worst:.2e}")
    assert worst <= 1e-5, worst
PY
    py "$here/compare_runs.py" "$work/ddp" "$work/ddp-ckpt" --rtol 1e-5 --label "checkpointing, ddp"
    fails_with "activation_checkpointing_units: the model has no unit 'blocks.9'; its units are blocks.0, blocks.1" -- \
      --config "$gjob" --set trainer.run_dir="$work/bad1" "${small[@]}" --set trainer.activation_checkpointing=true \
      --set 'trainer.activation_checkpointing_units=["blocks.9"]'
    fails_with "activation_checkpointing_units is set, but activation_checkpointing = false" -- \
      --config "$gjob" --set trainer.run_dir="$work/bad2" "${small[@]}" --set 'trainer.activation_checkpointing_units=["blocks.1"]'
    fails_with "activation_checkpointing = true, but the model .* has no units" -- \
      --config "$job" --set trainer.run_dir="$work/bad3" --set trainer.activation_checkpointing=true
    ;;
  *) fail "unknown case $case" ;;
esac
