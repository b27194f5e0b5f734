// [parallel] ep: the model's experts split over groups of ep consecutive ranks
// (v1::ExpertParallelModel, trainrun/model/expert_parallel.hpp). The strategy never sees the
// experts; for them the core does what a data-parallel strategy does for the rest: gradients
// summed over the ranks holding the same experts, their share of the gradient norm, their
// checkpoint pieces (whole tensors, written by the first group, so any ep degree or world size
// loads them) and the gathered final state.
#include "run.hpp"

#include <torch/types.h>
#include <torch/utils.h>

#include <cstring>
#include <set>
#include <sstream>

#include "trainrun/core/log.hpp"
#include "trainrun/model/expert_parallel.hpp"
#include "trainrun/strategy/replicas.hpp"
#include "trainrun/strategy/strategy_helpers.hpp"

namespace trainrun::core {

using v1::ConfigError;

void Run::set_up_experts() {
  const int ep = static_cast<int>(job_.parallel.get_int("ep"));
  if (ep == 1) return;
  const std::string at = job_.file + ": [parallel] ep = " + std::to_string(ep);
  auto* m = dynamic_cast<v1::ExpertParallelModel*>(parts_.model.obj.get());
  if (m == nullptr)
    throw ConfigError(
        at + ": model plugin '" + job_.model.plugin +
        "' cannot split experts (it has no ExpertParallelModel capability, ABI 1.14)");
  const int64_t experts =
      parts_.model.call("num_experts", [&](v1::Model&) { return m->num_experts(); });
  if (experts == 0)
    throw ConfigError(at + ": the model has no mixture-of-experts layer (" +
                      parts_.model.call("describe", [](v1::Model& x) { return x.describe(); }) +
                      "); drop [parallel] or set ep = 1");
  const int world = env_.ctx.world_size;
  if (world % ep != 0)
    throw ConfigError(at + " does not divide the world size " + std::to_string(world));
  if (experts % ep != 0)
    throw ConfigError(at + " does not divide the model's " + std::to_string(experts) +
                      " experts per layer");
  // Generation runs token by token with a different count of tokens on each rank, which the
  // experts' all_to_all cannot follow.
  if (caps_.online != nullptr)
    throw ConfigError(at +
                      ": an online objective generates with the whole model; expert "
                      "parallelism does not generate yet");
  const v1::BlockGroups g = parts_.accelerator.call(
      "new_group (expert parallel)",
      [&](v1::Accelerator&) { return v1::new_block_groups(*parts_.comm, ep); });
  experts_.model = m;
  experts_.ep = ep;
  experts_.group = g.block;
  experts_.replicas = g.across;
  parts_.model.call("shard_experts", [&](v1::Model&) {
    m->shard_experts(*experts_.group);
    return 0;
  });
  experts_.params =
      parts_.model.call("expert_parameters", [&](v1::Model&) { return m->expert_parameters(); });
  for (const auto& p : experts_.params)
    if (p.tensor.requires_grad()) experts_.trainable.push_back(p);
  int64_t bytes = 0;
  for (const auto& p : experts_.params) bytes += static_cast<int64_t>(p.tensor.nbytes());
  if (env_.lead)
    log_info("expert parallel: " + std::to_string(world / ep) + " group(s) of " +
             std::to_string(ep) + " ranks, " + std::to_string(experts / ep) + " of " +
             std::to_string(experts) + " experts per MoE layer on each rank (" +
             std::to_string(bytes) + " bytes of experts on rank 0)");
}

// After the strategy's gradient sync: each expert's gradient holds the contributions of its
// group's ranks (the backward of the all_to_all brought them), each scaled by world_size as the
// loss is for data-parallel averaging (step.cpp); summed over the ranks holding the same
// experts and divided by world_size it is the gradient of the global batch's mean loss.
void Run::sync_expert_gradients() {
  if (experts_.trainable.empty()) return;
  torch::NoGradGuard no_grad;
  const int world = env_.ctx.world_size;
  std::vector<torch::Tensor> grads;
  if (experts_.replicas && experts_.replicas->world_size() > 1) {
    // An expert no token of this rank's group chose has no gradient here but may have one on a
    // replica: the ranks agree which are defined (an undefined one stays undefined, as a
    // parameter without gradient is skipped by the optimizer).
    std::vector<double> mine(experts_.trainable.size(), 0.0);
    for (size_t i = 0; i < mine.size(); ++i)
      if (experts_.trainable[i].tensor.grad().defined()) mine[i] = 1.0;
    // On the experts' device: a device communicator (NCCL) moves device tensors only.
    torch::Tensor defined = torch::tensor(mine, torch::kDouble).to(device_of_experts());
    parts_.accelerator.call("all_reduce (expert gradients defined)", [&](v1::Accelerator&) {
      experts_.replicas->all_reduce(defined)->wait();
      return 0;
    });
    const torch::Tensor agreed = defined.cpu();
    for (size_t i = 0; i < experts_.trainable.size(); ++i) {
      torch::Tensor& p = experts_.trainable[i].tensor;
      if (agreed.data_ptr<double>()[i] == 0) continue;
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      grads.push_back(p.grad());
    }
    if (!grads.empty()) {
      torch::Tensor flat = torch::cat([&] {
        std::vector<torch::Tensor> v;
        for (auto& t : grads) v.push_back(t.reshape({-1}));
        return v;
      }());
      parts_.accelerator.call("all_reduce (expert gradients)", [&](v1::Accelerator&) {
        experts_.replicas->all_reduce(flat)->wait();
        return 0;
      });
      int64_t off = 0;
      for (auto& t : grads) {
        t.copy_(flat.slice(0, off, off + t.numel()).view_as(t));
        off += t.numel();
      }
    }
  } else {
    for (auto& p : experts_.trainable)
      if (p.tensor.grad().defined()) grads.push_back(p.tensor.grad());
  }
  for (auto& t : grads) t.div_(static_cast<double>(world));
}

// The experts' share of the squared gradient norm: each expert counted once, on the rank of
// its group that holds it (the replicas' gradients are equal after sync_expert_gradients).
double Run::expert_grad_sq() {
  if (experts_.model == nullptr) return 0.0;
  const double local = experts_.trainable.empty() ? 0.0 : v1::local_grad_norm(experts_.trainable);
  torch::Tensor sq = torch::tensor({local * local}, torch::kDouble).to(device_of_experts());
  parts_.accelerator.call("all_reduce (expert gradient norm)", [&](v1::Accelerator&) {
    experts_.group->all_reduce(sq)->wait();
    return 0;
  });
  return sq.item<double>();
}

c10::Device Run::device_of_experts() const {
  return experts_.params.empty() ? c10::Device(c10::kCPU) : experts_.params.front().tensor.device();
}

void Run::drop_expert_grads() {
  if (experts_.model != nullptr) v1::drop_grads(experts_.params);
}

// What this rank holds for experts after a step (gradients alive, optimizer state made): the
// figure [parallel] ep divides, beside `trainrun check`'s estimate. A model without the
// capability or experts is not measured (0).
void Run::measure_expert_bytes() {
  experts_.state_bytes = 0;
  std::vector<v1::NamedTensor> held = experts_.params;
  if (experts_.model == nullptr) {
    auto* m = dynamic_cast<v1::ExpertParallelModel*>(parts_.model.obj.get());
    if (m == nullptr || m->num_experts() == 0) return;
    for (auto& p :
         parts_.model.call("named_parameters", [](v1::Model& x) { return x.named_parameters(); }))
      if (m->is_expert_parameter(p.name)) held.push_back(std::move(p));
  }
  std::set<std::string> names;
  double bytes = 0;
  for (const auto& p : held) {
    names.insert(p.name);
    bytes += static_cast<double>(p.tensor.nbytes());
    if (p.tensor.grad().defined()) bytes += static_cast<double>(p.tensor.grad().nbytes());
  }
  for (const auto& s : parts_.optimizer.call("state", [](v1::Optimizer& o) { return o.state(); })) {
    const auto dot = s.name.rfind('.');
    if (dot != std::string::npos && names.count(s.name.substr(0, dot)))
      bytes += static_cast<double>(s.tensor.nbytes());
  }
  experts_.state_bytes = bytes;
}

// Whole tensors under their names in the whole model: written by the first group (rank < ep),
// loaded on every rank, so a checkpoint loads under any ep degree and world size.
std::vector<v1::CheckpointPiece> Run::expert_pieces(bool optimizer) const {
  std::vector<v1::CheckpointPiece> out;
  if (experts_.model == nullptr) return out;
  const bool writer = env_.ctx.rank < experts_.ep;
  for (const auto& p : optimizer ? experts_.trainable : experts_.params) {
    TR_CHECK(p.tensor.is_contiguous(), "checkpoint: expert tensor '", p.name,
             "' is not contiguous");
    out.push_back({{p.name, p.tensor.sizes().vec(), 0, p.tensor.detach().view({-1})}, writer});
  }
  return out;
}

// The experts of every rank of this group, for the final state dict: each rank in turn
// broadcasts its names and shapes, then its tensors (broadcast_from). Collective over the group.
std::vector<v1::NamedTensor> Run::gather_experts() {
  std::vector<v1::NamedTensor> out;
  if (experts_.model == nullptr) return out;
  torch::NoGradGuard no_grad;
  v1::Communicator& g = *experts_.group;
  for (int src = 0; src < g.world_size(); ++src) {
    std::string meta;
    if (g.rank() == src) {
      std::ostringstream os;
      for (const auto& p : experts_.params) {
        os << p.name << ' ' << static_cast<int>(p.tensor.scalar_type()) << ' ' << p.tensor.dim();
        for (int64_t d : p.tensor.sizes()) os << ' ' << d;
        os << '\n';
      }
      meta = os.str();
    }
    const c10::Device dev = device_of_experts();
    torch::Tensor len = torch::tensor({static_cast<int64_t>(meta.size())}, torch::kLong).to(dev);
    v1::BroadcastOptions from;
    from.root = src;
    parts_.accelerator.call("broadcast (expert names)", [&](v1::Accelerator&) {
      g.broadcast(len, from)->wait();
      return 0;
    });
    torch::Tensor bytes = torch::zeros({len.item<int64_t>()}, torch::kUInt8);
    if (g.rank() == src) std::memcpy(bytes.data_ptr(), meta.data(), meta.size());
    bytes = bytes.to(dev);
    parts_.accelerator.call("broadcast (expert names)", [&](v1::Accelerator&) {
      g.broadcast(bytes, from)->wait();
      return 0;
    });
    bytes = bytes.cpu();
    std::istringstream is(std::string(reinterpret_cast<const char*>(bytes.data_ptr()),
                                      static_cast<size_t>(bytes.numel())));
    std::vector<at::Tensor> tensors;
    size_t i = 0;
    for (std::string name; is >> name; ++i) {
      int dtype = 0, dim = 0;
      is >> dtype >> dim;
      std::vector<int64_t> shape(static_cast<size_t>(dim));
      for (auto& d : shape) is >> d;
      torch::Tensor t =
          g.rank() == src
              ? experts_.params[i].tensor.detach().clone()
              : torch::empty(
                    shape,
                    torch::TensorOptions().dtype(static_cast<c10::ScalarType>(dtype)).device(dev));
      tensors.push_back(t);
      out.push_back({name, t});
    }
    // Coalesced, and dtypes the communicators do not carry (quant-int8's int8) as bytes.
    parts_.accelerator.call("broadcast (expert tensors)", [&](v1::Accelerator&) {
      v1::broadcast_from(g, tensors, src);
      return 0;
    });
  }
  return out;
}

}  // namespace trainrun::core
