# Core unit tests (doctest) and end-to-end runs of the trainrun binary.
add_executable(unit_core unit/unit_core.cpp)
target_link_libraries(unit_core PRIVATE trainrun_core)
target_compile_definitions(unit_core PRIVATE TRAINRUN_TEST_PLUGIN_DIR="${TRAINRUN_PLUGIN_OUTPUT_DIR}")
trainrun_use_pch(unit_core)
add_test(NAME unit_core COMMAND unit_core)
set_tests_properties(unit_core PROPERTIES TIMEOUT 60)

set(_tr $<TARGET_FILE:trainrun>)
set(_jobs ${CMAKE_CURRENT_SOURCE_DIR}/e2e/jobs)
set(_work ${CMAKE_CURRENT_BINARY_DIR}/work)

# Same seed -> bitwise-identical per-step losses and gradient norms; another seed -> different.
add_test(NAME e2e_same_seed_bitwise
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/e2e_same_seed.sh ${_tr} ${_jobs}/mlp-small.toml ${_work}/seed)
# Accumulating 4 micro-batches of 16 equals one batch of 64 (losses within 1e-6 relative).
add_test(NAME e2e_accumulation_equivalence
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/e2e_accumulation.sh ${_tr} ${_jobs}/mlp-small.toml ${_work}/accum)
# The CNN learns Fashion-MNIST: a short run clears 75% test accuracy and writes its outputs.
add_test(NAME e2e_fashion_mnist_short
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/e2e_fashion_mnist.sh ${_tr} ${CMAKE_SOURCE_DIR}/configs/fashion-mnist.toml ${_work}/fmnist)
# The gpt learns English bytes: loss falls well below ln(256) in a short run.
add_test(NAME e2e_gpt_text_short
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/e2e_gpt_text.sh ${_tr} ${CMAKE_SOURCE_DIR}/configs/gpt-text.toml ${_work}/gpt)
# A model scripted in Python (Debian python3-torch) trains; skipped (77) where absent.
add_test(NAME e2e_torchscript
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/e2e_torchscript.sh ${_tr} ${_jobs}/torchscript.toml ${_work}/ts)
# CLI: check, plugins, bad job files exit 2 with file:line:column.
add_test(NAME e2e_cli
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/e2e_cli.sh ${_tr} ${_jobs} ${_work}/cli)
# ctest runs two tests at once on two cores: one thread per test (LibTorch and OpenBLAS pools),
# or OpenMP spin-waits on oversubscribed cores make each run several times slower.
set_tests_properties(e2e_same_seed_bitwise e2e_accumulation_equivalence e2e_cli
  e2e_fashion_mnist_short e2e_gpt_text_short e2e_torchscript
  PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
set_tests_properties(e2e_same_seed_bitwise e2e_accumulation_equivalence e2e_cli PROPERTIES TIMEOUT 180)
set_tests_properties(e2e_fashion_mnist_short e2e_gpt_text_short PROPERTIES TIMEOUT 300)
set_tests_properties(e2e_torchscript PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77)
# Per-rank CPU runtime read back from inside the workers (threads, BLAS kernel, pinning) at 1
# and 2 local ranks, the BLAS probe's refusal, library defaults, OMP_NUM_THREADS.
add_test(NAME cpu_runtime
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/cpu_runtime.sh ${_tr} ${_jobs}/mlp-small.toml ${_work}/cpu_runtime)
set_tests_properties(cpu_runtime PROPERTIES TIMEOUT 420)
