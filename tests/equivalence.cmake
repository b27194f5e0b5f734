# Equivalence suite (DESIGN invariant 1), parameterised by strategy: every data-parallel or
# sharded strategy joins with one equivalence_suite() line. One CTest entry per
# (strategy, model, optimizer), so CTest runs them in parallel and a failure names the case.
set(_eq_script ${CMAKE_CURRENT_SOURCE_DIR}/equivalence.sh)
set(_eq_jobs ${CMAKE_CURRENT_SOURCE_DIR}/equivalence)
set(_eq_work ${CMAKE_CURRENT_BINARY_DIR}/work/equivalence)

# equivalence_suite(<strategy> [--set strategy.key=value ...])
function(equivalence_suite strategy)
  foreach(model mlp cnn gpt)
    foreach(optimizer sgd adamw)
      set(_name equivalence.${strategy}.${model}.${optimizer})
      add_test(NAME ${_name}
        COMMAND bash ${_eq_script} $<TARGET_FILE:trainrun> ${_eq_jobs}/${model}.toml
                ${_eq_work}/${strategy}-${model}-${optimizer} ${strategy} ${optimizer} ${ARGN})
      # Seven runs, the largest with four ranks on two cores.
      set_tests_properties(${_name} PROPERTIES TIMEOUT 300 LABELS equivalence)
    endforeach()
  endforeach()
endfunction()

equivalence_suite(ddp)
equivalence_suite(ring)

# Distributed data: evaluation counted once across ranks, world 3 with accumulation, batch
# layout errors (tests/data_parallel.sh).
add_test(NAME data_parallel
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/data_parallel.sh $<TARGET_FILE:trainrun>
          ${CMAKE_CURRENT_SOURCE_DIR}/equivalence/mlp.toml ${_eq_work}/data_parallel)
set_tests_properties(data_parallel PROPERTIES TIMEOUT 180)
