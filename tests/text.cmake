# The text library: tokenizer units (doctest, no LibTorch) and equality with Hugging Face
# `tokenizers` on the fixture tokenizers (../shared/fixtures/tokenizers, read its README).
set(_tok_fixtures ${CMAKE_SOURCE_DIR}/../shared/fixtures/tokenizers)
add_executable(unit_tokenizer unit/unit_tokenizer.cpp)
target_link_libraries(unit_tokenizer PRIVATE trainrun_text nlohmann_json::nlohmann_json)
target_compile_definitions(unit_tokenizer PRIVATE TRAINRUN_TOKENIZER_FIXTURES="${_tok_fixtures}")
if(TARGET trainrun_text_sentencepiece)
  add_dependencies(unit_tokenizer trainrun_text_sentencepiece)
endif()
add_test(NAME unit_tokenizer COMMAND unit_tokenizer)
set_tests_properties(unit_tokenizer PROPERTIES TIMEOUT 60)

# Token-for-token equality with tokenizers (PyPI; the reference for every tokenizer here, also
# where transformers 5 rebuilds one differently, see docs/tokenizers-and-data.md) on >= 2 MB of
# assembled text: encode with and without special tokens, decode with and without
# skip_special_tokens, lossless round trips. The fixtures and SmolLM2-135M-Instruct's tokenizer
# (the converted model directory of the build's cache, see the smollm2_cache fixture in sft.cmake).
add_test(NAME tokenizer_reference
  COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/tokenizer_reference.py $<TARGET_FILE:trainrun>
          ${CMAKE_CURRENT_BINARY_DIR}/work/tokenizer_reference
          ${_tok_fixtures}/llama3 ${_tok_fixtures}/qwen3 ${_tok_fixtures}/mistral
          ${CMAKE_BINARY_DIR}/cache/smollm2-135m-instruct --gguf-to-hf ${CMAKE_SOURCE_DIR}/scripts/gguf_to_hf.py)
set_tests_properties(tokenizer_reference PROPERTIES TIMEOUT 420 FIXTURES_REQUIRED smollm2_cache)

# The CLI on bad input: an unsupported component, a missing directory, a malformed JSONL line
# and an unknown id each exit 2 with a message naming the culprit.
add_test(NAME tokenizer_cli_errors
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/tokenizer_cli_errors.sh $<TARGET_FILE:trainrun>
          ${CMAKE_CURRENT_BINARY_DIR}/work/tokenizer_cli_errors ${_tok_fixtures}/mistral)
set_tests_properties(tokenizer_cli_errors PROPERTIES TIMEOUT 60)

# A tokenizer.model-only directory (a model trained here with Debian's spm_train) through the
# sentencepiece module: ids and text equal spm_encode / spm_decode, BOS/EOS as the config says.
find_program(SPM_TRAIN spm_train)
if(TARGET trainrun_text_sentencepiece AND SPM_TRAIN)
  add_test(NAME tokenizer_sentencepiece
    COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/tokenizer_sentencepiece.py $<TARGET_FILE:trainrun>
            ${CMAKE_CURRENT_BINARY_DIR}/work/tokenizer_sentencepiece)
  set_tests_properties(tokenizer_sentencepiece PROPERTIES TIMEOUT 120)
endif()

# The evaluation harness's units (issue 49; no model, no LibTorch).
add_executable(unit_eval unit/unit_eval.cpp)
target_link_libraries(unit_eval PRIVATE trainrun_eval)
add_test(NAME unit_eval COMMAND unit_eval)
set_tests_properties(unit_eval PROPERTIES TIMEOUT 60 LABELS eval)
