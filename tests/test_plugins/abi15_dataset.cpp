// A dataset plugin as built against ABI 1.5, before Batch gained position_ids and segment_ids
// (ABI 1.6): its Batch ends after num_tokens, and its descriptor says 1.5. The core must receive
// its batches in that layout (tests/chat.cmake, chat.abi15_dataset); read as a 1.6 Batch, the
// two appended tensors would be whatever lay in the caller's stack.
#include <trainrun/trainrun.hpp>

#include <torch/types.h>
#include <torch/utils.h>

namespace {
using namespace trainrun::v1;

// Batch and Dataset as ABI 1.0-1.5 declared them.
struct BatchAbi15 {
  at::Tensor input;
  at::Tensor target;
  int64_t num_samples = 0;
  int64_t num_targets = 0;
  int64_t num_tokens = 0;
};
class DatasetAbi15 {
 public:
  virtual ~DatasetAbi15() = default;
  virtual DataInfo info() const = 0;
  virtual int64_t size(Split split) const = 0;
  virtual BatchAbi15 batch(Split split, const std::vector<int64_t>& indices) = 0;
};

constexpr int64_t kT = 16;

// Sample i: tokens (i * 7 + t) % 251, t = 0..T, as input/target windows.
class OldBytes final : public DatasetAbi15 {
 public:
  DataInfo info() const override { return {"language_modeling", {kT}, 0, 256}; }
  int64_t size(Split split) const override { return split == Split::Train ? 64 : 8; }
  BatchAbi15 batch(Split split, const std::vector<int64_t>& indices) override {
    const int64_t B = static_cast<int64_t>(indices.size()), off = split == Split::Train ? 0 : 1000;
    torch::Tensor w = torch::empty({B, kT + 1}, torch::kLong);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t <= kT; ++t) w[b][t] = ((indices[b] + off) * 7 + t) % 251;
    BatchAbi15 out;
    out.input = w.narrow(1, 0, kT).contiguous();
    out.target = w.narrow(1, 1, kT).contiguous();
    out.num_samples = B;
    out.num_targets = out.num_tokens = B * kT;
    return out;
  }
};

void declare(OptionSchema*) {}
void* create(const Options*, const RunContext*) { return static_cast<void*>(static_cast<DatasetAbi15*>(new OldBytes)); }
}  // namespace

extern "C" __attribute__((visibility("default"))) const trainrun_plugin_descriptor_v1*
trainrun_plugin_entry(void) {
  static const trainrun_component_v1 components[] = {
      {sizeof(trainrun_component_v1), static_cast<uint32_t>(ComponentKind::Dataset), "abi15-bytes",
       "test dataset with the ABI 1.5 Batch layout", &declare, &create}};
  static const trainrun_plugin_descriptor_v1 descriptor = {
      sizeof(trainrun_plugin_descriptor_v1), kAbiMajor, 5, TRAINRUN_BUILD_TORCH_VERSION, _GLIBCXX_USE_CXX11_ABI,
      TRAINRUN_BUILD_COMPILER_ID, "abi15-data", "0.0.1", reinterpret_cast<const void*>(&::c10::GetCPUAllocator),
      1, components};
  return &descriptor;
}
