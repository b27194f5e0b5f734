# `trainrun generate` (KV-cache decoding, issue 22 done-when 4) against transformers'
# generate(do_sample=False): tiny random models of each llama variant built by transformers in the
# test, and SmolLM2-135M-Instruct (cached by scripts/gguf_to_hf.py, as llama.smollm2).
# Gemma 2 (soft-capping, sliding layers) and Qwen3-MoE (experts in the decode steps) in CI, the
# other families of issue 46 in the long suite.
foreach(_variant llama3 qwen2 qwen3 mistral gemma2 gemma3 phi3 phi3long qwen3moe mixtral)
  add_test(NAME generate.tiny.${_variant}
    COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/generate_ref.py $<TARGET_FILE:trainrun>
            $<TARGET_FILE:llama_logits> ${CMAKE_CURRENT_BINARY_DIR}/work/generate-${_variant} tiny ${_variant})
  set_tests_properties(generate.tiny.${_variant} PROPERTIES TIMEOUT 300 LABELS "llama;generate"
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
  if(_variant MATCHES "^(gemma3|phi3|phi3long|mixtral)$")
    set_tests_properties(generate.tiny.${_variant} PROPERTIES LABELS "llama;generate;long")
  endif()
endforeach()
add_test(NAME generate.smollm2
  COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/generate_ref.py $<TARGET_FILE:trainrun>
          $<TARGET_FILE:llama_logits> ${CMAKE_CURRENT_BINARY_DIR}/work/generate-smollm2 smollm2
          ${CMAKE_BINARY_DIR}/cache ${CMAKE_SOURCE_DIR}/scripts)
set_tests_properties(generate.smollm2 PROPERTIES TIMEOUT 900 LABELS "llama;generate"
  ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
# Batched generation (issue 44): left-padded batches against transformers' batched generate,
# batch 1 == batch 16 (greedy and seeded sampling), sampled first-token frequencies against the
# top-k/top-p filtered softmax (chi-square, p > 0.001), stop strings. mistral: sliding window.
# phi3long: longrope's factors follow the batch's longest position, and its cache is recomputed
# when a sequence first passes the pretraining context, as transformers' Phi-3 does (CI); the
# Gemma families' sliding layers in the long suite.
foreach(_variant llama3 mistral phi3long gemma2 gemma3)
  add_test(NAME generate.batch.${_variant}
    COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/generate_ref.py $<TARGET_FILE:trainrun>
            $<TARGET_FILE:llama_logits> ${CMAKE_CURRENT_BINARY_DIR}/work/generate-batch-${_variant} batch
            ${_variant})
  set_tests_properties(generate.batch.${_variant} PROPERTIES TIMEOUT 300 LABELS "llama;generate"
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
  if(_variant MATCHES "^gemma")
    set_tests_properties(generate.batch.${_variant} PROPERTIES LABELS "llama;generate;long")
  endif()
endforeach()
