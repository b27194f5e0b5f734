#!/usr/bin/env bash
# gpus_no_device.sh <trainrun> <work-dir>: on a machine without a GPU, a job that asks for the
# cuda accelerator fails before training with exit code 2, naming the cause and CUDA's error;
# `trainrun plugins cuda` still lists the component. Skipped (77) where a GPU is attached.
set -u
trainrun=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
if [ -e /dev/nvidia0 ]; then echo "SKIP: a GPU is attached"; exit 77; fi
rm -rf "$work" && mkdir -p "$work"
bash "$here/../tools/expect.sh" 0 "cuda" "collectives" "device_ids" -- "$trainrun" plugins cuda || exit 1
bash "$here/../tools/expect.sh" 2 "no CUDA device visible \(cudaGetDeviceCount: cuda[A-Za-z]+: " \
  "\[accelerator\]" '!Segmentation' -- \
  "$trainrun" --config "$here/jobs/mlp-small.toml" --set accelerator.plugin=cuda \
  --set trainer.run_dir="$work/run"
