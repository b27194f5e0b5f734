// Expert parallelism for the mixture-of-experts families (v1::ExpertParallelModel, ABI 1.14):
// which experts a rank keeps, and the all_to_all that moves token rows to them and back with a
// backward of its own.
#include <torch/csrc/autograd/custom_function.h>

#include <numeric>
#include <string>
#include <vector>

#include "llama.hpp"
#include "modules.hpp"
#include "trainrun/collectives/all_to_all.hpp"
#include "trainrun/error.hpp"

namespace trainrun::llama {

using namespace detail;
using v1::ConfigError;

namespace detail {
namespace {

bool is_expert(const std::string& name) { return name.find(".experts.") != std::string::npos; }

torch::Tensor move_rows(const torch::Tensor& x, const std::vector<int64_t>& send,
                        const std::vector<int64_t>& recv, v1::Communicator& group) {
  const torch::Tensor in = x.contiguous();
  std::vector<int64_t> sizes = in.sizes().vec();
  sizes[0] = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  torch::Tensor out = torch::empty(sizes, in.options());
  v1::AllToAllOptions o;
  o.input_split_sizes = send;
  o.output_split_sizes = recv;
  v1::all_to_all(group, in, out, o);
  return out;
}

// The rows' way back is the gradient's: the backward is the same exchange with the parts
// swapped (as torch.distributed.nn's all_to_all_single).
struct ExchangeRows : public torch::autograd::Function<ExchangeRows> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               std::vector<int64_t> send, std::vector<int64_t> recv,
                               int64_t group) {
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    ctx->saved_data["group"] = group;
    ctx->saved_data["sizes"] = x.sizes().vec();
    return move_rows(x, send, recv, *reinterpret_cast<v1::Communicator*>(group));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    auto& group = *reinterpret_cast<v1::Communicator*>(ctx->saved_data["group"].toInt());
    torch::Tensor g = grad[0];
    if (!g.defined()) {
      // Every rank of the group takes part in the exchange, used or not.
      std::vector<int64_t> sizes = ctx->saved_data["sizes"].toIntVector();
      sizes[0] = std::accumulate(recv.begin(), recv.end(), int64_t{0});
      g = torch::zeros(sizes, torch::kFloat);
    }
    return {move_rows(g, recv, send, group), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor exchange_rows(const torch::Tensor& x, const std::vector<int64_t>& send,
                            const std::vector<int64_t>& recv, v1::Communicator& group) {
  return ExchangeRows::apply(x, send, recv, reinterpret_cast<int64_t>(&group));
}

torch::Tensor exchange_counts(const torch::Tensor& counts, v1::Communicator& group) {
  const torch::Tensor in = counts.to(torch::kLong).contiguous().view({group.world_size(), -1});
  torch::Tensor out = torch::empty_like(in);
  v1::all_to_all(group, in, out);
  return out;
}

}  // namespace detail

bool LlamaModel::is_expert_parameter(const std::string& name) const {
  return cfg_.num_experts > 0 && is_expert(name);
}

void LlamaModel::shard_experts(v1::Communicator& group) {
  TR_CHECK(ep_group_ == nullptr, "llama: shard_experts() called twice");
  TR_CHECK(cfg_.num_experts > 0, "llama: expert parallelism needs a mixture-of-experts model; ",
           cfg_.model_type, " has no MoE layer");
  const int64_t ep = group.world_size(), E = cfg_.num_experts;
  TR_CHECK_TYPED(ConfigError, E % ep == 0, "[parallel] ep = ", ep, " does not divide the ", E,
                 " experts of each MoE layer of ", dir_.empty() ? cfg_.model_type : dir_,
                 " (num_experts / num_local_experts in config.json)");
  const int64_t per = E / ep, first = group.rank() * per;
  for (const auto& layer : net_of(net_).model->layer_ptrs)
    if (layer->moe) layer->moe->keep_experts(first, per, &group);
  // Weights still in the files: the kept experts are read now (a strategy never sees them),
  // the others are forgotten.
  std::set<std::string> kept;
  for (const auto& item : net_->named_parameters(true)) kept.insert(item.key());
  torch::NoGradGuard no_grad;
  for (auto it = deferred_.begin(); it != deferred_.end();) {
    if (!kept.count(it->first)) {
      it = deferred_.erase(it);
    } else if (is_expert(it->first)) {
      v1::sharding::refill_storage(it->second);
      read_weight_range(it->first, 0, it->second.detach().view({-1}));
      it = deferred_.erase(it);
    } else {
      ++it;
    }
  }
  ep_group_ = &group;
  give_back_free_memory();
}

std::vector<v1::NamedTensor> LlamaModel::expert_parameters() {
  std::vector<v1::NamedTensor> out;
  if (ep_group_ == nullptr) return out;
  for (auto& p : ModuleModel::named_parameters())
    if (is_expert(p.name)) out.push_back(std::move(p));
  return out;
}

std::vector<v1::NamedTensor> LlamaModel::named_parameters() {
  std::vector<v1::NamedTensor> all = ModuleModel::named_parameters();
  if (ep_group_ == nullptr) return all;
  std::vector<v1::NamedTensor> out;
  for (auto& p : all)
    if (!is_expert(p.name)) out.push_back(std::move(p));
  return out;
}

}  // namespace trainrun::llama
