# Precision (issue 8): doctest units of the precision plugin's reduced-precision components,
# the dynamic loss scaler, the optimizer's master weights and the SDK's activation
# checkpointing (the plugins' component objects linked in, the CPU memory tracker installed as in
# trainrun's main); end-to-end runs (an inf injected on one rank, clipping, checkpointing);
# and the strategy x precision matrix composed from TOML alone.
find_package(doctest REQUIRED)

add_executable(unit_precision ${CMAKE_CURRENT_SOURCE_DIR}/unit/unit_precision.cpp)
target_include_directories(unit_precision PRIVATE ${PROJECT_SOURCE_DIR}/plugins)
target_link_libraries(unit_precision PRIVATE precision-objects optim-objects models-objects
  trainrun_core doctest::doctest)
trainrun_use_pch(unit_precision)
foreach(suite loss_scaler precision_mixed master_weights activation_checkpointing)
  add_test(NAME unit_precision.${suite} COMMAND unit_precision --test-suite=${suite})
  set_tests_properties(unit_precision.${suite} PROPERTIES TIMEOUT 120
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()

set(_prec_plugins ${CMAKE_BINARY_DIR}/test-plugins/ddp-test-models)
# End-to-end: inf on one rank's gradients (ddp, 2 ranks) skips the step on both and halves the
# scale after the hysteresis; clipping by value and by norm; checkpointing on the gpt.
foreach(case inf_injection clipping checkpointing divergence)
  add_test(NAME precision_e2e.${case}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/precision_e2e.sh $<TARGET_FILE:trainrun>
            ${CMAKE_CURRENT_SOURCE_DIR}/e2e/jobs ${CMAKE_CURRENT_BINARY_DIR}/work/precision-${case}
            ${_prec_plugins} ${case} ${CMAKE_SOURCE_DIR}/configs/gpt-text.toml)
  set_tests_properties(precision_e2e.${case} PROPERTIES TIMEOUT 180
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()

# Every strategy x {fp32, bf16-mixed, fp16-mixed} from TOML alone: a few steps of a tiny model
# (world 2 for the distributed strategies) that must end with a finite loss. A strategy joins
# with one precision_matrix() line; its extra --set arguments follow the strategy's name.
# precision_matrix(<strategy> <world size> [--set key=value ...])
# The fp32 cell is a fixture of the strategy's other cells, which compare their losses with it.
set(_pm_work ${CMAKE_CURRENT_BINARY_DIR}/work/precision-matrix)
function(precision_matrix strategy world)
  foreach(precision fp32 bf16-mixed fp16-mixed)
    set(_name precision_matrix.${strategy}.${precision})
    if(precision STREQUAL "fp32")
      set(_ref -)
    else()
      set(_ref ${_pm_work}/${strategy}-fp32/run)
    endif()
    add_test(NAME ${_name}
      COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/precision_matrix.sh $<TARGET_FILE:trainrun>
              ${CMAKE_CURRENT_SOURCE_DIR}/e2e/jobs/precision-matrix.toml
              ${_pm_work}/${strategy}-${precision}
              ${strategy} ${precision} ${world} ${_ref} ${ARGN})
    set_tests_properties(${_name} PROPERTIES TIMEOUT 120 LABELS precision_matrix
      ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
    if(precision STREQUAL "fp32")
      set_tests_properties(${_name} PROPERTIES FIXTURES_SETUP precision_fp32_${strategy})
    else()
      set_tests_properties(${_name} PROPERTIES FIXTURES_REQUIRED precision_fp32_${strategy})
    endif()
  endforeach()
endfunction()

precision_matrix(single 1)
precision_matrix(ddp 2)
precision_matrix(ring 2)

# Beyond the matrix: bf16-true (bf16 weights, fp32 masters in the optimizer) on one process and
# on 2 ddp ranks (bf16 gradient buckets), and `auto`.
foreach(cell "single;bf16-true;1" "ddp;bf16-true;2" "single;auto;1")
  list(GET cell 0 _s)
  list(GET cell 1 _p)
  list(GET cell 2 _w)
  add_test(NAME precision_extra.${_s}.${_p}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/precision_matrix.sh $<TARGET_FILE:trainrun>
            ${CMAKE_CURRENT_SOURCE_DIR}/e2e/jobs/precision-matrix.toml
            ${_pm_work}/${_s}-${_p} ${_s} ${_p} ${_w} ${_pm_work}/${_s}-fp32/run)
  set_tests_properties(precision_extra.${_s}.${_p} PROPERTIES TIMEOUT 120 LABELS precision_matrix
    FIXTURES_REQUIRED precision_fp32_${_s} ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()

# The sharded strategies join the matrix: zero at stage 3 (the gpt-less matrix model is one unit,
# the root group) and fsdp FULL_SHARD, both keeping float32 weights under the mixed precisions.
precision_matrix(zero 2 --set strategy.stage=3)
precision_matrix(fsdp 2)
