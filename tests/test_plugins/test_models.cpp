// Test-only models for the ddp tests (never installed): a small classifier whose options make
// it misbehave the ways a data-parallel strategy must notice or handle.
//   rank_dependent_width: the second layer is `hidden + rank` wide, so the replicas' parameter
//                         shapes differ (ddp must refuse, naming the parameter).
//   unused_layer:         a layer `head2` that forward never uses (ddp needs
//                         find_unused_parameters, and then must leave it without gradient).
//   gate_threshold > 0:   a layer `gate` applied only to samples whose mean input exceeds the
//                         threshold, so in a given step it is used on some ranks and not on
//                         others (or on none); the function is per sample, so a data-parallel
//                         run must still reproduce the single-process one.
//   stall_rank, stall_s:  rank `stall_rank` sleeps `stall_s` seconds in its third training
//                         forward, so its gradients are late (a strategy must end the others
//                         within the collective timeout, naming what it waited for).
//   inf_rank, inf_steps:  on rank `inf_rank` (-1: every rank), the training forwards numbered
//                         in `inf_steps` (1-based; = optimizer steps without accumulation) get
//                         +inf in the gradient flowing back into fc1's output, so fc0's and
//                         fc1's gradients are non-finite on that rank while the loss stays
//                         finite (the precision must skip the step on every rank).
#include <torch/types.h>
#include <torch/utils.h>
#include <trainrun/trainrun.hpp>

#include <algorithm>
#include <chrono>
#include <limits>
#include <cstdio>
#include <thread>
#include <string>

namespace {

namespace tr = trainrun::v1;

class DdpTestNet : public torch::nn::Module {
 public:
  DdpTestNet(int64_t in, int64_t hidden, int64_t classes, bool unused_layer, bool gate) {
    fc0 = register_module("fc0", torch::nn::Linear(in, 64));
    fc1 = register_module("fc1", torch::nn::Linear(64, hidden));
    out = register_module("out", torch::nn::Linear(hidden, classes));
    if (unused_layer) head2 = register_module("head2", torch::nn::Linear(hidden, classes));
    if (gate) this->gate = register_module("gate", torch::nn::Linear(hidden, classes));
  }
  torch::nn::Linear fc0{nullptr}, fc1{nullptr}, out{nullptr}, head2{nullptr}, gate{nullptr};
};

class DdpTestModel final : public tr::ModuleModel {
 public:
  static void declare_options(tr::OptionSchema& s) {
    // A list, so a job written for `mlp` (hidden = [64]) runs unchanged; the first entry counts.
    s.int_list("hidden", {32}, "width of the second hidden layer (first entry)");
    s.boolean("rank_dependent_width", false, "second hidden layer is hidden + rank wide");
    s.boolean("unused_layer", false, "register a layer 'head2' that forward never uses");
    s.real("gate_threshold", 0.0,
           "> 0: layer 'gate' adds to the logits of samples whose mean input exceeds this");
    s.integer("stall_rank", -1, "rank that sleeps stall_s seconds in its third training forward");
    s.real("stall_s", 0.0, "how long stall_rank sleeps", 0.0, 3600.0);
    s.integer("inf_rank", -1, "rank whose gradients get +inf in the inf_steps (-1 = every rank)");
    s.int_list("inf_steps", {}, "1-based training forwards whose backward injects +inf");
  }
  DdpTestModel(const tr::Options& o, const tr::RunContext& ctx)
      : threshold_(o.get_double("gate_threshold")),
        rank_(ctx.rank),
        stall_s_(o.get_int("stall_rank") == ctx.rank ? o.get_double("stall_s") : 0.0),
        inf_steps_(o.get_int("inf_rank") < 0 || o.get_int("inf_rank") == ctx.rank
                       ? o.get_int_list("inf_steps")
                       : std::vector<int64_t>{}) {
    int64_t in = 1;
    for (int64_t d : ctx.data.sample_shape) in *= d;
    const auto& widths = o.get_int_list("hidden");
    TR_CHECK(!widths.empty() && widths[0] > 0, o.context(), ": hidden must start with a positive width");
    const int64_t hidden = widths[0] + (o.get_bool("rank_dependent_width") ? ctx.rank : 0);
    net_ = std::make_shared<DdpTestNet>(in, hidden, ctx.data.num_classes, o.get_bool("unused_layer"),
                                        threshold_ > 0);
    set_module(net_);
  }
  tr::ModelOutput forward(const tr::Batch& b) override {
    if (torch::GradMode::is_enabled()) ++train_forwards_;
    if (stall_s_ > 0 && torch::GradMode::is_enabled() && train_forwards_ == 3)
      std::this_thread::sleep_for(std::chrono::duration<double>(stall_s_));
    const torch::Tensor x = b.input.flatten(1);
    torch::Tensor h = torch::relu(net_->fc1(torch::relu(net_->fc0(x))));
    if (torch::GradMode::is_enabled() &&
        std::find(inf_steps_.begin(), inf_steps_.end(), train_forwards_) != inf_steps_.end()) {
      h.register_hook([](torch::Tensor g) {
        return g + std::numeric_limits<float>::infinity();
      });
    }
    torch::Tensor logits = net_->out(h);
    if (threshold_ > 0) {
      const torch::Tensor rows = (x.mean(1) > threshold_).nonzero().squeeze(1);
      // Only when some sample qualifies does `gate` enter the graph at all.
      if (rows.numel() > 0)
        logits = logits.index_add(0, rows, net_->gate(h.index_select(0, rows)));
      if (torch::GradMode::is_enabled()) gate_usage_ += rows.numel() > 0 ? '1' : '0';
    }
    return tr::cross_entropy_sum(logits, b.target);
  }
  std::string describe() const override { return "ddp test mlp"; }
  // The test checks that `gate` was used on one rank but not the other in some step, and on
  // none in another: one character per training forward.
  ~DdpTestModel() override {
    if (threshold_ > 0) std::fprintf(stderr, "ddp-test-mlp rank %d gate usage: %s\n", rank_, gate_usage_.c_str());
  }

 private:
  double threshold_;
  int rank_;
  double stall_s_;
  std::vector<int64_t> inf_steps_;
  int64_t train_forwards_ = 0;
  std::string gate_usage_;
  std::shared_ptr<DdpTestNet> net_;
};

}  // namespace

TRAINRUN_PLUGIN("ddp-test-models", "0.0.1",
                tr::component<tr::Model, DdpTestModel>(
                    "ddp-test-mlp", "test classifier: rank-dependent shapes, unused or gated layers"))
