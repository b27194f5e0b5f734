#!/usr/bin/env bash
# A model defined and scripted in Python trains in trainrun; skipped without python3-torch.
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 job=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "SKIP: Debian's python3-torch is not installed (apt-get install python3-torch)"
  exit 77
fi
/usr/bin/python3 "$(dirname "$0")/make_torchscript_mlp.py" "$work/net.pt"
run "$work/log" "$tr" --config "$job" --set trainer.run_dir="$work/run" --set model.path="$work/net.pt"
last=$(tail -n 1 "$work/log")
acc=$(sed -n 's/.*accuracy \([0-9.]*\)%.*/\1/p' <<<"$last")
py -c "import sys; a=float('$acc'); print('accuracy', a); sys.exit(0 if a >= 60 else 1)" || fail "accuracy '$acc' < 60%"
