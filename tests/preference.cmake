# The preference dataset: token for token against TRL 1.16's DPOTrainer (_prepare_dataset and
# DataCollatorForPreference), and with trainer = "cpo" / "orpo" against CPOTrainer's and
# ORPOTrainer's tokenize_row and collator, on standard, conversational and implicit-prompt rows
# with real tokenizers, plus its bad-input errors. preference_dump is the dataset's LibTorch-free
# part.
if(NOT TARGET trainrun_text OR NOT TARGET preference)
  return()
endif()
set(_pref_fixtures ${CMAKE_SOURCE_DIR}/../shared/fixtures/tokenizers)

add_executable(preference_dump ${CMAKE_CURRENT_LIST_DIR}/tools/preference_dump.cpp)
target_include_directories(preference_dump PRIVATE ${PROJECT_SOURCE_DIR}/plugins)
target_link_libraries(preference_dump PRIVATE trainrun_preference_samples)

add_test(NAME preference.reference
  COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/preference_data_ref.py
          --dump $<TARGET_FILE:preference_dump> --fixtures ${_pref_fixtures}
          --smollm2 ${CMAKE_BINARY_DIR}/cache/smollm2-135m-instruct
          --work ${CMAKE_CURRENT_BINARY_DIR}/work/preference_reference)
set_tests_properties(preference.reference PROPERTIES TIMEOUT 600 LABELS preference
  FIXTURES_REQUIRED smollm2_cache
  ENVIRONMENT "HF_HUB_OFFLINE=1;TRANSFORMERS_OFFLINE=1;TOKENIZERS_PARALLELISM=false")

# The objectives against TRL 1.16 itself (tests/e2e/preference_vs_trl.py): tiny random Llama and
# Qwen3 models made by transformers, 16 fixed pairs, 10 AdamW steps, every figure TRL logs at
# steps 1 and 10 (1e-5 / 1e-4 relative). single: DPO sigmoid/ipo/hinge/robust, full fine-tuning
# (precomputed reference) and LoRA (adapters off), a Qwen3 and a conversational cell; the
# strategies at 2 ranks and at 4 with accumulation against the same single-process TRL run;
# QLoRA DPO under fsdp against ddp.
if(TARGET objectives)
  set(_pvt ${CMAKE_CURRENT_SOURCE_DIR}/e2e/preference_vs_trl.py)
  set(_pvt_work ${CMAKE_CURRENT_BINARY_DIR}/work/preference_vs_trl)
  add_test(NAME preference.vs_trl.single
    COMMAND ${TRAINRUN_REF_PYTHON} ${_pvt} $<TARGET_FILE:trainrun> ${_pvt_work}/single)
  foreach(_s ddp fsdp zero3)
    add_test(NAME preference.vs_trl.${_s}
      COMMAND ${TRAINRUN_REF_PYTHON} ${_pvt} $<TARGET_FILE:trainrun> ${_pvt_work}/${_s}
              --strategy ${_s} --objectives dpo-sigmoid --adapters none,lora --extra "")
    add_test(NAME preference.vs_trl.${_s}_world4_accumulation
      COMMAND ${TRAINRUN_REF_PYTHON} ${_pvt} $<TARGET_FILE:trainrun> ${_pvt_work}/${_s}4
              --strategy ${_s} --world 4 --micro 2 --objectives dpo-sigmoid --adapters none,lora --extra "")
  endforeach()
  add_test(NAME preference.qlora_fsdp_vs_ddp
    COMMAND ${TRAINRUN_REF_PYTHON} ${_pvt} $<TARGET_FILE:trainrun> ${_pvt_work}/qlora --qlora)
  set_tests_properties(preference.vs_trl.single preference.vs_trl.ddp preference.vs_trl.fsdp
    preference.vs_trl.zero3 preference.vs_trl.ddp_world4_accumulation
    preference.vs_trl.fsdp_world4_accumulation preference.vs_trl.zero3_world4_accumulation
    preference.qlora_fsdp_vs_ddp
    PROPERTIES TIMEOUT 600 LABELS "preference;objectives"
    ENVIRONMENT "HF_HUB_OFFLINE=1;TRANSFORMERS_OFFLINE=1;TOKENIZERS_PARALLELISM=false;OMP_NUM_THREADS=1")
endif()
if(TARGET objectives)
  # The rest of DPOTrainer's loss types and DPO + the chosen NLL (sft_weight), full fine-tuning;
  # the objectives' errors, the reference cache a second run reuses, the held-out figures.
  add_test(NAME preference.vs_trl.loss_types
    COMMAND ${TRAINRUN_REF_PYTHON} ${_pvt} $<TARGET_FILE:trainrun> ${_pvt_work}/loss_types --adapters none --extra ""
            --objectives dpo-sigmoid+sft,dpo-exo_pair,dpo-nca_pair,dpo-bco_pair,dpo-sppo_hard,dpo-apo_zero,dpo-apo_down,dpo-discopop,dpo-sigmoid_norm,dpo-sft)
  # SimPO (CPOTrainer loss_type "simpo": cpo_alpha 0, and TRL's default 1 with label_smoothing)
  # and ORPO (ORPOTrainer), full fine-tuning and LoRA, plain and conversational pairs, through the
  # dataset's trainer = "cpo" / "orpo"; simpo under ddp at 2 ranks against the single-process TRL
  # run (its figures are means over pairs; the NLL of simpo-cpo and orpo is a per-rank token mean
  # in TRL too, so those compare at one rank).
  add_test(NAME preference.vs_trl.simpo_orpo
    COMMAND ${TRAINRUN_REF_PYTHON} ${_pvt} $<TARGET_FILE:trainrun> ${_pvt_work}/simpo_orpo
            --objectives simpo,simpo-cpo,orpo --adapters none,lora
            --extra conversational-simpo,conversational-orpo)
  add_test(NAME preference.vs_trl.simpo_ddp
    COMMAND ${TRAINRUN_REF_PYTHON} ${_pvt} $<TARGET_FILE:trainrun> ${_pvt_work}/simpo_ddp
            --strategy ddp --objectives simpo --adapters none,lora --extra "")
  set_tests_properties(preference.vs_trl.simpo_orpo preference.vs_trl.simpo_ddp PROPERTIES
    TIMEOUT 600 LABELS "preference;objectives"
    ENVIRONMENT "HF_HUB_OFFLINE=1;TRANSFORMERS_OFFLINE=1;TOKENIZERS_PARALLELISM=false;OMP_NUM_THREADS=1")
  # padding_free (one packed row per micro-batch, position ids and attention per sequence): each
  # figure at each step equals the padded run's within 1e-5, and TRL's (which runs padded: TRL
  # 1.16's DPOTrainer turns padding_free off), for DPO (full and LoRA), SimPO and ORPO; DPO
  # under ddp with accumulation (a rank's micro-batch of 2 pairs in one row).
  add_test(NAME preference.padding_free
    COMMAND ${TRAINRUN_REF_PYTHON} ${_pvt} $<TARGET_FILE:trainrun> ${_pvt_work}/padding_free
            --padding-free --objectives dpo-sigmoid,simpo,orpo --adapters none --extra conversational)
  add_test(NAME preference.padding_free_ddp
    COMMAND ${TRAINRUN_REF_PYTHON} ${_pvt} $<TARGET_FILE:trainrun> ${_pvt_work}/padding_free_ddp
            --padding-free --strategy ddp --micro 2 --objectives dpo-sigmoid --adapters lora --extra "")
  set_tests_properties(preference.padding_free preference.padding_free_ddp PROPERTIES TIMEOUT 600
    LABELS "preference;objectives"
    ENVIRONMENT "HF_HUB_OFFLINE=1;TRANSFORMERS_OFFLINE=1;TOKENIZERS_PARALLELISM=false;OMP_NUM_THREADS=1")
  add_test(NAME preference.checks
    COMMAND ${TRAINRUN_REF_PYTHON} ${_pvt} $<TARGET_FILE:trainrun> ${_pvt_work}/checks --checks)
  set_tests_properties(preference.vs_trl.loss_types preference.checks PROPERTIES TIMEOUT 600
    LABELS "preference;objectives"
    ENVIRONMENT "HF_HUB_OFFLINE=1;TRANSFORMERS_OFFLINE=1;TOKENIZERS_PARALLELISM=false;OMP_NUM_THREADS=1")
endif()
