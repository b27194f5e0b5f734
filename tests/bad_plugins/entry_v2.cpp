// A plausible mistake: a complete descriptor, but exported under the wrong symbol name
// (trainrun_plugin_entry_v2), without the SDK's macro or version script.
#include <trainrun/trainrun.hpp>

#include "tiny_model.hpp"

extern "C" __attribute__((visibility("default"))) const trainrun_plugin_descriptor_v1*
trainrun_plugin_entry_v2(void) {
  static const trainrun_component_v1 components[] = {
      trainrun::v1::component<trainrun::v1::Model, trainrun_test::TinyModel>(
          "entry-v2-net", "test model behind a misnamed entry symbol")};
  static const trainrun_plugin_descriptor_v1 descriptor = {
      sizeof(trainrun_plugin_descriptor_v1),
      ::trainrun::v1::kAbiMajor,
      ::trainrun::v1::kAbiMinor,
      TRAINRUN_BUILD_TORCH_VERSION,
      _GLIBCXX_USE_CXX11_ABI,
      TRAINRUN_BUILD_COMPILER_ID,
      "bad-entry-v2",
      "0.0.1",
      reinterpret_cast<const void*>(&::c10::GetCPUAllocator),
      1,
      components};
  return &descriptor;
}
