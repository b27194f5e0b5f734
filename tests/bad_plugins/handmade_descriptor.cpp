// A plugin whose descriptor is written by hand instead of by TRAINRUN_PLUGIN, so that the
// fields the SDK normally stamps can be wrong on purpose. Compiled once per case with:
//   BAD_PLUGIN_NAME, BAD_COMPONENT_NAME   (string literals)
//   BAD_ABI_MAJOR, BAD_ABI_MINOR           (default: the SDK's)
//   BAD_TORCH_VERSION                      (default: the LibTorch it is built against)
//   BAD_NULL_COMPONENTS                    components = nullptr with num_components = 1
//   BAD_DANGLING_COMPONENTS                components = a wild pointer, num_components = 3
//                                          (what a plugin for another ABI major whose
//                                          descriptor is laid out differently looks like)
//   BAD_STRUCT_SIZE                        struct_size (default: the real size)
//   BAD_CXX11_ABI                          cxx11_abi flipped (a plugin built with the other
//                                          libstdc++ string ABI)
//   BAD_TORCH_ANCHOR                       torch_anchor pointing into this plugin instead of
//                                          LibTorch (what a second copy of LibTorch looks like)
//   BAD_ENTRY_THROWS, BAD_ENTRY_NULL       the entry point throws / returns no descriptor
//   BAD_DECLARE_THROWS                     the component's options declaration throws
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
#ifndef BAD_STRUCT_SIZE
#define BAD_STRUCT_SIZE sizeof(trainrun_plugin_descriptor_v1)
#endif
#ifdef BAD_CXX11_ABI
#define BAD_CXX11_ABI_VALUE (1 - _GLIBCXX_USE_CXX11_ABI)
#else
#define BAD_CXX11_ABI_VALUE _GLIBCXX_USE_CXX11_ABI
#endif

#include <stdexcept>

namespace {
// Stands in for LibTorch's c10::GetCPUAllocator as a second copy of LibTorch would resolve it: an
// address that is not the one trainrun's LibTorch has.
[[maybe_unused]] void not_the_torch_allocator() {}

#ifdef BAD_DECLARE_THROWS
class ThrowingOptionsModel : public trainrun_test::TinyModel {
 public:
  using TinyModel::TinyModel;
  static void declare_options(trainrun::v1::OptionSchema&) {
    throw std::runtime_error("option table not ready");
  }
};
using ComponentModel = ThrowingOptionsModel;
#else
using ComponentModel = trainrun_test::TinyModel;
#endif
}  // namespace

#ifdef BAD_TORCH_ANCHOR
#define BAD_ANCHOR reinterpret_cast<const void*>(&not_the_torch_allocator)
#else
#define BAD_ANCHOR reinterpret_cast<const void*>(&::c10::GetCPUAllocator)
#endif

extern "C" __attribute__((visibility("default"))) const trainrun_plugin_descriptor_v1*
trainrun_plugin_entry(void) {
#if defined(BAD_ENTRY_THROWS)
  throw std::runtime_error("cannot initialise: licence file missing");
#elif defined(BAD_ENTRY_NULL)
  return nullptr;
#else
  [[maybe_unused]] static const trainrun_component_v1 components[] = {
      trainrun::v1::component<trainrun::v1::Model, ComponentModel>(
          BAD_COMPONENT_NAME, "test plugin with a deliberately wrong descriptor")};
  static const trainrun_plugin_descriptor_v1 descriptor = {
      static_cast<uint32_t>(BAD_STRUCT_SIZE),
      BAD_ABI_MAJOR,
      BAD_ABI_MINOR,
      BAD_TORCH_VERSION,
      BAD_CXX11_ABI_VALUE,
      TRAINRUN_BUILD_COMPILER_ID,
      BAD_PLUGIN_NAME,
      "0.0.1",
      BAD_ANCHOR,
      BAD_NUM_COMPONENTS,
      BAD_COMPONENTS};
  return &descriptor;
#endif
}
