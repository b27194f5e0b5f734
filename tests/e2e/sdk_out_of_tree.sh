#!/usr/bin/env bash
# sdk_out_of_tree.sh <trainrun-build-dir> <trainrun-source-dir> <work-dir>
#
# The SDK as a third party sees it: installs the trainrun build into <work-dir>/prefix (nothing
# is rebuilt), builds sdk/examples/loss-threshold against that prefix alone with
# find_package(TrainrunSDK), then trains a short job with the INSTALLED trainrun, the example
# found through TRAINRUN_PLUGIN_PATH, and checks what the callback printed and wrote. Then builds
# tests/e2e/sdk_old_paths, a plugin that includes the SDK headers by their paths before issue 42
# moved them into role folders, and checks that it loads and runs (the forwarding headers). Then
# the example objective (sdk/examples/rpo) trains, and the example reward
# (sdk/examples/keyword-reward) scores fixed rows through the installed `trainrun reward`; the
# example online objective (sdk/examples/rloo) trains on its own completions.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$3
example_src=$src/sdk/examples/loss-threshold

fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo; echo "=== $*"; }

rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd)
prefix=$work/prefix

step "install $build into $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 || {
  cat "$work/install.log"; fail "cmake --install failed"; }
for f in bin/trainrun include/trainrun/trainrun.hpp include/trainrun/plugin.hpp \
         include/trainrun/capabilities.hpp include/trainrun/reward.hpp \
         include/trainrun/strategy/sharding.hpp \
         include/trainrun/collectives/ring.hpp include/trainrun/collectives/ring_reduce_scatter.hpp \
         include/trainrun/model/linear.hpp include/trainrun/runtime/cpu_runtime.hpp \
         include/trainrun/sharding.hpp include/trainrun/ring.hpp \
         lib/cmake/TrainrunSDK/TrainrunSDKConfig.cmake \
         lib/cmake/TrainrunSDK/TrainrunSDKConfigVersion.cmake \
         lib/cmake/TrainrunSDK/TrainrunSDKTargets.cmake \
         lib/cmake/TrainrunSDK/TrainrunSDKFunctions.cmake \
         lib/cmake/TrainrunSDK/trainrun_plugin.map; do
  [ -e "$prefix/$f" ] || fail "the install lacks $f"
done
# Test-only plugins (tests/bad_plugins) must never reach an install tree.
if ls "$prefix"/lib/trainrun/plugins | grep -E 'bad-|not-a-plugin|entry-v2'; then
  fail "test plugins were installed into $prefix/lib/trainrun/plugins"
fi

step "the example includes only <trainrun/trainrun.hpp> from the SDK"
bad_includes=$(grep -hE '#include *[<"]trainrun/' "$example_src"/*.cpp "$example_src"/*.hpp 2>/dev/null |
               grep -vE '#include *<trainrun/trainrun\.hpp>' || true)
[ -z "$bad_includes" ] || fail "the example includes other SDK headers: $bad_includes"

step "configure and build the example against $prefix"
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S "$example_src" -B "$work/example" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON "${launcher[@]}"
cmake --build "$work/example"
plugin=$work/example/libtrainrun-loss-threshold.so
[ -f "$plugin" ] || fail "the example build produced no $plugin"
# Compiled against the installed headers, not the source tree.
grep -q -- "$prefix/include" "$work/example/compile_commands.json" ||
  fail "the example was not compiled against $prefix/include"
if grep -q -- "$src/sdk/include" "$work/example/compile_commands.json"; then
  fail "the example was compiled against the source tree's sdk/include"
fi
# Exports exactly the entry symbol.
exported=$(nm -D --defined-only "$plugin" | awk '{print $3}' | grep -v '^$' | sort -u)
[ "$exported" = "trainrun_plugin_entry" ] || fail "the example exports: $exported"

trainrun=$prefix/bin/trainrun
export TRAINRUN_PLUGIN_PATH=$work/example

step "the installed trainrun lists the example"
out=$("$trainrun" plugins loss-threshold 2>&1) || { echo "$out"; fail "trainrun plugins loss-threshold"; }
echo "$out"
grep -q "plugin loss-threshold 1.0.0, $plugin" <<<"$out" || fail "not listed from $plugin"

step "train with the example callback"
cat >"$work/job.toml" <<JOB
[model]
plugin = "mlp"
hidden = [32]

[data]
plugin = "idx"

[optimizer]
plugin = "sgd"
lr = 0.1

[trainer]
max_steps = 20
global_batch_size = 32
eval_every = 10
eval_max_batches = 4
log_every = 10
seed = 1
run_dir = "$work/run"

# Reached: the evaluation loss of this job falls well below 2.1 within 20 steps.
[[callbacks]]
plugin = "loss-threshold"
threshold = 2.1

# Never reached (a loss is never negative); reported at the end, the run still succeeds.
[[callbacks]]
plugin = "loss-threshold"
threshold = 0.0
metric = "train_loss"
filename = "never.json"
JOB
set +e
out=$("$trainrun" --config "$work/job.toml" 2>&1)
rc=$?
set -e
echo "$out"
[ "$rc" -eq 0 ] || fail "training exited with $rc"
grep -Eq '^\[loss-threshold: eval_loss [0-9.]+ < 2\.1 at step (10|20)\]$' <<<"$out" ||
  fail "the callback did not report reaching eval_loss < 2.1"
grep -Eq '^\[loss-threshold: train_loss never went below 0 \(best [0-9.]+ at step [0-9]+\) in 20 steps\]$' <<<"$out" ||
  fail "the callback did not report that train_loss never went below 0"
json=$work/run/loss-threshold.json
[ -f "$json" ] || fail "$json was not written"
cat "$json"
grep -Eq '^\{"metric": "eval_loss", "threshold": 2\.1, "value": [0-9.]+, "step": (10|20)\}$' "$json" ||
  fail "$json has unexpected contents"
[ ! -e "$work/run/never.json" ] || fail "never.json was written although the threshold was not reached"

step "require = true fails a run that never reaches the threshold"
set +e
out=$("$trainrun" --config "$work/job.toml" --set callbacks.1.require=true \
        --set trainer.run_dir="$work/run-require" 2>&1)
rc=$?
set -e
echo "$out"
[ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] || fail "expected a clean failure, got exit code $rc"
grep -Eq "error: .*loss-threshold.*train_loss never went below 0" <<<"$out" ||
  fail "the failure does not name the plugin and the reason"

step "a plugin that includes the SDK's old header paths builds against $prefix and loads"
old_src=$src/tests/e2e/sdk_old_paths
old_includes=$(grep -hoE '#include <trainrun/[a-z_]+\.hpp>' "$old_src/old_paths.cpp" | wc -l)
[ "$old_includes" -ge 18 ] || fail "old_paths.cpp includes only $old_includes top-level SDK headers"
cmake -S "$old_src" -B "$work/old-paths" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON "${launcher[@]}"
cmake --build "$work/old-paths"
old_plugin=$work/old-paths/libtrainrun-old-paths.so
[ -f "$old_plugin" ] || fail "the old-paths build produced no $old_plugin"
grep -q -- "$prefix/include" "$work/old-paths/compile_commands.json" ||
  fail "old-paths was not compiled against $prefix/include"
if grep -q -- "$src/sdk/include" "$work/old-paths/compile_commands.json"; then
  fail "old-paths was compiled against the source tree's sdk/include"
fi
out=$(TRAINRUN_PLUGIN_PATH=$work/old-paths "$trainrun" plugins old-paths 2>&1) || {
  echo "$out"; fail "trainrun plugins old-paths"; }
echo "$out"
grep -q "plugin old-paths 1.0.0, $old_plugin" <<<"$out" || fail "not listed from $old_plugin"
cat >"$work/old-paths.toml" <<JOB
[model]
plugin = "mlp"
hidden = [8]

[data]
plugin = "idx"

[trainer]
max_steps = 2
global_batch_size = 8
seed = 1
run_dir = "$work/run-old-paths"

[[callbacks]]
plugin = "old-paths"
JOB
set +e
out=$(TRAINRUN_PLUGIN_PATH=$work/old-paths "$trainrun" --config "$work/old-paths.toml" 2>&1)
rc=$?
set -e
echo "$out"
[ "$rc" -eq 0 ] || fail "training with old-paths exited with $rc"
grep -q '^\[old-paths: cpu list 0-3 has 4 cores\]$' <<<"$out" || fail "the old-paths callback did not run"

step "the example objective (sdk/examples/rpo, ABI 1.8) builds against $prefix and trains"
rpo_src=$src/sdk/examples/rpo
cmake -S "$rpo_src" -B "$work/rpo" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" "${launcher[@]}"
cmake --build "$work/rpo"
rpo_plugin=$work/rpo/libtrainrun-rpo.so
[ -f "$rpo_plugin" ] || fail "the rpo build produced no $rpo_plugin"
out=$(TRAINRUN_PLUGIN_PATH=$work/rpo "$trainrun" plugins rpo 2>&1) || { echo "$out"; fail "trainrun plugins rpo"; }
echo "$out"
grep -q "objective 'rpo'" <<<"$out" || fail "rpo is not listed as an objective"
# A random inline Llama on preference pairs tokenized with a real tokenizer (the shared fixture),
# full fine-tuning: the reference values are precomputed, then 3 steps.
tok=$src/../shared/fixtures/tokenizers/qwen3
[ -f "$tok/tokenizer.json" ] || fail "no tokenizer fixture at $tok"
for i in 1 2 3 4; do
  printf '{"prompt": "Question %s: what is %s plus %s?", "chosen": " It is %s.", "rejected": " Maybe %s, or %s."}\n' \
    "$i" "$i" "$i" "$((2 * i))" "$((3 * i))" "$((i + 7))"
done >"$work/pairs.jsonl"
cat >"$work/rpo.toml" <<JOB
[model]
plugin = "llama"
hidden_size = 16
intermediate_size = 32
num_hidden_layers = 1
num_attention_heads = 2

[data]
plugin = "preference"
paths = ["$work/pairs.jsonl"]
tokenizer = "$tok"

[objective]
plugin = "rpo"
beta = 0.1
alpha = 1.0

[trainer]
max_steps = 3
global_batch_size = 2
seed = 1
log_every = 1
run_dir = "$work/run-rpo"
save_final_model = false

[[callbacks]]
plugin = "metrics"
JOB
set +e
out=$(TRAINRUN_PLUGIN_PATH=$work/rpo "$trainrun" --config "$work/rpo.toml" --set model.save_hf=false 2>&1)
rc=$?
set -e
echo "$out" | tail -8
[ "$rc" -eq 0 ] || fail "training with the rpo objective exited with $rc"
grep -q 'objective rpo (reference: precomputed)' <<<"$out" || fail "the banner does not name the rpo objective"
grep -q '"nll_loss"' "$work/run-rpo/metrics.jsonl" || fail "rpo's nll_loss is not in metrics.jsonl"

step "the example online objective (sdk/examples/rloo, ABI 1.12) builds against $prefix and trains"
rloo_src=$src/sdk/examples/rloo
cmake -S "$rloo_src" -B "$work/rloo" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" "${launcher[@]}"
cmake --build "$work/rloo"
[ -f "$work/rloo/libtrainrun-rloo.so" ] || fail "the rloo build produced no libtrainrun-rloo.so"
# The same random inline Llama generating from prompts, a shipped length reward: 2 steps of 2
# prompts x 4 completions.
for i in 1 2 3 4; do printf '{"prompt": "Question %s: what is %s plus %s?"}\n' "$i" "$i" "$i"; done >"$work/prompts.jsonl"
cat >"$work/rloo.toml" <<JOB
[model]
plugin = "llama"
hidden_size = 16
intermediate_size = 32
num_hidden_layers = 1
num_attention_heads = 2

[data]
plugin = "prompts"
paths = ["$work/prompts.jsonl"]
tokenizer = "$tok"

[objective]
plugin = "rloo"
num_generations = 4
max_completion_length = 8

[[rewards]]
plugin = "length"
kind = "linear"
max_completion_length = 8

[trainer]
max_steps = 2
global_batch_size = 8
seed = 1
log_every = 1
run_dir = "$work/run-rloo"
save_final_model = false

[[callbacks]]
plugin = "metrics"
JOB
set +e
out=$(TRAINRUN_PLUGIN_PATH=$work/rloo "$trainrun" --config "$work/rloo.toml" --set model.save_hf=false 2>&1)
rc=$?
set -e
echo "$out" | tail -5
[ "$rc" -eq 0 ] || fail "training with the rloo objective exited with $rc"
grep -q '"reward"' "$work/run-rloo/metrics.jsonl" || fail "rloo's reward is not in metrics.jsonl"
[ "$(wc -l <"$work/run-rloo/completions/rank-0.jsonl")" -eq 16 ] || fail "rloo's run did not log 16 completions"

step "the example reward (sdk/examples/keyword-reward, ABI 1.10) builds against $prefix and scores"
kw_src=$src/sdk/examples/keyword-reward
kw_includes=$(grep -hE '#include *[<"]trainrun/' "$kw_src"/*.cpp | grep -vE '#include *<trainrun/trainrun\.hpp>' || true)
[ -z "$kw_includes" ] || fail "keyword-reward includes other SDK headers: $kw_includes"
cmake -S "$kw_src" -B "$work/keyword-reward" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" "${launcher[@]}"
cmake --build "$work/keyword-reward"
kw_plugin=$work/keyword-reward/libtrainrun-keyword-reward.so
[ -f "$kw_plugin" ] || fail "the keyword-reward build produced no $kw_plugin"
export TRAINRUN_PLUGIN_PATH=$work/keyword-reward
out=$("$trainrun" plugins keyword-reward 2>&1) || { echo "$out"; fail "trainrun plugins keyword-reward"; }
grep -q "reward 'keyword-reward'" <<<"$out" || { echo "$out"; fail "keyword-reward is not listed as a reward"; }
cat >"$work/keyword.toml" <<JOB
[model]
plugin = "mlp"

[data]
plugin = "idx"

[[rewards]]
plugin = "keyword-reward"
keywords = ["because", "therefore"]
banned = ["maybe"]
penalty = 0.5
skip_empty = true
weight = 2.0
JOB
cat >"$work/keyword-rows.jsonl" <<'ROWS'
{"prompt": "Why?", "completion": "Because it rains, therefore wet."}
{"prompt": "Why?", "completion": "Maybe it rains because clouds."}
{"prompt": "Why?", "completion": "becauseless"}
{"prompt": "Why?", "completion": ""}
{"prompt": "Why?", "completion": "THEREFORE"}
ROWS
out=$("$trainrun" reward --config "$work/keyword.toml" --input "$work/keyword-rows.jsonl" 2>"$work/reward.err") || {
  cat "$work/reward.err"; fail "trainrun reward exited with $?"; }
echo "$out"
# By hand: both keywords 1; one keyword 0.5 minus the penalty 0.5; 'because' inside a word 0;
# empty: no reward (null, so 0 in the weighted sum); one keyword 0.5. Weighted by 2.
expected='{"row":0,"rewards":{"keyword-reward":1.0},"reward":2.0}
{"row":1,"rewards":{"keyword-reward":0.0},"reward":0.0}
{"row":2,"rewards":{"keyword-reward":0.0},"reward":0.0}
{"row":3,"rewards":{"keyword-reward":null},"reward":0.0}
{"row":4,"rewards":{"keyword-reward":0.5},"reward":1.0}'
[ "$out" = "$expected" ] || fail "keyword-reward's scores differ from the expected ones"
# An option only the constructor judges: `trainrun check` exits 2 naming the entry and the option.
set +e
out=$("$trainrun" check --config "$work/keyword.toml" --set 'rewards.0.keywords=[]' 2>&1)
rc=$?
set -e
echo "$out" | tail -1
[ "$rc" -eq 2 ] || fail "check with keywords = []: expected exit 2, got $rc"
grep -q "reward 'keyword-reward' (plugin keyword-reward, .*): create failed: \[\[rewards\]\]\[0\] (.*): option 'keywords' needs at least one word" <<<"$out" ||
  fail "the error does not name the entry and the option"

echo
echo "PASS"
