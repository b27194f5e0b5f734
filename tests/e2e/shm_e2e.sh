#!/usr/bin/env bash
# gloo-cpu's shared-memory send/recv through the real trainrun binary on loopback:
#   shm_e2e.sh <trainrun> <work dir> <case>
# Cases: banner (shm on, the default: the banner says "+ shm; collectives over shm", --verify
# passes at 2 ranks, no segment is left in /dev/shm), verify_off
# (accelerator.shm=false: TCP only, "+ shm" absent, --verify passes), gloo_allreduce
# (allreduce_algorithm = "ring": Gloo's TCP ring for all_reduce, the other collectives over shm,
# --verify passes), single_copy (TRAINRUN_SHM_CMA=1: the collectives' large messages read from
# the sender's memory, "+ single copy" in the banner, --verify passes).
source "$(dirname "$0")/e2e_lib.sh"
tr=$1 work=$2 case=$3
rm -rf "$work" && mkdir -p "$work"
bench=(bench collectives --backend gloo-cpu --nproc 2 --verify --set accelerator.threads=1
       --plugin-path "$(dirname "$tr")/../lib/trainrun/plugins")

case $case in
banner)
  run "$work/out" "$tr" "${bench[@]}"
  expect_in "$work/out" "# gloo-cpu \(tcp 127\.0\.0\.1 \+ shm; collectives over shm\), rank 0 of 2"
  expect_in "$work/out" "0 failure\(s\) over all ranks"
  # Segments are unlinked once both ends have mapped them; other tests running at the same
  # time may hold one for a moment during their set-up, so allow a short delay.
  for _ in $(seq 1 20); do
    ls /dev/shm/trainrun-* >/dev/null 2>&1 || break
    sleep 0.1
  done
  if ls /dev/shm/trainrun-* 2>/dev/null; then fail "shared-memory segments left behind (above)"; fi
  ;;
verify_off)
  run "$work/out" "$tr" "${bench[@]}" --set accelerator.shm=false
  expect_in "$work/out" "# gloo-cpu \(tcp 127\.0\.0\.1\), rank 0 of 2"
  expect_in "$work/out" "0 failure\(s\) over all ranks"
  ;;
gloo_allreduce)
  run "$work/out" "$tr" "${bench[@]}" --set accelerator.allreduce_algorithm=ring
  expect_in "$work/out" "# gloo-cpu \(tcp 127\.0\.0\.1 \+ shm; all_reduce by Gloo's TCP algorithm, other collectives over shm\), rank 0 of 2"
  expect_in "$work/out" "0 failure\(s\) over all ranks"
  ;;
single_copy)
  TRAINRUN_SHM_CMA=1 run "$work/out" "$tr" "${bench[@]}"
  expect_in "$work/out" "# gloo-cpu \(tcp 127\.0\.0\.1 \+ shm \+ single copy; collectives over shm\), rank 0 of 2"
  expect_in "$work/out" "0 failure\(s\) over all ranks"
  ;;
*) fail "unknown case $case" ;;
esac
echo "PASS: shm_e2e $case"
