# Reward models (issue 43) against TRL 1.16's RewardTrainer and transformers
# (tests/e2e/reward_vs_trl.py): llama's score head (LlamaForSequenceClassification), the reward
# objective, the preference dataset's trainer = "reward" layout. single: plain text, with
# center_rewards_coefficient, and conversational pairs, every figure TRL logs at steps 1 and 10;
# the trained model loaded by transformers gives `trainrun score`'s scores; a causal LM converted
# to a reward model keeps its weights. The strategies at 2 ranks, and at 4 with accumulation,
# against the same single-process TRL run; the bad-input errors.
if(NOT TARGET reward OR NOT TARGET preference OR NOT TARGET llama)
  return()
endif()
set(_rvt ${CMAKE_CURRENT_SOURCE_DIR}/e2e/reward_vs_trl.py)
set(_rvt_work ${CMAKE_CURRENT_BINARY_DIR}/work/reward_vs_trl)
add_test(NAME reward.vs_trl.single COMMAND ${TRAINRUN_REF_PYTHON} ${_rvt} $<TARGET_FILE:trainrun> ${_rvt_work}/single)
set(_reward_tests reward.vs_trl.single)
foreach(_s ddp fsdp zero3)
  add_test(NAME reward.vs_trl.${_s}
    COMMAND ${TRAINRUN_REF_PYTHON} ${_rvt} $<TARGET_FILE:trainrun> ${_rvt_work}/${_s} --strategy ${_s} --cells plain)
  add_test(NAME reward.vs_trl.${_s}_world4_accumulation
    COMMAND ${TRAINRUN_REF_PYTHON} ${_rvt} $<TARGET_FILE:trainrun> ${_rvt_work}/${_s}4 --strategy ${_s} --world 4
            --micro 2 --cells plain,margin)
  list(APPEND _reward_tests reward.vs_trl.${_s} reward.vs_trl.${_s}_world4_accumulation)
endforeach()
add_test(NAME reward.checks COMMAND ${TRAINRUN_REF_PYTHON} ${_rvt} $<TARGET_FILE:trainrun> ${_rvt_work}/checks --checks)
list(APPEND _reward_tests reward.checks)
set_tests_properties(${_reward_tests} PROPERTIES TIMEOUT 300 LABELS "preference;objectives"
  ENVIRONMENT "HF_HUB_OFFLINE=1;TRANSFORMERS_OFFLINE=1;TOKENIZERS_PARALLELISM=false;OMP_NUM_THREADS=1")
