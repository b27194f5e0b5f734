# Quantization and adapters (issue 9): doctest units of the quant plugin's kernels (NF4, double
# quantization, int8), the SDK's trainrun::v1::Linear and the lora plugin, linked from the
# plugins' component objects as the other unit tests are.
find_package(doctest REQUIRED)
find_package(nlohmann_json 3 REQUIRED)

add_executable(unit_quant ${CMAKE_CURRENT_LIST_DIR}/unit/unit_quant.cpp)
target_include_directories(unit_quant PRIVATE ${PROJECT_SOURCE_DIR}/plugins)
target_link_libraries(unit_quant PRIVATE quant-objects lora-objects doctest::doctest)
trainrun_use_pch(unit_quant)
foreach(suite nf4 int8 linear lora)
  add_test(NAME unit_quant.${suite} COMMAND unit_quant --test-suite=${suite})
  set_tests_properties(unit_quant.${suite} PROPERTIES TIMEOUT 120
    ENVIRONMENT "OMP_NUM_THREADS=2")
endforeach()

# End to end on the fortunes text with the shipped configs cut down to a tiny gpt: pre-train,
# then quant-nf4 + lora under ddp at 2 ranks (held-out loss >= 20% lower, adapter files read by
# an independent reader, comm bytes vs full fine-tuning); and lora + merge-lora (the merged
# model evaluates as the adapted one).
foreach(mode qlora merge qlora_merge)
  add_test(NAME qlora_e2e.${mode}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/qlora_e2e.sh $<TARGET_FILE:trainrun>
            ${CMAKE_SOURCE_DIR}/configs ${CMAKE_CURRENT_BINARY_DIR}/work/qlora-${mode} ${mode})
  set_tests_properties(qlora_e2e.${mode} PROPERTIES TIMEOUT 240 LABELS qlora
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()

# bench/quant.cpp: quantized forward throughput vs a float32 Linear (default 4096x4096); the test
# only runs it small, so that it keeps building and running.
add_executable(bench_quant ${PROJECT_SOURCE_DIR}/bench/quant.cpp)
target_include_directories(bench_quant PRIVATE ${PROJECT_SOURCE_DIR}/plugins)
target_link_libraries(bench_quant PRIVATE quant-objects)
trainrun_use_pch(bench_quant)
# A bench times its own loops too: the build type's level, not the tests' -O1.
target_compile_options(bench_quant PRIVATE -O3)
add_test(NAME bench_quant_smoke
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tools/expect.sh 0 "int8, threshold 6.*ratio" -- $<TARGET_FILE:bench_quant> 512 64 3)
set_tests_properties(bench_quant_smoke PROPERTIES TIMEOUT 60 ENVIRONMENT "OMP_NUM_THREADS=1")
