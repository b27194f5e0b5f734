# LibTorch 2.x builds and GPUs (docs/gpus.md): `trainrun --version` names the LibTorch; the
# cuda plugin's device-free logic (unit_cuda) and its no-device error (exit code 2). The GPU
# itself is checked by scripts/device-check on a machine that has one.
add_test(NAME gpus.version COMMAND $<TARGET_FILE:trainrun> --version)
if(TRAINRUN_TORCH_CUDA)
  set(_gpus_version_re "LibTorch ${Torch_VERSION} with CUDA ${TRAINRUN_TORCH_CUDA} from ")
else()
  set(_gpus_version_re "LibTorch ${Torch_VERSION} CPU-only from ")
endif()
string(REPLACE "." "\\." _gpus_version_re "${_gpus_version_re}")
set_tests_properties(gpus.version PROPERTIES TIMEOUT 30 PASS_REGULAR_EXPRESSION "${_gpus_version_re}")

if(NOT TARGET cuda-objects)
  return()
endif()
find_package(doctest REQUIRED)
add_executable(unit_cuda ${CMAKE_CURRENT_SOURCE_DIR}/unit/unit_cuda.cpp)
target_link_libraries(unit_cuda PRIVATE cuda-objects doctest::doctest)
target_include_directories(unit_cuda PRIVATE ${CMAKE_SOURCE_DIR}/plugins/accelerators/cuda
  ${TRAINRUN_NCCL_INCLUDE_DIR})
trainrun_use_pch(unit_cuda)
foreach(suite cuda_pending cuda_options)
  add_test(NAME unit_cuda.${suite} COMMAND unit_cuda --test-suite=${suite})
  set_tests_properties(unit_cuda.${suite} PROPERTIES TIMEOUT 60)
endforeach()
# Where a GPU is attached these two would wrongly fail: skipped there (exit code 77).
add_test(NAME unit_cuda.cuda_no_device COMMAND bash -c
  "if [ -e /dev/nvidia0 ]; then echo 'SKIP: a GPU is attached'; exit 77; fi; exec \"$0\" --test-suite=cuda_no_device"
  $<TARGET_FILE:unit_cuda>)
set_tests_properties(unit_cuda.cuda_no_device PROPERTIES TIMEOUT 60 SKIP_RETURN_CODE 77)
add_test(NAME gpus.no_device_job COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/gpus_no_device.sh
  $<TARGET_FILE:trainrun> ${CMAKE_CURRENT_BINARY_DIR}/work/gpus-no-device)
set_tests_properties(gpus.no_device_job PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
