# GRPO against TRL 1.16's GRPOTrainer (tests/e2e/grpo_vs_trl.py): the `grpo` objective, the
# `prompts` dataset and two [[rewards]] on a tiny random Llama made by transformers; trainrun
# generates, TRL replays trainrun's completions and rewards, and every figure TRL logs is compared
# at every step (1e-5 relative at step 1, 1e-4 after). grpo.vs_trl runs the short set of cells
# (each loss_type, LoRA and full fine-tuning, num_iterations 1 and 2, a KL cell); the long suite
# runs all 18 cells (with GSPO's sequence-level ratio).
if(NOT TARGET grpo OR NOT TARGET prompts OR NOT TARGET rewards)
  return()
endif()
set(_gvt ${CMAKE_CURRENT_SOURCE_DIR}/e2e/grpo_vs_trl.py)
add_test(NAME grpo.vs_trl
  COMMAND ${TRAINRUN_REF_PYTHON} ${_gvt} $<TARGET_FILE:trainrun> ${CMAKE_CURRENT_BINARY_DIR}/work/grpo_vs_trl)
add_test(NAME grpo.vs_trl_all
  COMMAND ${TRAINRUN_REF_PYTHON} ${_gvt} $<TARGET_FILE:trainrun> ${CMAKE_CURRENT_BINARY_DIR}/work/grpo_vs_trl_all
          --cells all)
set_tests_properties(grpo.vs_trl PROPERTIES TIMEOUT 300 LABELS "objectives;grpo"
  ENVIRONMENT "HF_HUB_OFFLINE=1;TRANSFORMERS_OFFLINE=1;TOKENIZERS_PARALLELISM=false;OMP_NUM_THREADS=1")
set_tests_properties(grpo.vs_trl_all PROPERTIES TIMEOUT 900 LABELS "objectives;grpo;long"
  ENVIRONMENT "HF_HUB_OFFLINE=1;TRANSFORMERS_OFFLINE=1;TOKENIZERS_PARALLELISM=false;OMP_NUM_THREADS=1")

# The strategies (grpo_vs_trl.py --strategy): each cell at one rank and at 2 ranks (gloo-cpu):
# the same completions (seeded by the prompt's place in the global batch), every figure equal
# (1e-5 at step 1, 1e-4 after); under fsdp and zero-3 the rollouts gather the parameters once
# (FullParameters).
if(TARGET gloo-cpu AND TARGET ddp AND TARGET fsdp AND TARGET zero AND TARGET ring)
  set(_gvt_tests)
  foreach(_s ddp ring fsdp zero3)
    add_test(NAME grpo.vs_one_rank.${_s}
      COMMAND ${TRAINRUN_REF_PYTHON} ${_gvt} $<TARGET_FILE:trainrun>
              ${CMAKE_CURRENT_BINARY_DIR}/work/grpo_vs_one_rank/${_s} --strategy ${_s})
    list(APPEND _gvt_tests grpo.vs_one_rank.${_s})
  endforeach()
  set_tests_properties(${_gvt_tests} PROPERTIES TIMEOUT 300 LABELS "objectives;grpo"
    ENVIRONMENT "HF_HUB_OFFLINE=1;TRANSFORMERS_OFFLINE=1;TOKENIZERS_PARALLELISM=false;OMP_NUM_THREADS=1")
endif()
