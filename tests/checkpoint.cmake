# Checkpoints end to end (tests/e2e/checkpoint_e2e.sh, launched through trainrun itself): exact
# resume (bitwise) for single, ddp, zero stage 3 and fsdp; resharding across strategies and
# world sizes (evaluation loss within 1e-6); corrupt/truncated files and latest-valid; SIGKILL at
# five points inside a save; SIGTERM saves then exits; consolidation read by a json+struct reader.
# A strategy without the CheckpointableStrategy capability (test-only, never installed).
set(_ckpt_test_plugins ${CMAKE_BINARY_DIR}/test-plugins/ckpt-test-strategies)
trainrun_add_plugin(ckpt-test-strategies
                    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_plugins/plain_strategy.cpp NO_INSTALL)
set_target_properties(ckpt-test-strategies PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${_ckpt_test_plugins})

foreach(case exact_single exact_ddp exact_ddp_fp16 exact_bf16_true exact_ring exact_zero3 exact_fsdp reshard reshard_train corrupt crash sigterm sigterm_slow_save resume_checks consolidate restart minutes unsupported)
  add_test(NAME checkpoint_e2e.${case}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/checkpoint_e2e.sh $<TARGET_FILE:trainrun>
            ${CMAKE_CURRENT_SOURCE_DIR}/e2e ${CMAKE_CURRENT_BINARY_DIR}/work/checkpoint-${case} ${case}
            ${_ckpt_test_plugins})
  set_tests_properties(checkpoint_e2e.${case} PROPERTIES TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()
