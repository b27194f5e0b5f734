# trainrun_add_plugin(<name> SOURCES <src>... [LIBRARIES <lib>...] [INCLUDE_DIRS <dir>...]
#                     [NO_INSTALL])
# (In-tree plugins give LIBRARIES <name>-objects and no SOURCES; see the top-level CMakeLists.)
#
# Builds a trainrun plugin: a MODULE library named libtrainrun-<name>.so that exports only the
# entry symbol (linker version script), compiled against the same LibTorch as the core and
# stamped with the LibTorch version and compiler the loader checks. Used for every in-tree
# plugin and by third parties after find_package(TrainrunSDK).
#
# NO_INSTALL: add no install rule (test-only plugins that must never reach an install tree).
#
# Variables read:
#   TRAINRUN_PLUGIN_OUTPUT_DIR  where the .so is written (default: the current binary dir)
#   TRAINRUN_PLUGIN_INSTALL_DIR install destination (default: lib/trainrun/plugins)
#   TRAINRUN_PCH_TARGET         in-tree only: a target whose precompiled header is reused
set(_TRAINRUN_SDK_CMAKE_DIR "${CMAKE_CURRENT_LIST_DIR}")

# trainrun_plugin_stamp(<target> <PRIVATE|PUBLIC|INTERFACE>): the LibTorch version and compiler
# that TRAINRUN_PLUGIN writes into the descriptor and the loader compares with its own.
function(trainrun_plugin_stamp target scope)
  target_compile_definitions(${target} ${scope}
    TRAINRUN_BUILD_TORCH_VERSION="${Torch_VERSION}"
    TRAINRUN_BUILD_COMPILER_ID="${CMAKE_CXX_COMPILER_ID}-${CMAKE_CXX_COMPILER_VERSION}")
endfunction()

function(trainrun_add_plugin name)
  cmake_parse_arguments(ARG "NO_INSTALL" "" "SOURCES;LIBRARIES;INCLUDE_DIRS" ${ARGN})
  # In-tree plugins give only LIBRARIES: an object library that holds their sources and entry
  # symbol (trainrun_add_plugin_objects in the top-level CMakeLists.txt).
  if(NOT ARG_SOURCES AND NOT ARG_LIBRARIES)
    message(FATAL_ERROR "trainrun_add_plugin(${name}): SOURCES is required")
  endif()
  if(NOT DEFINED Torch_VERSION)
    message(FATAL_ERROR "trainrun_add_plugin(${name}): LibTorch not found (find_package(Torch))")
  endif()
  add_library(${name} MODULE ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE TrainrunSDK::sdk ${ARG_LIBRARIES})
  if(ARG_INCLUDE_DIRS)
    target_include_directories(${name} PRIVATE ${ARG_INCLUDE_DIRS})
  endif()
  trainrun_plugin_stamp(${name} PRIVATE)
  target_compile_features(${name} PRIVATE cxx_std_17)
  set_target_properties(${name} PROPERTIES
    PREFIX "libtrainrun-"
    DEFINE_SYMBOL ""
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    POSITION_INDEPENDENT_CODE ON)
  target_link_options(${name} PRIVATE
    "-Wl,--version-script=${_TRAINRUN_SDK_CMAKE_DIR}/trainrun_plugin.map"
    "-Wl,--no-undefined")
  if(TRAINRUN_PLUGIN_OUTPUT_DIR)
    set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${TRAINRUN_PLUGIN_OUTPUT_DIR}")
  endif()
  if(TRAINRUN_PCH_TARGET AND TARGET ${TRAINRUN_PCH_TARGET})
    target_precompile_headers(${name} REUSE_FROM ${TRAINRUN_PCH_TARGET})
  endif()
  if(ARG_NO_INSTALL)
    return()
  endif()
  # Collected so a project can build "the program and its plugins" without its tests.
  set_property(GLOBAL APPEND PROPERTY TRAINRUN_PLUGIN_TARGETS ${name})
  if(NOT DEFINED TRAINRUN_PLUGIN_INSTALL_DIR)
    set(TRAINRUN_PLUGIN_INSTALL_DIR lib/trainrun/plugins)
  endif()
  install(TARGETS ${name} LIBRARY DESTINATION "${TRAINRUN_PLUGIN_INSTALL_DIR}")
endfunction()
