#!/usr/bin/env bash
# The chat dataset on bad input (issue 22, done-when 6): every case exits 2 (bad input) with a
# message naming the file and line (JSONL) or record (JSON) and the key at fault.
#   chat_errors.sh TRAINRUN PYTHON WORK
set -u
tr=$1 py=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
"$py" "$here/chat_data.py" "$work/good" --count 8 --seed 1 --tokenizer-out "$work/tokenizer" >/dev/null || exit 1
cat >"$work/job.toml" <<TOML
[trainer]
max_steps = 1
global_batch_size = 2
[model]
plugin = "gpt"
n_layer = 1
n_head = 1
n_embd = 8
block_size = 64
vocab_size = 0
[data]
plugin = "chat"
paths = []
tokenizer = "$work/tokenizer"
max_seq_len = 64
[accelerator]
plugin = "cpu"
TOML
ok='{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}'
status=0
# case NAME FILE-CONTENT [--set ...] -- REGEX...
case_() {
  local name=$1 content=$2; shift 2
  local sets=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do sets+=("$1"); shift; done
  shift
  local file="$work/$name"
  printf '%s\n' "$content" >"$file"
  bash "$here/../tools/expect.sh" 2 "$@" -- "$tr" --config "$work/job.toml" --set "data.paths=[\"$file\"]" \
    --set trainer.run_dir="$work/run-$name" "${sets[@]}" || status=1
}
case_ malformed.jsonl "$ok"$'\n\n{"messages": [oops]}\n' -- 'malformed\.jsonl:3: malformed JSON line'
case_ role.jsonl $'{"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "x"}]}\n' -- \
  'role\.jsonl:1: messages\[1\]\.role: unknown role "bot"'
case_ from.jsonl "$ok"$'\n{"conversations": [{"from": "robot", "value": "x"}]}\n' -- \
  'from\.jsonl:2: conversations\[0\]\.from: unknown role "robot"'
case_ alpaca.json '[{"instruction": "a", "output": "b"}, {"instruction": "c"}]' -- \
  'alpaca\.json: record 2: no "output"'
case_ noassistant.jsonl "$ok"$'\n{"messages": [{"role": "user", "content": "only a question"}]}\n' -- \
  'noassistant\.jsonl:2: no assistant turn to train on'
# The built-in mistral template raises on roles that do not alternate.
case_ raises.jsonl $'{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]}\n' \
  --set data.chat_template=mistral -- 'raises\.jsonl:1: chat template: .*raised: After the optional system message, conversation roles must alternate'
long=$(printf 'word %.0s' $(seq 1 200))
case_ overlong.jsonl "$(printf '%s\n{"messages": [{"role": "user", "content": "%s"}, {"role": "assistant", "content": "x"}]}\n' "$ok" "$long")" \
  --set data.overlong=error -- 'overlong\.jsonl:2: the conversation has [0-9]+ tokens \([0-9]+ predictions\), more than max_seq_len = 64'
# The same file with overlong = "drop" trains, and says what it dropped.
printf '%s\n' "$ok" "$ok" >>"$work/overlong.jsonl"
bash "$here/../tools/expect.sh" 0 'longer than max_seq_len = 64: 1 dropped, 0 truncated' -- "$tr" --config "$work/job.toml" \
  --set "data.paths=[\"$work/overlong.jsonl\"]" --set trainer.run_dir="$work/run-drop" || status=1
bash "$here/../tools/expect.sh" 0 'longer than max_seq_len = 64: 0 dropped, 1 truncated' -- "$tr" --config "$work/job.toml" \
  --set "data.paths=[\"$work/overlong.jsonl\"]" --set data.overlong=truncate --set trainer.run_dir="$work/run-trunc" || status=1
# A hostile chat template (issue 50) ends at its budget before training, naming file, line and
# limit; [data] template_max_operations reaches the engine.
hostile="$here/../fuzz/corpus/chat_template"
case_ budget.jsonl "$ok" --set data.chat_template="$hostile/grow-string-namespace-doubled.jinja" -- \
  'grow-string-namespace-doubled\.jinja, line 1: the rendering exceeds template_max_bytes = [0-9]+'
case_ budget_ops.jsonl "$ok" --set data.chat_template="$hostile/loop-nested-nothing.jinja" \
  --set data.template_max_operations=1000 -- 'loop-nested-nothing\.jinja, line 1: the rendering exceeds template_max_operations = 1000 '
exit $status
