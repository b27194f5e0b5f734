# Paths no other test ran (issue 27 item 5): the mpi backend training, bcube, unchecked
# collectives, zero without overlap, clipping under every strategy, an epoch boundary with a
# partial batch, quant-int8, nf4 with bf16 compute, SIGTERM without save_on_signal
# (tests/e2e/paths_e2e.sh says what each compares against).
foreach(case mpi_ddp bcube no_check zero_no_overlap clip_ddp clip_ring clip_zero1 clip_zero2
             clip_zero3 clip_fsdp epochs quant_int8 nf4_bf16 no_save_on_signal)
  add_test(NAME paths_e2e.${case}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/paths_e2e.sh $<TARGET_FILE:trainrun>
            ${CMAKE_CURRENT_SOURCE_DIR}/e2e ${CMAKE_CURRENT_BINARY_DIR}/work/paths-${case} ${case})
  set_tests_properties(paths_e2e.${case} PROPERTIES TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()
