#!/usr/bin/env bash
# ddp_e2e.sh <trainrun> <jobs-dir> <work-dir> <test-plugin-dir> <case>
# End-to-end runs of the ddp strategy: 2 ranks launched by trainrun itself on gloo-cpu
# (loopback), compared step by step with a `single` run of the same job (docs/design.md, invariant
# 1), and the bad-input cases (each a clear error naming the cause, a non-zero exit, no hang).
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 jobs=$2 work=$3 plugins=$4 case=$5
strategy=ddp
source "$(dirname "$0")/dp_e2e_lib.sh"
ddp() { dp_run "$@"; }
ddp_fails() { dp_fails "$@"; }

case $case in
  equivalence)  # defaults: 25 MiB buckets, overlap on
    single single
    ddp ddp
    compare single ddp 1e-5
    ;;
  variants)  # small buckets (several all-reduces), overlap off, 2 accumulated micro-batches
    single single
    ddp small-overlap --set strategy.bucket_cap_mb=0.05 --set strategy.first_bucket_mb=0.01
    compare single small-overlap 1e-5
    ddp small-no-overlap --set strategy.bucket_cap_mb=0.05 --set strategy.first_bucket_mb=0.01 \
      --set strategy.overlap=false --set trainer.micro_batch_size=16
    grep -q "micro 16 x accumulation 2" "$work/small-no-overlap.log" || fail "accumulation was not 2"
    compare single small-no-overlap 1e-5
    ;;
  compression)  # 16-bit buckets on the wire: close to single, not equal
    single single
    ddp fp16 --set strategy.gradient_compression=fp16
    compare single fp16 1e-3 1e-2
    ddp bf16 --set strategy.gradient_compression=bf16
    compare single bf16 1e-2 0.2
    ;;
  shape_mismatch)  # (a) rank 1 builds a wider layer
    ddp_fails "strategy 'ddp': parameter 'fc1\.weight' \(index 2\) differs across ranks: rank 0 has \[64, 64\] float32, rank 1 has \[65, 64\] float32" \
      -- --set model.plugin=ddp-test-mlp --set model.rank_dependent_width=true
    ;;
  unused_error)  # (b) a layer forward never uses, without find_unused_parameters
    ddp_fails "strategy 'ddp': parameters that received no gradient this step: head2\.weight, head2\.bias" \
      "Set \[strategy\] find_unused_parameters = true" \
      -- --set model.plugin=ddp-test-mlp --set model.unused_layer=true
    ;;
  unused_ok)  # (c) the same with the option, plus a layer used on some ranks only
    model=(--set model.plugin=ddp-test-mlp --set model.unused_layer=true --set model.gate_threshold=0.85)
    single single "${model[@]}"
    ddp ddp "${model[@]}" --set strategy.find_unused_parameters=true
    compare single ddp 1e-5
    # The gate's three cases all occurred: used on one rank only, on neither, on both.
    g0=$(sed -n 's/.*ddp-test-mlp rank 0 gate usage: \([01]*\).*/\1/p' "$work/ddp.log")
    g1=$(sed -n 's/.*ddp-test-mlp rank 1 gate usage: \([01]*\).*/\1/p' "$work/ddp.log")
    [ ${#g0} -eq 20 ] && [ ${#g1} -eq 20 ] || fail "no gate usage report from both ranks"
    py -c "import sys; a, b = sys.argv[1:]; k = [x + y for x, y in zip(a, b)]; \
print('gate used per step (rank 0, rank 1):', ' '.join(k)); \
assert '01' in k or '10' in k, 'never used on one rank only'; \
assert '00' in k and '11' in k, 'not all cases'" "$g0" "$g1"
    ;;
  *) fail "unknown case $case" ;;
esac
