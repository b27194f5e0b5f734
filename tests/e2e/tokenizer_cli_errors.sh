#!/usr/bin/env bash
# trainrun encode/decode on bad input: exit 2 and a message naming the file, component or line.
set -u
tr=$1 work=$2 mistral=$3
rm -rf "$work" && mkdir -p "$work/bad"
fail() { echo "FAIL: $*"; exit 1; }
expect() {  # expect WANT_RC PATTERN CMD... (stdin from $input)
  local rc_want=$1 pat=$2; shift 2
  local out rc
  out=$(printf '%s' "$input" | "$@" 2>&1); rc=$?
  [[ $rc == "$rc_want" ]] || fail "$* exited $rc, want $rc_want: $out"
  grep -qF -- "$pat" <<<"$out" || fail "$* said '$out', want '$pat'"
  echo "ok: $* -> $rc: $(head -c 200 <<<"$out")"
}
# A tokenizer.json with an unsupported pre-tokenizer type.
python3 - "$mistral/tokenizer.json" "$work/bad/tokenizer.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [{"type": "BertPreTokenizer"}]}
json.dump(t, open(sys.argv[2], "w"))
PY
input="hello"
expect 2 "$work/bad/tokenizer.json: pre_tokenizer.pretokenizers[0]: pre-tokenizer type \"BertPreTokenizer\" is not supported" \
  "$tr" encode --tokenizer "$work/bad"
expect 2 "$work/none: no such tokenizer directory" "$tr" encode --tokenizer "$work/none"
input=$'{"text": "ok"}\n{"text": oops}\n'
expect 2 "stdin:2: not a JSON object" "$tr" encode --tokenizer "$mistral" --jsonl
input=$'{"txt": "ok"}\n'
expect 2 "stdin:1: no \"text\" string" "$tr" encode --tokenizer "$mistral" --jsonl
input='[1, 99999]'
expect 2 "token id 99999 (position 1)" "$tr" decode --tokenizer "$mistral"
input=$'\xff'
expect 2 "not valid UTF-8 (byte 0)" "$tr" encode --tokenizer "$mistral"
# And the happy path: plain and jsonl, encode then decode.
input="Hello world"
expect 0 "[1,22557,1526]" "$tr" encode --tokenizer "$mistral" --add-special-tokens
input='[1,22557,1526]'
expect 0 "Hello world" "$tr" decode --tokenizer "$mistral" --skip-special-tokens
input=$'{"text": "Hello"}\n{"text": ""}\n'
expect 0 $'{"ids":[22557]}\n{"ids":[]}' "$tr" encode --tokenizer "$mistral" --jsonl
echo "tokenizer_cli_errors: OK"
