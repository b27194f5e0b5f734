# Fuzzing (issue 27; docs/contributing.md, "Fuzzing"). tests/fuzz/<target>.cpp each define one
# LLVMFuzzerTestOneInput over a reader of untrusted bytes. Two builds use them:
#  - every build: fuzz_regress_<target>, the target plus a plain main() (fuzz/regress_main.cpp)
#    replaying the saved corpus tests/fuzz/corpus/<target>/ (minimized seeds and every crash or
#    hang input found) as CTest fuzz_regress.<target>; no clang needed;
#  - -DTRAINRUN_FUZZ=ON with clang (scripts/fuzz, build-fuzz/): fuzz_<target>, libFuzzer binaries
#    under ASan+UBSan (the sanitizer flags come from CMAKE_CXX_FLAGS, so the libraries they
#    link are instrumented too).
set(TRAINRUN_FUZZ_TARGETS job_file safetensors checkpoint_meta llama_config tokenizer chat_data
    chat_template)
option(TRAINRUN_FUZZ "Build the libFuzzer targets fuzz_<target> (clang; see scripts/fuzz)" OFF)
set(TRAINRUN_FUZZ_PLUGIN_DIR "${TRAINRUN_PLUGIN_OUTPUT_DIR}" CACHE PATH
    "Plugins the job_file target validates against (scripts/fuzz: the gcc build's)")
set(_fuzz_src ${CMAKE_CURRENT_SOURCE_DIR}/fuzz)
if(TRAINRUN_FUZZ)
  # The core's private libcrypto (checkpoint sha256), for the targets that compile core sources.
  find_package(OpenSSL REQUIRED COMPONENTS Crypto)
endif()

# _trainrun_fuzz_target(<exe> <target> <extra sources>...): one target's executable, linking
# only what the reader under test needs (the text targets build without LibTorch, in seconds).
function(_trainrun_fuzz_target exe target)
  add_executable(${exe} ${_fuzz_src}/${target}.cpp ${ARGN})
  target_compile_definitions(${exe} PRIVATE
    TRAINRUN_FUZZ_PLUGIN_DIR="${TRAINRUN_FUZZ_PLUGIN_DIR}"
    TRAINRUN_FUZZ_FIXTURES="${CMAKE_SOURCE_DIR}/../shared/fixtures/tokenizers")
  if(target STREQUAL "tokenizer" OR target STREQUAL "chat_data" OR target STREQUAL "chat_template")
    target_link_libraries(${exe} PRIVATE trainrun_text)
    if(target STREQUAL "chat_data")
      target_link_libraries(${exe} PRIVATE trainrun_chat_samples)
    endif()
    return()
  endif()
  if(target STREQUAL "safetensors")
    target_link_libraries(${exe} PRIVATE trainrun_hf)
  elseif(target STREQUAL "llama_config")
    # The plugin's objects without its entry symbol (as tests/llama.cmake's llama_logits).
    target_link_libraries(${exe} PRIVATE llama-objects)
  elseif(TRAINRUN_FUZZ AND NOT exe MATCHES "^fuzz_regress_")
    # The libFuzzer binaries compile just the core sources the reader needs (under clang with
    # sanitizers the whole core is half an hour of compiling on a small machine); the regression
    # runners link the core library the ordinary build has made anyway.
    set(_core ${CMAKE_SOURCE_DIR}/core/src)
    if(target STREQUAL "checkpoint_meta")
      target_sources(${exe} PRIVATE ${_core}/checkpoint.cpp ${_core}/log.cpp)
    else()
      target_sources(${exe} PRIVATE ${_core}/config.cpp ${_core}/registry.cpp ${_core}/spelling.cpp
        ${_core}/runtime.cpp ${_core}/log.cpp ${_core}/launcher/worker_environment.cpp
        ${_core}/launcher/layout.cpp)
    endif()
    target_include_directories(${exe} PRIVATE $<TARGET_PROPERTY:trainrun_core,INTERFACE_INCLUDE_DIRECTORIES>)
    target_compile_definitions(${exe} PRIVATE $<TARGET_PROPERTY:trainrun_core,INTERFACE_COMPILE_DEFINITIONS>)
    target_link_libraries(${exe} PRIVATE TrainrunSDK::sdk trainrun_hf torch Boost::headers
      tomlplusplus::tomlplusplus nlohmann_json::nlohmann_json OpenSSL::Crypto ${CMAKE_DL_LIBS})
  else()
    target_link_libraries(${exe} PRIVATE trainrun_core)
  endif()
  trainrun_use_pch(${exe})
endfunction()

# The replay main() compiled once for every runner (no LibTorch, no PCH).
add_library(fuzz_regress_main OBJECT ${_fuzz_src}/regress_main.cpp)
foreach(t ${TRAINRUN_FUZZ_TARGETS})
  _trainrun_fuzz_target(fuzz_regress_${t} ${t})
  target_link_libraries(fuzz_regress_${t} PRIVATE fuzz_regress_main)
  add_test(NAME fuzz_regress.${t} COMMAND fuzz_regress_${t} ${_fuzz_src}/corpus/${t})
  set_tests_properties(fuzz_regress.${t} PROPERTIES TIMEOUT 120)
  if(TRAINRUN_FUZZ)
    _trainrun_fuzz_target(fuzz_${t} ${t})
    target_link_options(fuzz_${t} PRIVATE -fsanitize=fuzzer)
  endif()
endforeach()
add_custom_target(fuzz_targets)
if(TRAINRUN_FUZZ)
  foreach(t ${TRAINRUN_FUZZ_TARGETS})
    add_dependencies(fuzz_targets fuzz_${t})
  endforeach()
endif()
