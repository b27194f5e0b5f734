#pragma once
// Activation checkpointing (gradient checkpointing) for sharding units: a unit's forward runs
// without recording its graph, keeping only its input; during backward the forward runs again
// from that input with grad enabled and the incoming gradient is propagated through the
// recomputed graph. Memory: a checkpointed unit holds one input tensor instead of all its
// intermediate activations; cost: one more forward of the unit per backward. References: Chen
// et al., "Training Deep Nets with Sublinear Memory Cost" (2016); torch.utils.checkpoint
// (the reentrant variant, use_reentrant=True, preserve_rng_state=True).
//
//   #include <trainrun/model/activation_checkpointing.hpp>
//   for (trainrun::v1::Unit* u : model.units()) trainrun::v1::enable_activation_checkpointing(*u);
//
// Semantics, as torch.utils.checkpoint (reentrant):
// - Parameter gradients accumulate through the ordinary autograd graph of the recomputation
//   (a nested backward inside the unit's backward node), so gradient-accumulator hooks (ddp's
//   bucket hooks, ring's readiness hooks) fire as they do without checkpointing, once per
//   parameter per backward.
// - The random state is preserved: the CPU generator (and the input device's, when it is not
//   the CPU) is saved before the forward and restored around the recomputation, so dropout
//   draws the same mask twice; the generator's state after backward is what it was before it.
// - The autocast state of the forward (enabled per device type, dtypes, cache) is restored for
//   the recomputation, which runs inside backward where no autocast region is active.
// - Outside grad mode (evaluation) the unit runs plainly: nothing is recorded either way.
// - The unit's forward must be a function of its input and parameters only (no state that the
//   first run changes, e.g. BatchNorm running statistics would be updated twice), and its
//   output must not be its input or a view of it.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "trainrun/error.hpp"
#include "trainrun/torch_compat.hpp"
#include "trainrun/unit.hpp"

namespace trainrun::v1 {

namespace detail {

/// What the recomputation needs besides the input: the forward, the random state and the
/// autocast state at the time of the first run. Travels from forward to backward in the
/// autograd context as an IValue capsule.
struct CheckpointRecord : torch::CustomClassHolder {
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::vector<std::pair<c10::Device, at::Tensor>> rng_states;  ///< generator state per device
  bool autocast_cpu = false, autocast_cuda = false, autocast_cache = true;
  at::ScalarType autocast_cpu_dtype = at::kBFloat16, autocast_cuda_dtype = at::kHalf;
};

/// The default generators whose state a recomputation must replay: the CPU's, plus the input's
/// device's when that is not the CPU.
inline std::vector<c10::Device> rng_devices(const at::Tensor& input) {
  std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
  if (!input.device().is_cpu()) devices.push_back(input.device());
  return devices;
}

/// A copy of the default generator's state for `device` (a uint8 tensor; CPU: mt19937's).
inline at::Tensor generator_state(c10::Device device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

/// Restores the default generator of `device` to a state from generator_state().
inline void set_generator_state(c10::Device device, const at::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

/// Sets the autocast state (per device type, dtype, cache) for the life of the object and
/// restores the previous one; the cast cache is cleared when the outermost region ends, as
/// torch.autocast does.
class AutocastRestore {
 public:
  AutocastRestore(bool cpu, at::ScalarType cpu_dtype, bool cuda, at::ScalarType cuda_dtype,
                  bool cache)
      : cpu_(compat::autocast_enabled(c10::kCPU)),
        cuda_(compat::autocast_enabled(c10::kCUDA)),
        cache_(at::autocast::is_autocast_cache_enabled()),
        cpu_dtype_(compat::autocast_dtype(c10::kCPU)),
        cuda_dtype_(compat::autocast_dtype(c10::kCUDA)) {
    compat::set_autocast_enabled(c10::kCPU, cpu);
    compat::set_autocast_dtype(c10::kCPU, cpu_dtype);
    compat::set_autocast_enabled(c10::kCUDA, cuda);
    compat::set_autocast_dtype(c10::kCUDA, cuda_dtype);
    at::autocast::set_autocast_cache_enabled(cache);
    at::autocast::increment_nesting();
  }
  ~AutocastRestore() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    compat::set_autocast_enabled(c10::kCPU, cpu_);
    compat::set_autocast_dtype(c10::kCPU, cpu_dtype_);
    compat::set_autocast_enabled(c10::kCUDA, cuda_);
    compat::set_autocast_dtype(c10::kCUDA, cuda_dtype_);
    at::autocast::set_autocast_cache_enabled(cache_);
  }
  AutocastRestore(const AutocastRestore&) = delete;
  AutocastRestore& operator=(const AutocastRestore&) = delete;

 private:
  bool cpu_, cuda_, cache_;
  at::ScalarType cpu_dtype_, cuda_dtype_;
};

/// The custom autograd function behind checkpoint(). Inputs: the unit's input, and an empty
/// `anchor` tensor that requires grad so the output is part of the graph even when the input
/// is not (a unit whose input comes from frozen layers still trains its own parameters: its
/// gradients arrive through the nested backward, not through this node's outputs).
struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  /// Runs record->forward(input) without recording (autocast as at the call, cast cache off);
  /// saves the input and the record for backward. Returns the unit's output.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& anchor,
                            c10::intrusive_ptr<CheckpointRecord> record) {
    (void)anchor;
    // Grad mode is off here (Function::apply runs forward under no_grad). The autocast cache
    // is off too: a weight cast under no_grad and cached would have no grad_fn, and a later
    // use of the same weight with grad in this autocast region would reuse it and lose its
    // gradient.
    at::Tensor out;
    {
      AutocastRestore same(record->autocast_cpu, record->autocast_cpu_dtype,
                           record->autocast_cuda, record->autocast_cuda_dtype,
                           /*cache=*/false);
      out = record->forward(input);
    }
    TR_CHECK(out.defined(), "activation checkpointing: the unit's forward returned no tensor");
    ctx->save_for_backward({input});
    ctx->saved_data["record"] = c10::IValue::make_capsule(std::move(record));
    return out;
  }

  /// Recomputes the forward from the saved input (random and autocast state replayed, grad
  /// on), backpropagates grad_outputs[0] through it; returns {input's gradient, none, none}.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    auto record = c10::static_intrusive_pointer_cast<CheckpointRecord>(
        ctx->saved_data["record"].toCapsule());
    at::Tensor input = saved[0].detach();
    input.requires_grad_(saved[0].requires_grad());
    at::Tensor out;
    {
      // Replay the forward's random stream, then put the current one back.
      std::vector<std::pair<c10::Device, at::Tensor>> now;
      for (const auto& [device, state] : record->rng_states)
        now.emplace_back(device, generator_state(device));
      for (const auto& [device, state] : record->rng_states) set_generator_state(device, state);
      try {
        c10::AutoGradMode grad(true);
        AutocastRestore same(record->autocast_cpu, record->autocast_cpu_dtype,
                             record->autocast_cuda, record->autocast_cuda_dtype,
                             record->autocast_cache);
        out = record->forward(input);
      } catch (...) {
        for (const auto& [device, state] : now) set_generator_state(device, state);
        throw;
      }
      for (const auto& [device, state] : now) set_generator_state(device, state);
    }
    if (out.requires_grad()) {
      // Parameter gradients accumulate into .grad (hooks fire); the input's lands in
      // input.grad, which this node returns to the graph outside the unit.
      torch::autograd::backward({out}, {grad_outputs[0]});
    }
    at::Tensor grad_input = input.requires_grad() ? input.grad() : at::Tensor();
    return {grad_input, at::Tensor(), at::Tensor()};
  }
};

}  // namespace detail

/// Runs forward(input) with activation checkpointing (see the file comment) and returns its
/// output: same value, shape and dtype as forward(input). In grad mode the result's grad_fn
/// recomputes forward during backward; outside grad mode this is forward(input). `input` may
/// be any tensor; forward must return a tensor that is not `input` itself. Exceptions from
/// forward propagate (from the recomputation: out of backward()).
inline at::Tensor checkpoint(const at::Tensor& input,
                             const std::function<at::Tensor(const at::Tensor&)>& forward) {
  if (!c10::GradMode::is_enabled()) return forward(input);
  auto record = c10::make_intrusive<detail::CheckpointRecord>();
  record->forward = forward;
  for (const c10::Device& d : detail::rng_devices(input))
    record->rng_states.emplace_back(d, detail::generator_state(d));
  record->autocast_cpu = compat::autocast_enabled(c10::kCPU);
  record->autocast_cuda = compat::autocast_enabled(c10::kCUDA);
  record->autocast_cache = at::autocast::is_autocast_cache_enabled();
  record->autocast_cpu_dtype = compat::autocast_dtype(c10::kCPU);
  record->autocast_cuda_dtype = compat::autocast_dtype(c10::kCUDA);
  // One empty leaf per call: the node's second input (see CheckpointFunction).
  const at::Tensor anchor =
      at::empty({0}, at::TensorOptions().device(input.device())).requires_grad_(true);
  return detail::CheckpointFunction::apply(input, anchor, std::move(record));
}

/// A Checkpointer (unit.hpp) that runs the unit through checkpoint().
inline Checkpointer activation_checkpointer() {
  return [](const at::Tensor& input, const std::function<at::Tensor(const at::Tensor&)>& fn) {
    return checkpoint(input, fn);
  };
}

/// Turns activation checkpointing on for `unit` (off again with unit.set_checkpointer({})).
/// The model must run the unit with Unit::run(input, fn); Unit::run(fn) then throws.
inline void enable_activation_checkpointing(Unit& unit) {
  unit.set_checkpointer(activation_checkpointer());
}

}  // namespace trainrun::v1
