#pragma once
// A minimal but real Model for the test plugins: one linear layer on the flattened input.
// Refused plugins never get this far; it exists so each test plugin is otherwise normal.
#include <torch/types.h>
#include <torch/utils.h>
#include <torch/nn/functional.h>
#include <trainrun/trainrun.hpp>

#include <algorithm>

namespace trainrun_test {

class TinyModel : public trainrun::v1::Model {
 public:
  static void declare_options(trainrun::v1::OptionSchema&) {}
  TinyModel(const trainrun::v1::Options&, const trainrun::v1::RunContext& ctx) {
    int64_t in = 1;
    for (int64_t d : ctx.data.sample_shape) in *= d;
    weight_ = torch::zeros({in, std::max<int64_t>(ctx.data.num_classes, 1)}, torch::requires_grad());
  }
  std::vector<trainrun::v1::NamedTensor> named_parameters() override { return {{"weight", weight_}}; }
  void train(bool) override {}
  trainrun::v1::ModelOutput forward(const trainrun::v1::Batch& batch) override {
    auto logits = batch.input.flatten(1).matmul(weight_);
    auto loss = torch::nn::functional::cross_entropy(
        logits, batch.target, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    return {loss, logits.argmax(1).eq(batch.target).sum().item<int64_t>()};
  }
  std::string describe() const override { return "tiny linear test model"; }

 private:
  torch::Tensor weight_;
};

}  // namespace trainrun_test
