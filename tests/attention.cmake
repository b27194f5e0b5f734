# trainrun::v1::attention (sdk trainrun/model/attention.hpp): its masking semantics on every
# LibTorch, and on LibTorch >= 2.1 the fused scaled_dot_product_attention path against the explicit
# math.
find_package(doctest REQUIRED)

add_executable(unit_attention ${CMAKE_CURRENT_SOURCE_DIR}/unit/unit_attention.cpp)
target_link_libraries(unit_attention PRIVATE TrainrunSDK::sdk doctest::doctest)
trainrun_use_pch(unit_attention)
set(_attention_suites attention_semantics)
if(Torch_VERSION VERSION_GREATER_EQUAL 2.1)
  list(APPEND _attention_suites attention_sdpa)
endif()
foreach(suite ${_attention_suites})
  add_test(NAME unit_attention.${suite} COMMAND unit_attention --test-suite=${suite})
  set_tests_properties(unit_attention.${suite} PROPERTIES TIMEOUT 60
    ENVIRONMENT "OMP_NUM_THREADS=1")
endforeach()
