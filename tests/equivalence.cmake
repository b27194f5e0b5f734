# Equivalence suite (docs/design.md, invariant 1), parameterised by strategy: every data-parallel or
# sharded strategy joins with one equivalence_suite() line. One CTest entry per
# (strategy, model, optimizer), so CTest runs them in parallel and a failure names the case.
set(_eq_script ${CMAKE_CURRENT_SOURCE_DIR}/e2e/equivalence.sh)
set(_eq_jobs ${CMAKE_CURRENT_SOURCE_DIR}/e2e/equivalence)
set(_eq_work ${CMAKE_CURRENT_BINARY_DIR}/work/equivalence)

# equivalence_suite(<strategy> [LABEL <name>] [--set strategy.key=value ...])
# LABEL names the variant in the test names (e.g. zero1 for zero with --set strategy.stage=1).
function(equivalence_suite strategy)
  set(_args ${ARGN})
  set(_label ${strategy})
  list(LENGTH _args _n)
  if(_n GREATER 1)
    list(GET _args 0 _first)
    if(_first STREQUAL "LABEL")
      list(GET _args 1 _label)
      list(REMOVE_AT _args 0 1)
    endif()
  endif()
  foreach(model mlp cnn gpt)
    foreach(optimizer sgd adamw)
      set(_name equivalence.${_label}.${model}.${optimizer})
      add_test(NAME ${_name}
        COMMAND bash ${_eq_script} $<TARGET_FILE:trainrun> ${_eq_jobs}/${model}.toml
                ${_eq_work}/${_label}-${model}-${optimizer} ${strategy} ${optimizer} ${_args})
      # Five runs (equivalence.sh), the largest with four ranks on two cores.
      set_tests_properties(${_name} PROPERTIES TIMEOUT 300 LABELS equivalence)
    endforeach()
  endforeach()
  # The llama plugin (issue 21), AdamW only: its SGD path is the gpt's.
  set(_name equivalence.${_label}.llama.adamw)
  add_test(NAME ${_name}
    COMMAND bash ${_eq_script} $<TARGET_FILE:trainrun> ${_eq_jobs}/llama.toml
            ${_eq_work}/${_label}-llama-adamw ${strategy} adamw ${_args})
  set_tests_properties(${_name} PROPERTIES TIMEOUT 300 LABELS equivalence)
endfunction()

equivalence_suite(ddp)
equivalence_suite(ring)
# ZeRO: small buckets (stages 1-2) and a persistence threshold that keeps norms and biases whole
# while matrices are sharded (stage 3), so every code path of the sharding engine runs. The gpt
# has tied embeddings (a weight used at both ends: the root group at stage 3).
equivalence_suite(zero LABEL zero1 --set strategy.stage=1 --set strategy.reduce_bucket_size=5000)
equivalence_suite(zero LABEL zero2 --set strategy.stage=2 --set strategy.reduce_bucket_size=5000)
equivalence_suite(zero LABEL zero3 --set strategy.stage=3 --set strategy.param_persistence_threshold=100
                  --set strategy.prefetch_bucket_size=20000)
# FSDP: every sharding strategy on the gpt (the model with units; the mlp and cnn are one unit
# each, the path zero3 covers above). HYBRID_SHARD with shard groups of 2 is 2 "nodes" x 2 ranks
# at world 4. Prefetch variants ride along so each setting runs somewhere.
foreach(fsdp_case FULL_SHARD SHARD_GRAD_OP NO_SHARD HYBRID_SHARD)
  foreach(optimizer sgd adamw)
    set(_name equivalence.fsdp.${fsdp_case}.gpt.${optimizer})
    set(_extra --set strategy.sharding_strategy=${fsdp_case})
    if(fsdp_case STREQUAL "HYBRID_SHARD")
      list(APPEND _extra --set strategy.shard_group_size=2)
    elseif(fsdp_case STREQUAL "SHARD_GRAD_OP")
      list(APPEND _extra --set strategy.backward_prefetch=BACKWARD_POST --set strategy.forward_prefetch=true)
    elseif(fsdp_case STREQUAL "NO_SHARD")
      list(APPEND _extra --set strategy.backward_prefetch=none --set strategy.limit_all_gathers=false)
    endif()
    add_test(NAME ${_name}
      COMMAND bash ${_eq_script} $<TARGET_FILE:trainrun> ${_eq_jobs}/gpt.toml
              ${_eq_work}/fsdp-${fsdp_case}-${optimizer} fsdp ${optimizer} ${_extra})
    set_tests_properties(${_name} PROPERTIES TIMEOUT 300 LABELS equivalence)
  endforeach()
endforeach()
# The llama plugin under FULL_SHARD: one unit per decoder layer.
add_test(NAME equivalence.fsdp.FULL_SHARD.llama.adamw
  COMMAND bash ${_eq_script} $<TARGET_FILE:trainrun> ${_eq_jobs}/llama.toml
          ${_eq_work}/fsdp-FULL_SHARD-llama-adamw fsdp adamw --set strategy.sharding_strategy=FULL_SHARD)
set_tests_properties(equivalence.fsdp.FULL_SHARD.llama.adamw PROPERTIES TIMEOUT 300 LABELS equivalence)
# A parameter count not divisible by 4 (51759: hidden 63 and 31), so the last shard is padded.
foreach(stage 1 2 3)
  set(_name equivalence.zero${stage}.mlp-odd.adamw)
  add_test(NAME ${_name}
    COMMAND bash ${_eq_script} $<TARGET_FILE:trainrun> ${_eq_jobs}/mlp-odd.toml
            ${_eq_work}/zero${stage}-mlp-odd zero adamw --set strategy.stage=${stage}
            --set strategy.reduce_bucket_size=20000 --set strategy.param_persistence_threshold=50)
  set_tests_properties(${_name} PROPERTIES TIMEOUT 300 LABELS equivalence)
endforeach()

# Distributed data: evaluation counted once across ranks, world 3 with accumulation, batch
# layout errors (tests/e2e/data_parallel.sh).
add_test(NAME data_parallel
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/data_parallel.sh $<TARGET_FILE:trainrun>
          ${CMAKE_CURRENT_SOURCE_DIR}/e2e/equivalence/mlp.toml ${_eq_work}/data_parallel)
set_tests_properties(data_parallel PROPERTIES TIMEOUT 180)

# Frozen parameters ([trainer] freeze), which the sharded strategies shard as raw bytes with
# their unit (sharding::FrozenFlat): a unit half frozen (blocks.0: attention frozen) and a unit
# with nothing trainable (blocks.1), against the single-process run with the same parameters
# frozen.
set(_freeze "trainer.freeze=[\"blocks.1.*\",\"blocks.0.attn.*\"]")
add_test(NAME equivalence.fsdp.frozen.gpt.adamw
  COMMAND bash ${_eq_script} $<TARGET_FILE:trainrun> ${_eq_jobs}/gpt.toml ${_eq_work}/fsdp-frozen
          fsdp adamw --set strategy.sharding_strategy=FULL_SHARD --common --set ${_freeze})
add_test(NAME equivalence.zero3.frozen.gpt.sgd
  COMMAND bash ${_eq_script} $<TARGET_FILE:trainrun> ${_eq_jobs}/gpt.toml ${_eq_work}/zero3-frozen
          zero sgd --set strategy.stage=3 --set strategy.param_persistence_threshold=100
          --common --set ${_freeze})
set_tests_properties(equivalence.fsdp.frozen.gpt.adamw equivalence.zero3.frozen.gpt.sgd
  PROPERTIES TIMEOUT 300 LABELS equivalence)
