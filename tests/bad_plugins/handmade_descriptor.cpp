// A plugin whose descriptor is written by hand instead of by TRAINRUN_PLUGIN, so that the
// fields the SDK normally stamps can be wrong on purpose. Compiled once per case with:
//   BAD_PLUGIN_NAME, BAD_COMPONENT_NAME   (string literals)
//   BAD_ABI_MAJOR, BAD_ABI_MINOR           (default: the SDK's)
//   BAD_TORCH_VERSION                      (default: the LibTorch it is built against)
//   BAD_NULL_COMPONENTS                    components = nullptr with num_components = 1
//   BAD_DANGLING_COMPONENTS                components = a wild pointer, num_components = 3
//                                          (what a plugin for another ABI major whose
//                                          descriptor is laid out differently looks like)
#include <trainrun/trainrun.hpp>

#include "tiny_model.hpp"

#ifndef BAD_ABI_MAJOR
#define BAD_ABI_MAJOR ::trainrun::v1::kAbiMajor
#endif
#ifndef BAD_ABI_MINOR
#define BAD_ABI_MINOR ::trainrun::v1::kAbiMinor
#endif
#if defined(BAD_NULL_COMPONENTS)
#define BAD_COMPONENTS nullptr
#define BAD_NUM_COMPONENTS 1
#elif defined(BAD_DANGLING_COMPONENTS)
#define BAD_COMPONENTS reinterpret_cast<const trainrun_component_v1*>(uintptr_t{16})
#define BAD_NUM_COMPONENTS 3
#else
#define BAD_COMPONENTS components
#define BAD_NUM_COMPONENTS 1
#endif
#ifndef BAD_TORCH_VERSION
#define BAD_TORCH_VERSION TRAINRUN_BUILD_TORCH_VERSION
#endif

extern "C" __attribute__((visibility("default"))) const trainrun_plugin_descriptor_v1*
trainrun_plugin_entry(void) {
  [[maybe_unused]] static const trainrun_component_v1 components[] = {
      trainrun::v1::component<trainrun::v1::Model, trainrun_test::TinyModel>(
          BAD_COMPONENT_NAME, "test plugin with a deliberately wrong descriptor")};
  static const trainrun_plugin_descriptor_v1 descriptor = {
      sizeof(trainrun_plugin_descriptor_v1),
      BAD_ABI_MAJOR,
      BAD_ABI_MINOR,
      BAD_TORCH_VERSION,
      _GLIBCXX_USE_CXX11_ABI,
      TRAINRUN_BUILD_COMPILER_ID,
      BAD_PLUGIN_NAME,
      "0.0.1",
      reinterpret_cast<const void*>(&::c10::GetCPUAllocator),
      BAD_NUM_COMPONENTS,
      BAD_COMPONENTS};
  return &descriptor;
}
