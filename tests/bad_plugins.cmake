# Plugin-runtime failure tests: plugins that are broken on purpose, and CTest cases proving the
# loader refuses each one with a precise message (exit code 2 when it is named explicitly or a
# job needs its component, a warning otherwise) and never crashes.
#
# Every case is built into its own directory, ${CMAKE_BINARY_DIR}/test-plugins/<case>/, so it
# can be put on --plugin-path alone. None of them is installed.
set(_bad_src ${CMAKE_CURRENT_SOURCE_DIR}/bad_plugins)
set(_bad_out ${CMAKE_BINARY_DIR}/test-plugins)
set(_expect ${CMAKE_CURRENT_SOURCE_DIR}/tools/expect.sh)
set(_jobs ${CMAKE_CURRENT_SOURCE_DIR}/e2e/jobs)
set(_runs ${CMAKE_CURRENT_BINARY_DIR}/runs)
set(_trainrun $<TARGET_FILE:trainrun>)

# trainrun_test_plugin(<target> <case-dir> SOURCES ... [DEFINITIONS ...]): a plugin built with
# the SDK's own function (so it is normal in every way but the one under test).
function(trainrun_test_plugin target case)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEFINITIONS" ${ARGN})
  trainrun_add_plugin(${target} SOURCES ${ARG_SOURCES} NO_INSTALL)
  set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${_bad_out}/${case})
  if(ARG_DEFINITIONS)
    target_compile_definitions(${target} PRIVATE ${ARG_DEFINITIONS})
  endif()
endfunction()

trainrun_test_plugin(bad-abi-major abi-major SOURCES ${_bad_src}/handmade_descriptor.cpp
  DEFINITIONS BAD_ABI_MAJOR=99 BAD_ABI_MINOR=0
              BAD_PLUGIN_NAME="bad-abi-major" BAD_COMPONENT_NAME="abi99-net")
# One minor newer than this SDK's, whatever that is (it was a fixed 7 until the SDK reached 1.7).
math(EXPR _newer_minor "${TRAINRUN_ABI_MINOR} + 1")
trainrun_test_plugin(bad-abi-minor abi-minor SOURCES ${_bad_src}/handmade_descriptor.cpp
  DEFINITIONS BAD_ABI_MINOR=${_newer_minor} BAD_PLUGIN_NAME="bad-abi-minor" BAD_COMPONENT_NAME="abi-minor-newer-net")
trainrun_test_plugin(bad-torch-version torch-version SOURCES ${_bad_src}/handmade_descriptor.cpp
  DEFINITIONS BAD_TORCH_VERSION="1.12.1"
              BAD_PLUGIN_NAME="bad-torch-version" BAD_COMPONENT_NAME="torch1121-net")
trainrun_test_plugin(bad-null-components null-components
  SOURCES ${_bad_src}/handmade_descriptor.cpp
  DEFINITIONS BAD_TORCH_VERSION="1.12.1" BAD_NULL_COMPONENTS
              BAD_PLUGIN_NAME="bad-null-components" BAD_COMPONENT_NAME="unused")
trainrun_test_plugin(bad-abi-major-layout abi-major-layout
  SOURCES ${_bad_src}/handmade_descriptor.cpp
  DEFINITIONS BAD_ABI_MAJOR=2 BAD_DANGLING_COMPONENTS
              BAD_PLUGIN_NAME="bad-abi-major-layout" BAD_COMPONENT_NAME="unused")
trainrun_test_plugin(bad-exploding exploding SOURCES ${_bad_src}/exploding.cpp)
trainrun_test_plugin(bad-duplicate-a duplicate-a SOURCES ${_bad_src}/duplicate.cpp
  DEFINITIONS DUP_COMPONENT_NAME="dup-first")
trainrun_test_plugin(bad-duplicate-b duplicate-b SOURCES ${_bad_src}/duplicate.cpp
  DEFINITIONS DUP_COMPONENT_NAME="dup-second")

trainrun_test_plugin(bad-struct-size struct-size SOURCES ${_bad_src}/handmade_descriptor.cpp
  DEFINITIONS BAD_STRUCT_SIZE=16 BAD_PLUGIN_NAME="bad-struct-size" BAD_COMPONENT_NAME="short-net")
trainrun_test_plugin(bad-cxx11-abi cxx11-abi SOURCES ${_bad_src}/handmade_descriptor.cpp
  DEFINITIONS BAD_CXX11_ABI BAD_PLUGIN_NAME="bad-cxx11-abi" BAD_COMPONENT_NAME="cxxabi-net")
trainrun_test_plugin(bad-torch-copy torch-copy SOURCES ${_bad_src}/handmade_descriptor.cpp
  DEFINITIONS BAD_TORCH_ANCHOR BAD_PLUGIN_NAME="bad-torch-copy" BAD_COMPONENT_NAME="copy-net")
trainrun_test_plugin(bad-entry-throws entry-throws SOURCES ${_bad_src}/handmade_descriptor.cpp
  DEFINITIONS BAD_ENTRY_THROWS BAD_PLUGIN_NAME="bad-entry-throws" BAD_COMPONENT_NAME="unused")
trainrun_test_plugin(bad-entry-null entry-null SOURCES ${_bad_src}/handmade_descriptor.cpp
  DEFINITIONS BAD_ENTRY_NULL BAD_PLUGIN_NAME="bad-entry-null" BAD_COMPONENT_NAME="unused")
trainrun_test_plugin(bad-declare-throws declare-throws SOURCES ${_bad_src}/handmade_descriptor.cpp
  DEFINITIONS BAD_DECLARE_THROWS BAD_PLUGIN_NAME="bad-declare-throws" BAD_COMPONENT_NAME="declare-net")

# A plugin whose dependency is missing: dep.cpp's library carries the SONAME
# libtrainrun-test-absent.so (no CMake-made SONAME), which the plugin records as needed and
# which no file is named.
add_library(bad-dep SHARED ${_bad_src}/dep.cpp)
set_target_properties(bad-dep PROPERTIES NO_SONAME ON OUTPUT_NAME trainrun-test-dep
  LIBRARY_OUTPUT_DIRECTORY ${_bad_out}/dep-lib)
target_link_options(bad-dep PRIVATE "-Wl,-soname,libtrainrun-test-absent.so")
trainrun_test_plugin(bad-missing-dep missing-dep SOURCES ${_bad_src}/missing_dep.cpp)
target_link_libraries(bad-missing-dep PRIVATE bad-dep)

# An ordinary shared library: no trainrun headers, no entry symbol.
add_library(bad-not-a-plugin SHARED ${_bad_src}/not_a_plugin.cpp)
set_target_properties(bad-not-a-plugin PROPERTIES
  OUTPUT_NAME not-a-plugin LIBRARY_OUTPUT_DIRECTORY ${_bad_out}/not-a-plugin)

# A complete descriptor behind the wrong symbol name, built without trainrun_add_plugin (whose
# version script would hide the misnamed symbol).
add_library(bad-entry-v2 MODULE ${_bad_src}/entry_v2.cpp)
target_link_libraries(bad-entry-v2 PRIVATE TrainrunSDK::sdk)
trainrun_plugin_stamp(bad-entry-v2 PRIVATE)
set_target_properties(bad-entry-v2 PROPERTIES
  PREFIX "libtrainrun-" OUTPUT_NAME entry-v2 LIBRARY_OUTPUT_DIRECTORY ${_bad_out}/entry-v2)
trainrun_use_pch(bad-entry-v2)

set(_bad_targets bad-abi-major bad-abi-minor bad-null-components bad-abi-major-layout bad-torch-version bad-exploding bad-duplicate-a
                 bad-duplicate-b bad-not-a-plugin bad-entry-v2 bad-struct-size bad-cxx11-abi
                 bad-torch-copy bad-entry-throws bad-entry-null bad-declare-throws bad-missing-dep)
add_custom_target(bad_plugins DEPENDS ${_bad_targets})

# Corrupt files are made at test time (a fixture), from a real plugin.
add_test(NAME bad_plugins_make_corrupt
  COMMAND sh -c "set -e
    rm -rf '${_bad_out}/corrupt-truncated' '${_bad_out}/corrupt-text' '${_bad_out}/corrupt-empty'
    mkdir -p '${_bad_out}/corrupt-truncated' '${_bad_out}/corrupt-text' '${_bad_out}/corrupt-empty'
    head -c 3000 '$<TARGET_FILE:cpu>' > '${_bad_out}/corrupt-truncated/libtrainrun-truncated.so'
    printf 'this is a text file, not an ELF shared object\\n' > '${_bad_out}/corrupt-text/libtrainrun-text.so'
    : > '${_bad_out}/corrupt-empty/libtrainrun-empty.so'")
set_tests_properties(bad_plugins_make_corrupt PROPERTIES FIXTURES_SETUP corrupt_plugins TIMEOUT 60)

# bad_plugin_test(<name> <exit-code> <regex>... -- <trainrun args>...)
function(bad_plugin_test name)
  add_test(NAME ${name} COMMAND ${_expect} ${ARGN})
  set_tests_properties(${name} PROPERTIES TIMEOUT 60 LABELS bad_plugins)
endfunction()

set(_f ${_bad_out}/abi-major/libtrainrun-bad-abi-major.so)
# Named explicitly: a hard error with the exact check that failed.
bad_plugin_test(bad_plugin_abi_major_file 2
  "plugin ${_f}: built for ABI 99\\.0, this trainrun supports ABI 1\\.${TRAINRUN_ABI_MINOR}"
  -- ${_trainrun} plugins --plugin-path ${_f})
# In a directory: a warning, and the other plugins still load.
bad_plugin_test(bad_plugin_abi_major_dir 0
  "warning: plugin ${_f}: built for ABI 99\\.0, this trainrun supports ABI 1\\.${TRAINRUN_ABI_MINOR}.*skipped"
  "skipped: ${_f}" "mlp +model" "!abi99-net +model"
  -- ${_trainrun} plugins --plugin-path ${_bad_out}/abi-major)
# A job that names its component fails with the reason. (Whether the loader may read the
# component list of a descriptor from another ABI major is open, so both "cannot be used: <reason>"
# and "unknown ...; skipped plugin files: <file>: <reason>" are accepted.)
bad_plugin_test(bad_plugin_abi_major_job 2
  "model plugin 'abi99-net'" "${_f}: built for ABI 99\\.0, this trainrun supports ABI 1\\.${TRAINRUN_ABI_MINOR}"
  -- ${_trainrun} check --config ${_jobs}/mlp_idx.toml --set model.plugin=abi99-net
     --plugin-path ${_bad_out}/abi-major)

set(_f ${_bad_out}/abi-minor/libtrainrun-bad-abi-minor.so)
bad_plugin_test(bad_plugin_abi_minor_file 2
  "plugin ${_f}: built for ABI 1\\.${_newer_minor}, this trainrun supports ABI 1\\.${TRAINRUN_ABI_MINOR} \\(major must match, minor must not be newer\\)"
  -- ${_trainrun} plugins --plugin-path ${_f})
bad_plugin_test(bad_plugin_abi_minor_job 2
  "model plugin 'abi-minor-newer-net' cannot be used: plugin ${_f}: built for ABI 1\\.${_newer_minor}"
  -- ${_trainrun} check --config ${_jobs}/mlp_idx.toml --set model.plugin=abi-minor-newer-net
     --plugin-path ${_bad_out}/abi-minor)

set(_f ${_bad_out}/torch-version/libtrainrun-bad-torch-version.so)
bad_plugin_test(bad_plugin_torch_version_file 2
  "plugin ${_f}: built for LibTorch 1\\.12\\.1, this trainrun uses LibTorch ${Torch_VERSION}"
  -- ${_trainrun} plugins --plugin-path ${_f})
bad_plugin_test(bad_plugin_torch_version_job 2
  "model plugin 'torch1121-net' cannot be used: plugin ${_f}: built for LibTorch 1\\.12\\.1"
  -- ${_trainrun} check --config ${_jobs}/mlp_idx.toml --set model.plugin=torch1121-net
     --plugin-path ${_bad_out}/torch-version)

set(_f ${_bad_out}/not-a-plugin/libnot-a-plugin.so)
bad_plugin_test(bad_plugin_not_a_plugin_file 2
  "error: plugin ${_f}: not a trainrun plugin: it exports no 'trainrun_plugin_entry' symbol$"
  "!not a loadable shared object"
  -- ${_trainrun} plugins --plugin-path ${_f})
bad_plugin_test(bad_plugin_not_a_plugin_dir 0
  "warning: plugin ${_f}: not a trainrun plugin.*skipped" "mlp +model"
  -- ${_trainrun} plugins --plugin-path ${_bad_out}/not-a-plugin)

set(_f ${_bad_out}/entry-v2/libtrainrun-entry-v2.so)
bad_plugin_test(bad_plugin_entry_v2_file 2
  "error: plugin ${_f}: not a trainrun plugin: it exports no 'trainrun_plugin_entry' symbol$"
  "!not a loadable shared object"
  -- ${_trainrun} plugins --plugin-path ${_f})
# Its components are unknowable (no entry point is ever called), so a job naming one gets
# "unknown" plus the list of skipped files with their reasons.
bad_plugin_test(bad_plugin_entry_v2_job 2
  "unknown model plugin 'entry-v2-net'"
  "skipped plugin files:" "${_f}: not a trainrun plugin"
  -- ${_trainrun} check --config ${_jobs}/mlp_idx.toml --set model.plugin=entry-v2-net
     --plugin-path ${_bad_out}/entry-v2)

foreach(c truncated text empty)
  set(_f ${_bad_out}/corrupt-${c}/libtrainrun-${c}.so)
  bad_plugin_test(bad_plugin_corrupt_${c}_file 2
    "plugin ${_f}: not a loadable shared object"
    -- ${_trainrun} plugins --plugin-path ${_f})
  bad_plugin_test(bad_plugin_corrupt_${c}_dir 0
    "warning: plugin ${_f}: not a loadable shared object.*skipped" "mlp +model"
    -- ${_trainrun} plugins --plugin-path ${_bad_out}/corrupt-${c})
  set_tests_properties(bad_plugin_corrupt_${c}_file bad_plugin_corrupt_${c}_dir
    PROPERTIES FIXTURES_REQUIRED corrupt_plugins)
endforeach()

# A factory that throws: the training job stops with exit 2 and an error naming the plugin,
# its file, the component and the exception's text.
set(_f ${_bad_out}/exploding/libtrainrun-bad-exploding.so)
bad_plugin_test(bad_plugin_factory_throws 2
  "model 'exploding' \\(plugin bad-exploding, ${_f}\\): create failed: boom: weights file missing"
  -- ${_trainrun} --config ${_jobs}/exploding.toml --set trainer.run_dir=${_runs}/exploding
     --plugin-path ${_bad_out}/exploding)

# A factory that throws something other than a std::exception: still exit 2 and the plugin
# named, never std::terminate.
bad_plugin_test(bad_plugin_factory_throws_non_std 2
  "model 'exploding-nonstd' \\(plugin bad-exploding, ${_f}\\): create failed"
  -- ${_trainrun} --config ${_jobs}/exploding.toml --set model.plugin=exploding-nonstd
     --set trainer.run_dir=${_runs}/exploding-nonstd --plugin-path ${_bad_out}/exploding)

# Malformed descriptors: the loader must reject them from the fields it can trust and never
# dereference a pointer it has no reason to trust.
set(_f ${_bad_out}/null-components/libtrainrun-bad-null-components.so)
bad_plugin_test(bad_plugin_null_components 0
  "warning: plugin ${_f}: built for LibTorch 1\\.12\\.1, this trainrun uses LibTorch ${Torch_VERSION} \\(skipped\\)"
  -- ${_trainrun} plugins --plugin-path ${_bad_out}/null-components)
set(_f ${_bad_out}/abi-major-layout/libtrainrun-bad-abi-major-layout.so)
bad_plugin_test(bad_plugin_abi_major_layout 0
  "warning: plugin ${_f}: built for ABI 2\\.${TRAINRUN_ABI_MINOR}, this trainrun supports ABI 1\\.${TRAINRUN_ABI_MINOR}.*skipped"
  -- ${_trainrun} plugins --plugin-path ${_bad_out}/abi-major-layout)

# The loader's other refusals, each named explicitly (exit 2, the check that failed) and in a
# directory (a warning; the shipped plugins still load).
foreach(case
    "struct-size|bad-struct-size|descriptor is 16 bytes, at least [0-9]+ expected"
    "cxx11-abi|bad-cxx11-abi|built with _GLIBCXX_USE_CXX11_ABI=[01], this trainrun uses _GLIBCXX_USE_CXX11_ABI=[01]"
    "torch-copy|bad-torch-copy|resolves LibTorch to a different copy than this trainrun \\(two LibTorch libraries in one process\\)"
    "entry-throws|bad-entry-throws|entry point threw: cannot initialise: licence file missing"
    "entry-null|bad-entry-null|entry point returned no descriptor"
    "declare-throws|bad-declare-throws|component 'declare-net' failed to declare its options: option table not ready"
    "missing-dep|bad-missing-dep|could not be loaded: .*libtrainrun-test-absent\\.so")
  string(REPLACE "|" ";" case "${case}")
  list(GET case 0 _dir)
  list(GET case 1 _target)
  list(GET case 2 _why)
  set(_f ${_bad_out}/${_dir}/libtrainrun-${_target}.so)
  bad_plugin_test(bad_plugin_${_dir}_file 2 "error: plugin ${_f}: ${_why}"
    -- ${_trainrun} plugins --plugin-path ${_f})
  bad_plugin_test(bad_plugin_${_dir}_dir 0 "warning: plugin ${_f}: ${_why}.*skipped" "mlp +model"
    -- ${_trainrun} plugins --plugin-path ${_bad_out}/${_dir})
endforeach()
# A job naming a component of a refused plugin gets the reason.
bad_plugin_test(bad_plugin_cxx11_abi_job 2
  "model plugin 'cxxabi-net' cannot be used: plugin ${_bad_out}/cxx11-abi/libtrainrun-bad-cxx11-abi.so: built with _GLIBCXX_USE_CXX11_ABI"
  -- ${_trainrun} check --config ${_jobs}/mlp_idx.toml --set model.plugin=cxxabi-net
     --plugin-path ${_bad_out}/cxx11-abi)

# The same plugin name in two directories: the first on the path wins, the warning names both.
set(_a ${_bad_out}/duplicate-a/libtrainrun-bad-duplicate-a.so)
set(_b ${_bad_out}/duplicate-b/libtrainrun-bad-duplicate-b.so)
bad_plugin_test(bad_plugin_duplicate_name 0
  "warning: plugin 'bad-duplicate' found twice: using ${_a}, ignoring ${_b}"
  "dup-first +callback +bad-duplicate" "!dup-second"
  -- ${_trainrun} plugins --plugin-path ${_bad_out}/duplicate-a --plugin-path ${_bad_out}/duplicate-b)
bad_plugin_test(bad_plugin_duplicate_name_reversed 0
  "warning: plugin 'bad-duplicate' found twice: using ${_b}, ignoring ${_a}"
  "dup-second +callback +bad-duplicate" "!dup-first"
  -- ${_trainrun} plugins --plugin-path ${_bad_out}/duplicate-b --plugin-path ${_bad_out}/duplicate-a)

# Every broken plugin on the path at once: a job that needs none of them still trains.
set(_all)
foreach(c abi-major abi-minor torch-version not-a-plugin entry-v2 corrupt-truncated corrupt-text
          corrupt-empty exploding duplicate-a duplicate-b null-components abi-major-layout
          struct-size cxx11-abi torch-copy entry-throws entry-null declare-throws missing-dep)
  list(APPEND _all --plugin-path ${_bad_out}/${c})
endforeach()
bad_plugin_test(bad_plugins_good_job_still_trains 0
  "built for ABI 99\\.0.*skipped" "built for ABI 1\\.${_newer_minor}.*skipped" "built for LibTorch 1\\.12\\.1.*skipped"
  "final eval: .* after 4 steps"
  -- ${_trainrun} --config ${_jobs}/mlp_idx.toml --set trainer.run_dir=${_runs}/good_job ${_all})
set_tests_properties(bad_plugins_good_job_still_trains PROPERTIES FIXTURES_REQUIRED corrupt_plugins)
