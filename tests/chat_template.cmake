# Chat templates (issue 22): doctest units of the Jinja engine and the loader, and the equality
# test against transformers' apply_chat_template (jinja2) on the fixture tokenizers' templates,
# SmolLM2's, the built-ins and one small template per Jinja feature.
if(NOT TARGET trainrun_text)
  return()
endif()
find_package(doctest REQUIRED)

add_executable(unit_chat_template ${CMAKE_CURRENT_LIST_DIR}/unit/unit_chat_template.cpp)
target_link_libraries(unit_chat_template PRIVATE trainrun_text doctest::doctest)
target_include_directories(unit_chat_template PRIVATE ${PROJECT_SOURCE_DIR}/text/src)
target_compile_definitions(unit_chat_template PRIVATE
  TRAINRUN_TOKENIZER_FIXTURES="${CMAKE_SOURCE_DIR}/../shared/fixtures/tokenizers")
foreach(suite syntax values render errors loader builtins limits)
  add_test(NAME unit_chat_template.${suite} COMMAND unit_chat_template --test-suite=${suite})
  set_tests_properties(unit_chat_template.${suite} PROPERTIES TIMEOUT 60 LABELS chat_template)
endforeach()

add_executable(chat_template_render ${CMAKE_CURRENT_LIST_DIR}/tools/chat_template_render.cpp)
target_link_libraries(chat_template_render PRIVATE trainrun_text)

add_test(NAME chat_template_reference
  COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/chat_template_reference.py
          --render $<TARGET_FILE:chat_template_render>
          --fixtures ${CMAKE_SOURCE_DIR}/../shared/fixtures/tokenizers
          --work ${CMAKE_CURRENT_BINARY_DIR}/work/chat_template)
set_tests_properties(chat_template_reference PROPERTIES TIMEOUT 300 LABELS chat_template
  ENVIRONMENT "HF_HUB_OFFLINE=1;TRANSFORMERS_OFFLINE=1;TOKENIZERS_PARALLELISM=false")

add_test(NAME chat_template_cli
  COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/chat_template_reference.py
          --render $<TARGET_FILE:chat_template_render> --trainrun $<TARGET_FILE:trainrun>
          --fixtures ${CMAKE_SOURCE_DIR}/../shared/fixtures/tokenizers
          --work ${CMAKE_CURRENT_BINARY_DIR}/work/chat_template_cli)
set_tests_properties(chat_template_cli PROPERTIES TIMEOUT 120 LABELS chat_template
  ENVIRONMENT "HF_HUB_OFFLINE=1;TRANSFORMERS_OFFLINE=1;TOKENIZERS_PARALLELISM=false")

# The chat-template budget (issue 50): the hostile corpus of the chat_template fuzz target ends at
# a limit (exit 2, file, line, limit) within 2 s of CPU and 300 MB through `trainrun
# chat-template`; the overrides reach the engine; the real templates use under 1/100 of each limit.
add_test(NAME chat_template_limits
  COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/template_limits.py
          --trainrun $<TARGET_FILE:trainrun> --render $<TARGET_FILE:chat_template_render>
          --fixtures ${CMAKE_SOURCE_DIR}/../shared/fixtures/tokenizers
          --corpus ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/chat_template
          --work ${CMAKE_CURRENT_BINARY_DIR}/work/chat_template_limits)
set_tests_properties(chat_template_limits PROPERTIES TIMEOUT 300 LABELS chat_template
  ENVIRONMENT "HF_HUB_OFFLINE=1;TRANSFORMERS_OFFLINE=1;TOKENIZERS_PARALLELISM=false")
