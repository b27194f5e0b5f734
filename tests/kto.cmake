# KTO against TRL 1.16's KTOTrainer (tests/e2e/kto_vs_trl.py): the `kto` objective and the
# `unpaired` dataset on a tiny random Llama made by transformers, 10 AdamW steps of 8 examples,
# every figure TRL logs at steps 1 and 10 (1e-5 / 1e-4 relative) and the loss and KL estimate at
# every step: loss_type kto with unequal labels and weights, full fine-tuning (precomputed
# reference) and LoRA (adapters off); apo_zero_unpaired on pairs both sides unpair; then the
# dataset's and objective's bad-input errors (exit 2, FILE:LINE and field).
if(NOT TARGET objectives OR NOT TARGET unpaired OR NOT TARGET preference)
  return()
endif()
add_test(NAME kto.vs_trl
  COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/kto_vs_trl.py $<TARGET_FILE:trainrun>
          ${CMAKE_CURRENT_BINARY_DIR}/work/kto_vs_trl)
set_tests_properties(kto.vs_trl PROPERTIES TIMEOUT 240 LABELS "preference;objectives"
  ENVIRONMENT "HF_HUB_OFFLINE=1;TRANSFORMERS_OFFLINE=1;TOKENIZERS_PARALLELISM=false;OMP_NUM_THREADS=1")

# The strategies against the same single-process TRL run (kto_vs_trl.py --strategy): trainrun at 2
# ranks of 4 examples (gloo-cpu), loss_type kto, full fine-tuning and LoRA, every rank's figures
# at steps 1 and 10 and the loss and KL estimate at every step, as above. Exact in principle since
# the objective averages the ranks' KL means before clamping, as TRL does (ObjectiveForward::comm):
# with equal KL rows per rank that is the step's one estimate. Under ddp also 4 ranks of 2 (and an
# evaluation with filler batches equal to one process's), and 2 ranks accumulating 2 micro-batches
# of 2 against TRL's 4 examples x 2 accumulation steps (loss, kl, rewards/margins, grad_norm, lr:
# TRL averages its label and token means per micro-batch, trainrun over the step's examples).
if(TARGET gloo-cpu AND TARGET ddp AND TARGET fsdp AND TARGET zero)
  set(_kvt ${CMAKE_CURRENT_SOURCE_DIR}/e2e/kto_vs_trl.py)
  set(_kvt_work ${CMAKE_CURRENT_BINARY_DIR}/work/kto_vs_trl_strategies)
  set(_kvt_tests)
  foreach(_s ddp fsdp zero3)
    add_test(NAME kto.vs_trl.${_s}
      COMMAND ${TRAINRUN_REF_PYTHON} ${_kvt} $<TARGET_FILE:trainrun> ${_kvt_work}/${_s} --strategy ${_s})
    list(APPEND _kvt_tests kto.vs_trl.${_s})
  endforeach()
  add_test(NAME kto.vs_trl.ddp_world4
    COMMAND ${TRAINRUN_REF_PYTHON} ${_kvt} $<TARGET_FILE:trainrun> ${_kvt_work}/ddp4
            --strategy ddp --world 4 --cells kto/none --eval-filler)
  add_test(NAME kto.vs_trl.ddp_accumulation
    COMMAND ${TRAINRUN_REF_PYTHON} ${_kvt} $<TARGET_FILE:trainrun> ${_kvt_work}/ddp_accumulation
            --strategy ddp --world 2 --micro 2 --cells kto/none)
  list(APPEND _kvt_tests kto.vs_trl.ddp_world4 kto.vs_trl.ddp_accumulation)
  set_tests_properties(${_kvt_tests} PROPERTIES TIMEOUT 240 LABELS "preference;objectives"
    ENVIRONMENT "HF_HUB_OFFLINE=1;TRANSFORMERS_OFFLINE=1;TOKENIZERS_PARALLELISM=false;OMP_NUM_THREADS=1")
endif()
