# The chat dataset (issue 22): samples against transformers' apply_chat_template (token ids,
# counted targets, BOS/EOS), packed vs unpacked losses on gpt and llama, ddp x accumulation on
# masked variable-length data, and bad input. chat_dump is the dataset's LibTorch-free part.
if(NOT TARGET trainrun_text OR NOT TARGET chat)
  return()
endif()
find_package(doctest REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
set(_chat_fixtures ${CMAKE_SOURCE_DIR}/../shared/fixtures/tokenizers)

add_executable(chat_dump ${CMAKE_CURRENT_LIST_DIR}/tools/chat_dump.cpp)
target_include_directories(chat_dump PRIVATE ${PROJECT_SOURCE_DIR}/plugins)
target_link_libraries(chat_dump PRIVATE trainrun_chat_samples)

# Done-when 2 (token ids) and 3b/3c: 13 template/train_on cases (the fixtures', SmolLM2's) x 40
# conversations.
add_test(NAME chat.reference
  COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/chat_reference.py --dump $<TARGET_FILE:chat_dump>
          --fixtures ${_chat_fixtures} --work ${CMAKE_CURRENT_BINARY_DIR}/work/chat_reference
          --smollm2 ${CMAKE_BINARY_DIR}/cache/smollm2-135m-instruct --gguf-to-hf ${CMAKE_SOURCE_DIR}/scripts/gguf_to_hf.py)
set_tests_properties(chat.reference PROPERTIES TIMEOUT 600 LABELS chat FIXTURES_REQUIRED smollm2_cache
  ENVIRONMENT "HF_HUB_OFFLINE=1;TRANSFORMERS_OFFLINE=1;TOKENIZERS_PARALLELISM=false")

# The dataset's batches: masks, packed rows vs unpacked, the held-out split.
add_executable(unit_chat ${CMAKE_CURRENT_LIST_DIR}/unit/unit_chat.cpp)
target_link_libraries(unit_chat PRIVATE chat-objects doctest::doctest)
target_compile_definitions(unit_chat PRIVATE TRAINRUN_TOKENIZER_FIXTURES="${_chat_fixtures}")
trainrun_use_pch(unit_chat)
add_test(NAME chat.unit COMMAND unit_chat)
set_tests_properties(chat.unit PROPERTIES TIMEOUT 60 LABELS chat)

# Done-when 3a: packed vs unpacked per-sample losses.
add_executable(packing_check ${CMAKE_CURRENT_LIST_DIR}/unit/packing_check.cpp)
target_include_directories(packing_check PRIVATE ${PROJECT_SOURCE_DIR}/plugins ${CMAKE_CURRENT_LIST_DIR}/unit)
target_link_libraries(packing_check PRIVATE llama-objects models-objects doctest::doctest)
trainrun_use_pch(packing_check)
add_test(NAME chat.packing COMMAND packing_check)
set_tests_properties(chat.packing PROPERTIES TIMEOUT 120 LABELS chat ENVIRONMENT "OMP_NUM_THREADS=1")

# Done-when 3d: ddp world 2 (and 1, 4) x accumulation 4 (and 1) on masked variable-length data,
# unpacked (gpt) and packed (llama).
foreach(model gpt llama)
  add_test(NAME chat.equivalence.ddp.${model}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/chat_equivalence.sh $<TARGET_FILE:trainrun> ${TRAINRUN_REF_PYTHON}
            ${CMAKE_CURRENT_SOURCE_DIR}/e2e/equivalence/chat-${model}.toml ${CMAKE_CURRENT_BINARY_DIR}/work/chat-equivalence-${model})
  set_tests_properties(chat.equivalence.ddp.${model} PROPERTIES TIMEOUT 600 LABELS "chat;equivalence")
endforeach()

# Packed batches through the sharded runtime (FSDP FULL_SHARD, one unit per decoder layer).
add_test(NAME chat.equivalence.fsdp.llama
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/chat_equivalence.sh $<TARGET_FILE:trainrun> ${TRAINRUN_REF_PYTHON}
          ${CMAKE_CURRENT_SOURCE_DIR}/e2e/equivalence/chat-llama.toml ${CMAKE_CURRENT_BINARY_DIR}/work/chat-equivalence-fsdp-llama
          fsdp --set strategy.sharding_strategy=FULL_SHARD)
set_tests_properties(chat.equivalence.fsdp.llama PROPERTIES TIMEOUT 600 LABELS "chat;equivalence")

# Done-when 6 (the chat dataset's part): each bad input exits 2 naming the file and line or key.
add_test(NAME chat.errors
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/chat_errors.sh $<TARGET_FILE:trainrun> ${TRAINRUN_REF_PYTHON}
          ${CMAKE_CURRENT_BINARY_DIR}/work/chat_errors)
set_tests_properties(chat.errors PROPERTIES TIMEOUT 300 LABELS chat)

# Batch grew in ABI 1.6: a dataset built against 1.5 (its own, shorter Batch) still trains.
trainrun_test_plugin(abi15-data abi15-data SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_plugins/abi15_dataset.cpp)
add_test(NAME chat.abi15_dataset
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tools/expect.sh 0 "\\[step 4/4\\]" "\\[eval step 4\\] loss" --
          $<TARGET_FILE:trainrun> --config ${CMAKE_CURRENT_SOURCE_DIR}/e2e/jobs/abi15-dataset.toml
          --plugin-path ${CMAKE_BINARY_DIR}/test-plugins/abi15-data
          --set trainer.run_dir=${CMAKE_CURRENT_BINARY_DIR}/work/chat-abi15)
set_tests_properties(chat.abi15_dataset PROPERTIES TIMEOUT 120 LABELS chat)
