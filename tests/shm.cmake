# gloo-cpu's shared-memory send/recv (plugins/lib/comm-gloo/shm.cpp): shm_p2p forks its own ranks on
# loopback and drives GlooCommunicator directly (correctness at 2 and 3 ranks, with and without
# single copy, recv_reduce, a tag/size mismatch, a dead peer, a timeout; `shm_p2p bench` prints shm vs TCP GB/s and is not a test);
# shm_e2e.sh checks through the real trainrun binary that the path is in use ("+ shm" and
# "collectives over shm" in the banner) and that --verify passes with it on and off, with Gloo's
# all-reduce chosen explicitly, and with two copies only.
add_executable(shm_p2p ${CMAKE_CURRENT_SOURCE_DIR}/tools/shm_p2p.cpp)
target_link_libraries(shm_p2p PRIVATE trainrun_comm_gloo)
trainrun_use_pch(shm_p2p)  # it includes <torch/torch.h>: without the PCH that alone is ~1 min

foreach(case check mismatch dead timeout)
  add_test(NAME shm.p2p.${case} COMMAND shm_p2p ${case})
  set_tests_properties(shm.p2p.${case} PROPERTIES TIMEOUT 180
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()
add_test(NAME shm.p2p.check.w3 COMMAND shm_p2p check 3)
set_tests_properties(shm.p2p.check.w3 PROPERTIES TIMEOUT 300
  ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
# Every message goes through the slots (two copies) by default; this runs the same checks with
# single copy on (TRAINRUN_SHM_CMA=1: messages of 1 MiB and more read with process_vm_readv).
add_test(NAME shm.p2p.check.single_copy COMMAND shm_p2p check)
set_tests_properties(shm.p2p.check.single_copy PROPERTIES TIMEOUT 180
  ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;TRAINRUN_SHM_CMA=1")

foreach(case banner verify_off gloo_allreduce single_copy)
  add_test(NAME shm.e2e.${case}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/shm_e2e.sh $<TARGET_FILE:trainrun>
            ${CMAKE_CURRENT_BINARY_DIR}/work/shm-${case} ${case})
  set_tests_properties(shm.e2e.${case} PROPERTIES TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()
