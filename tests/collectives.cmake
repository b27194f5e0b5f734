# Collective backends, through `trainrun bench collectives` launched by trainrun itself:
#  - the correctness matrix (--verify): every operation x dtype x reduce op x element counts
#    0, 1, 7, 1000003, every broadcast root, point-to-point, sub-groups and precondition errors,
#    at world sizes 1-4 (oversubscribed on 2 cores), against a locally computed reference;
#  - no-hang fault handling: kill -9 mid-all-reduce, a dead peer without a launcher, a
#    mismatched collective, a stall warning, an operation timeout, a rank that never starts,
#    Ctrl-C.
set(_tr $<TARGET_FILE:trainrun>)
set(_cw ${CMAKE_CURRENT_BINARY_DIR}/work)
set(_expect ${CMAKE_CURRENT_SOURCE_DIR}/tools/expect.sh)

# How many checks rank 0 must report for the full matrix at world size N, stated here
# independently of the bench so that a matrix that silently shrank fails: 7 dtypes x 4 counts x
# (all-reduce and reduce-scatter with 4 reduce ops each, all-gather, broadcast from each of N
# roots, all-to-all of uneven parts), send/recv per dtype and count when N > 1, one barrier, two
# sub-groups rank 0 belongs to (membership, world_size, one check per operation) and 6
# precondition errors. OPS is "all" (the five operations) or "allreduce" (the ring's part of the
# matrix).
function(_verify_checks out n ops)
  set(d 7)
  set(c 4)
  set(r 4)
  if(ops STREQUAL "all")
    math(EXPR k "${d}*${c}*(${r} + ${r} + 1 + ${n} + 1)")
    set(nops 5)
  else()
    math(EXPR k "${d}*${c}*${r}")
    set(nops 1)
  endif()
  if(n GREATER 1)
    math(EXPR k "${k} + ${d}*${c}")
  endif()
  math(EXPR k "${k} + 1 + 2*(2 + ${nops}) + 6")
  set(${out} ${k} PARENT_SCOPE)
endfunction()

_verify_checks(_k 1 all)
add_test(NAME collectives_verify.cpp.w1
  COMMAND ${_expect} 0 "world_size 1, ${_k} checks per rank, 0 failure" --
          ${_tr} bench collectives --backend cpu --verify --set accelerator.threads=1)
set_tests_properties(collectives_verify.cpp.w1 PROPERTIES TIMEOUT 120)

foreach(backend gloo-cpu mpi)
  foreach(n 1 2 3 4)
    _verify_checks(_k ${n} all)
    add_test(NAME collectives_verify.${backend}.w${n}
      COMMAND ${_expect} 0 "world_size ${n}, ${_k} checks per rank, 0 failure" --
              ${_tr} bench collectives --backend ${backend} --nproc ${n} --verify
              --set accelerator.threads=1)
    # A world of 4 on 2 cores runs the 1000003-element matrix in about a minute.
    set_tests_properties(collectives_verify.${backend}.w${n} PROPERTIES TIMEOUT 300
      ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
  endforeach()
endforeach()

# The SDK's ring all-reduce (the `ring` strategy's algorithm) over each backend's send/recv:
# the all-reduce part of the matrix (every dtype x reduce op x 0, 1, 7, 1000003 elements), with
# chunks small enough that every segment is pipelined in several pieces; and the fused path of
# the fusion bench (20 tensors copied into one buffer and back) against the reference.
foreach(backend gloo-cpu mpi)
  foreach(n 2 3 4)
    _verify_checks(_k ${n} allreduce)
    add_test(NAME collectives_verify_ring.${backend}.w${n}
      COMMAND ${_expect} 0 "world_size ${n}, ${_k} checks per rank, 0 failure" --
              ${_tr} bench collectives --backend ${backend} --nproc ${n} --verify --op allreduce
              --algo ring --chunk 64K --set accelerator.threads=1)
    set_tests_properties(collectives_verify_ring.${backend}.w${n} PROPERTIES TIMEOUT 300
      ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
  endforeach()
  add_test(NAME collectives_fusion_ring.${backend}
    COMMAND ${_tr} bench collectives --backend ${backend} --nproc 2 --algo ring --fusion 20
            --sizes 4K --iters 2 --warmup 1 --set accelerator.threads=1)
  set_tests_properties(collectives_fusion_ring.${backend} PROPERTIES TIMEOUT 120
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()
# A chunk below 1 KiB is refused before any rank starts (it once ran with 4-byte chunks).
add_test(NAME collectives_ring_bad_chunk
  COMMAND ${_expect} 2 "--chunk 0: the ring's chunk must be at least 1K" --
          ${_tr} bench collectives --backend gloo-cpu --nproc 2 --algo ring --chunk 0)
set_tests_properties(collectives_ring_bad_chunk PROPERTIES TIMEOUT 30)

# --stat median|min times each iteration on its own: the header says which, every row is
# checked, and an unknown statistic is refused before any rank starts.
add_test(NAME collectives_bench_stat
  COMMAND ${_expect} 0 "allreduce on gloo-cpu, 2 ranks, .* median iteration"
          " 4096 +1024 +float32 +[0-9.]+ +[0-9.]+ +[0-9.]+  ok"
          " 16384 +4096 +float32 +[0-9.]+ +[0-9.]+ +[0-9.]+  ok" --
          ${_tr} bench collectives --backend gloo-cpu --nproc 2 --sizes 4K:16K --iters 5
          --warmup 1 --stat median --set accelerator.threads=1)
set_tests_properties(collectives_bench_stat PROPERTIES TIMEOUT 120
  ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
add_test(NAME collectives_bench_bad_stat
  COMMAND ${_expect} 2 "--stat mode: expected mean, median or min" --
          ${_tr} bench collectives --backend gloo-cpu --nproc 2 --stat mode)
set_tests_properties(collectives_bench_bad_stat PROPERTIES TIMEOUT 30)

# The user's own mpiexec, without the trainrun launcher.
find_program(_mpiexec NAMES mpiexec.hydra mpiexec)
if(_mpiexec)
  _verify_checks(_k 2 all)
  add_test(NAME collectives_verify.mpi.user_mpiexec
    COMMAND ${_expect} 0 "world_size 2, ${_k} checks per rank, 0 failure" -- ${_mpiexec} -n 2 ${_tr} bench collectives --backend mpi --verify
            --counts 0,1,7,100003 --set accelerator.threads=1)
  set_tests_properties(collectives_verify.mpi.user_mpiexec PROPERTIES TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endif()

foreach(case kill9 kill9_no_launcher mismatch mismatch_kind stall timeout rendezvous sigint)
  add_test(NAME collectives_faults.gloo-cpu.${case}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/collectives_faults.sh ${_tr}
            ${_cw}/faults-gloo-${case} gloo-cpu ${case})
  set_tests_properties(collectives_faults.gloo-cpu.${case} PROPERTIES TIMEOUT 120
    SKIP_RETURN_CODE 77 ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()
foreach(case kill9 mismatch timeout before_init)
  add_test(NAME collectives_faults.mpi.${case}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/collectives_faults.sh ${_tr}
            ${_cw}/faults-mpi-${case} mpi ${case})
  set_tests_properties(collectives_faults.mpi.${case} PROPERTIES TIMEOUT 120
    SKIP_RETURN_CODE 77 ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()
