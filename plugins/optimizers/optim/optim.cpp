#include "optim.hpp"

#include <trainrun/plugin.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <set>

namespace trainrun::plugins {

using namespace trainrun::v1;

namespace {

// torch::optim requires lr but the SDK's OptionSchema has no shorthand for a required float.
OptionSpec required_real(const std::string& name, const std::string& help) {
  return OptionSpec{name, OptionType::Float, std::monostate{}, true, 0.0, {}, {}, help};
}

// Validates the options that are known in the constructor, so a bad job file fails before any
// model is built; the run length is only known in init().
LrSchedule schedule_from(const Options& options, double peak_lr) {
  TrainPlan provisional;
  provisional.total_steps = 1;
  return lr_schedule_from_options(options, peak_lr, provisional);
}

}  // namespace

// --- shared ----------------------------------------------------------------------------------

ScheduledOptimizer::ScheduledOptimizer(const Options& options, double peak_lr,
                                       std::vector<std::string> buffer_names)
    : context_(options.context()),
      schedule_(schedule_from(options, peak_lr)),
      buffer_names_(std::move(buffer_names)) {}

void ScheduledOptimizer::init(const std::vector<NamedTensor>& params, const TrainPlan& plan) {
  TR_CHECK(!initialized_, context_, ": init() called twice");
  schedule_.total_steps = plan.total_steps;
  schedule_.validate(context_);

  std::set<std::string> seen;
  std::set<const void*> seen_impl;
  slots_.reserve(params.size());
  for (const auto& np : params) {
    TR_CHECK(np.tensor.defined(), context_, ": parameter '", np.name, "' is undefined");
    TR_CHECK(seen.insert(np.name).second, context_, ": parameter '", np.name,
             "' given twice");
    // The same tensor under two names would be updated twice per step.
    TR_CHECK(seen_impl.insert(np.tensor.unsafeGetTensorImpl()).second, context_,
             ": parameter '", np.name, "' is the same tensor as an earlier one");
    TR_CHECK(at::isFloatingType(np.tensor.scalar_type()), context_, ": parameter '", np.name,
             "' has non-floating dtype ", np.tensor.scalar_type());
    ParamSlot slot;
    slot.name = np.name;
    slot.param = np.tensor;
    const at::ScalarType dtype = np.tensor.scalar_type();
    if (dtype == at::kBFloat16 || dtype == at::kHalf) {
      c10::NoGradGuard no_grad;
      slot.master = np.tensor.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true)
                        .contiguous();
    }
    if (needs_state()) {
      c10::NoGradGuard no_grad;
      const at::Tensor& w = slot.weights();
      slot.step = at::zeros({}, at::TensorOptions().dtype(at::kLong));
      for (size_t i = 0; i < buffer_names_.size(); ++i)
        slot.buffers.push_back(at::zeros_like(w, w.options(), at::MemoryFormat::Contiguous));
    }
    slots_.push_back(std::move(slot));
  }
  initialized_ = true;
}

double ScheduledOptimizer::lr(int64_t step) const { return schedule_.at(step); }

std::vector<NamedTensor> ScheduledOptimizer::state() {
  std::vector<NamedTensor> out;
  for (auto& s : slots_) {
    if (needs_state()) {
      for (size_t i = 0; i < buffer_names_.size(); ++i)
        out.push_back({s.name + "." + buffer_names_[i], s.buffers[i]});
      out.push_back({s.name + ".step", s.step});
    }
    if (s.master.defined()) out.push_back({s.name + ".master", s.master});
  }
  return out;
}

void ScheduledOptimizer::check_initialized(const char* what) const {
  TR_CHECK(initialized_, context_, ": ", what, "() called before init()");
}

namespace {

// The gradient to use for `slot`, or an undefined tensor when the parameter has none.
at::Tensor grad_of(const ParamSlot& slot, const std::string& context) {
  const at::Tensor& g = slot.param.grad();
  if (!g.defined()) return g;
  TR_CHECK(!g.is_sparse(), context, ": parameter '", slot.name,
           "' has a sparse gradient, which this optimizer does not support");
  TR_CHECK(g.sizes() == slot.param.sizes(), context, ": gradient of '", slot.name,
           "' has shape ", g.sizes(), " but the parameter has ", slot.param.sizes());
  return g;
}

// The gradient in the dtype of the tensor the rule updates: float32 for a master copy (a bf16
// gradient is converted once per step; accumulation across micro-batches happened in the
// parameter's own dtype, see README "Precision").
at::Tensor grad_for_update(const ParamSlot& slot, const at::Tensor& g) {
  return slot.master.defined() ? g.to(at::kFloat) : g;
}

// After an update of the master copy: the parameter takes the rounded value.
void sync_master(ParamSlot& slot) {
  if (slot.master.defined()) slot.param.copy_(slot.master);
}

}  // namespace

void ScheduledOptimizer::update_each(int64_t step, const Update& update) {
  check_initialized("step");
  const double lr = schedule_.at(step);
  c10::NoGradGuard no_grad;
  for (auto& s : slots_) {
    const at::Tensor g = grad_of(s, context_);
    if (!g.defined()) continue;
    update(s, grad_for_update(s, g), s.weights(), lr);
    sync_master(s);
  }
}

// --- SGD -------------------------------------------------------------------------------------

void Sgd::declare_options(OptionSchema& schema) {
  schema.add(required_real("lr", "peak learning rate"));
  schema.real("momentum", 0.0, "momentum factor (0 = plain SGD)", 0.0);
  schema.real("dampening", 0.0, "dampening of the gradient added to the momentum buffer", 0.0,
              1.0);
  schema.boolean("nesterov", false, "Nesterov momentum (needs momentum > 0 and dampening 0)");
  schema.real("weight_decay", 0.0, "L2 penalty added to the gradient (coupled, as torch SGD)",
              0.0);
  declare_lr_schedule_options(schema);
}

Sgd::Sgd(const Options& options, const RunContext&)
    : ScheduledOptimizer(options, options.get_double("lr"), {"momentum_buffer"}),
      momentum_(options.get_double("momentum")),
      dampening_(options.get_double("dampening")),
      weight_decay_(options.get_double("weight_decay")),
      nesterov_(options.get_bool("nesterov")) {
  // Same rule as torch.optim.SGD: without it Nesterov's look-ahead has no meaning.
  TR_CHECK_TYPED(ConfigError, !nesterov_ || (momentum_ > 0 && dampening_ == 0), context_,
                 ": nesterov = true needs momentum > 0 and dampening = 0 (got momentum ",
                 momentum_, ", dampening ", dampening_, ")");
}

void Sgd::step(int64_t step) {
  update_each(step, [&](ParamSlot& s, const at::Tensor& g, at::Tensor& p, double lr) {
    at::Tensor d_p = weight_decay_ != 0 ? g.add(p, weight_decay_) : g;
    if (momentum_ != 0) {
      at::Tensor& buf = s.buffers[0];
      int64_t& t = *s.step.data_ptr<int64_t>();
      // torch starts the buffer as a copy of the first gradient, undamped.
      if (t == 0)
        buf.copy_(d_p);
      else
        buf.mul_(momentum_).add_(d_p, 1.0 - dampening_);
      ++t;
      d_p = nesterov_ ? d_p.add(buf, momentum_) : buf;
    }
    p.add_(d_p, -lr);
  });
}

// --- AdamW -----------------------------------------------------------------------------------

void AdamW::declare_options(OptionSchema& schema) {
  schema.real("lr", 1e-3, "peak learning rate", 0.0);
  schema.real("beta1", 0.9, "decay rate of the first-moment (mean) estimate, in [0, 1)", 0.0,
              1.0);
  schema.real("beta2", 0.999, "decay rate of the second-moment estimate, in [0, 1)", 0.0, 1.0);
  schema.real("eps", 1e-8, "added to the denominator for numerical stability", 0.0);
  schema.real("weight_decay", 0.01,
              "decoupled weight decay: p *= 1 - lr * weight_decay each step", 0.0);
  schema.boolean("no_decay_1d", true,
                 "no weight decay on parameters with fewer than 2 dimensions (biases, norms)");
  declare_lr_schedule_options(schema);
}

AdamW::AdamW(const Options& options, const RunContext&)
    : ScheduledOptimizer(options, options.get_double("lr"), {"exp_avg", "exp_avg_sq"}),
      beta1_(options.get_double("beta1")),
      beta2_(options.get_double("beta2")),
      eps_(options.get_double("eps")),
      weight_decay_(options.get_double("weight_decay")),
      no_decay_1d_(options.get_bool("no_decay_1d")) {
  // beta = 1 makes the bias correction 1 - beta^t zero: a division by zero on every step.
  TR_CHECK_TYPED(ConfigError, beta1_ >= 0 && beta1_ < 1, context_,
                 ": beta1 must be in [0, 1), got ", beta1_);
  TR_CHECK_TYPED(ConfigError, beta2_ >= 0 && beta2_ < 1, context_,
                 ": beta2 must be in [0, 1), got ", beta2_);
}

void AdamW::set_parameter_shapes(const std::map<std::string, std::vector<int64_t>>& shapes) {
  shapes_ = shapes;
}

void AdamW::step(int64_t step) {
  update_each(step, [&](ParamSlot& s, const at::Tensor& g, at::Tensor& p, double lr) {
    at::Tensor& exp_avg = s.buffers[0];
    at::Tensor& exp_avg_sq = s.buffers[1];
    int64_t& t = *s.step.data_ptr<int64_t>();
    ++t;

    const auto shape = shapes_.find(s.name);
    const size_t dims = shape != shapes_.end() ? shape->second.size() : static_cast<size_t>(p.dim());
    const bool decay = weight_decay_ != 0 && !(no_decay_1d_ && dims < 2);
    if (decay) p.mul_(1.0 - lr * weight_decay_);

    // Operation order as torch::optim::AdamW in LibTorch 1.13, so results agree bit for bit
    // rather than only within rounding.
    const double bias_correction1 = 1.0 - std::pow(beta1_, static_cast<double>(t));
    const double bias_correction2 = 1.0 - std::pow(beta2_, static_cast<double>(t));
    exp_avg.mul_(beta1_).add_(g, 1.0 - beta1_);
    exp_avg_sq.mul_(beta2_).addcmul_(g, g, 1.0 - beta2_);
    at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(eps_);
    p.addcdiv_(exp_avg, denom, -lr / bias_correction1);
  });
}

}  // namespace trainrun::plugins
