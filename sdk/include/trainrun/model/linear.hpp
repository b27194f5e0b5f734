#pragma once
// trainrun::v1::Linear: a drop-in for torch::nn::Linear with two seams (ABI 1.4).
//
// C++ torch::nn modules have no forward hooks, and models call their Linear holders directly,
// so nothing outside a model can swap a layer for a quantized or adapted one. This layer has
// the seams itself:
//   y = base(x) + sum over adapters a of a(x)
// where base is the dense x W^T + b by default (bit for bit what torch::nn::Linear computes:
// same parameter names "weight" [out, in] and "bias" [out], same initialisation drawn in the
// same order, same at::linear call), or a frozen quantized LinearBase a Precision installed
// (QLoRA, Dettmers et al. 2023; LLM.int8(), Dettmers et al. 2022), and the adapters are
// LinearAdapters a Callback added (LoRA, Hu et al. 2021).
//
// A model opts in by declaring its layers as trainrun::v1::Linear instead of torch::nn::Linear
// (the shipped mlp, cnn and gpt do); find_linear_layers() gives a plugin the layers a job's
// target_modules / skip_modules select, with an error naming the model when there are none.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/options/linear.h>
#include <torch/nn/pimpl.h>

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainrun/error.hpp"
#include "trainrun/interfaces.hpp"
#include "trainrun/torch_compat.hpp"

namespace trainrun::v1 {

/// A LinearAdapter that may say it is a plain low-rank product, found with dynamic_cast: when
/// plain(training) is true, forward(x, training) is exactly scaling() * (x A()^T) B()^T (no
/// dropout or other change of x). Then the Linear below adds it to the base output in one fused
/// multiply-add, and layers that read the same input compute their adapters' x A^T as one
/// product (LinearImpl::forward_shared): the same arithmetic, but for rounding, with fewer
/// passes over the outputs and fewer thin matrix products. Only this header's inline code uses
/// it, so it changes nothing between the core and a plugin (no ABI version): an adapter that
/// does not implement it runs its own forward().
class LowRankAdapter {
 public:
  virtual ~LowRankAdapter() = default;
  /// [r, in] and [out, r], the live parameters (the ones the optimizer updates).
  virtual const at::Tensor& A() const = 0;
  virtual const at::Tensor& B() const = 0;
  virtual double scaling() const = 0;
  /// Whether forward(x, training) is the plain product in this mode.
  virtual bool plain(bool training) const = 0;
};

/// A fully connected layer y = x W^T + b with a replaceable base and added adapters.
/// Parameters: "weight" float32 [out_features, in_features] (absent once a LinearBase is
/// installed), "bias" float32 [out_features] when options.bias() is true.
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in_features, int64_t out_features)
      : LinearImpl(torch::nn::LinearOptions(in_features, out_features)) {}
  explicit LinearImpl(const torch::nn::LinearOptions& options) : options(options) {
    // torch::nn::LinearImpl::reset + reset_parameters, in the same order, so a model that
    // switches from torch::nn::Linear draws the same numbers and reproduces its runs.
    weight = register_parameter("weight",
                                at::empty({options.out_features(), options.in_features()}));
    if (options.bias())
      bias = register_parameter("bias", at::empty({options.out_features()}));
    else
      bias = register_parameter("bias", {}, /*requires_grad=*/false);
    torch::nn::init::kaiming_uniform_(weight, std::sqrt(5));
    if (bias.defined()) {
      const auto fan = torch::nn::init::_calculate_fan_in_and_fan_out(weight);
      const double bound = 1 / std::sqrt(static_cast<double>(std::get<0>(fan)));
      torch::nn::init::uniform_(bias, -bound, bound);
    }
  }

  /// x: floating [..., in_features] -> [..., out_features], in x's dtype.
  at::Tensor forward(const at::Tensor& x) {
    // Without adapters (every layer of a model not under LoRA) this is the whole of
    // forward_shared's result, without its vectors, casts and autocast queries per call.
    if (adapters_.empty())
      return base_ ? base_->forward(x, bias) : at::linear(x, compute_weight(), bias);
    return forward_shared(x, {this}).front();
  }

  /// The outputs of `layers` (each with in_features = x.size(-1)) for the one input x: what
  /// each layer's forward(x) computes, with the x A^T of the plain low-rank adapters
  /// (LowRankAdapter) of all the layers done as one product, and each adapter's
  /// scaling * (x A^T) B^T added to the base output in one fused multiply-add (addmm). With
  /// LoRA on q/k/v_proj that is one [tokens, 3r] product instead of three [tokens, r] ones,
  /// forward and backward; thin products are where BLAS is least efficient. The same
  /// arithmetic as adding each adapter's forward(x), but for rounding.
  static std::vector<at::Tensor> forward_shared(const at::Tensor& x,
                                                const std::vector<LinearImpl*>& layers) {
    struct Fused {
      LowRankAdapter* a;
      size_t layer;
    };
    std::vector<Fused> fused;
    std::vector<at::Tensor> as;
    // Under autocast an adapter's own forward casts its output back to x's dtype before the
    // sum (float32 + bf16 = float32): keep that arithmetic there.
    const bool autocast =
        compat::autocast_enabled(c10::kCUDA) || compat::autocast_enabled(c10::kCPU);
    for (size_t i = 0; i < layers.size() && !autocast; ++i)
      for (const auto& a : layers[i]->adapters_)
        if (auto* lr = dynamic_cast<LowRankAdapter*>(a.get());
            lr && lr->plain(layers[i]->is_training()) && lr->A().scalar_type() == x.scalar_type() &&
            lr->B().scalar_type() == x.scalar_type() && lr->A().device() == x.device()) {
          fused.push_back({lr, i});
          as.push_back(lr->A());
        }
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});  // [tokens, in]
    std::vector<at::Tensor> h;  // x A^T of each fused adapter, [tokens, r]
    if (as.size() == 1) {
      h.push_back(at::mm(x2, as[0].t()));
    } else if (as.size() > 1) {
      std::vector<int64_t> ranks;
      for (const auto& a : as) ranks.push_back(a.size(0));
      h = at::mm(x2, at::cat(as).t()).split_with_sizes(ranks, 1);
    }
    std::vector<at::Tensor> out;
    size_t next = 0;
    for (size_t i = 0; i < layers.size(); ++i) {
      LinearImpl& l = *layers[i];
      // y [tokens, out]. `fresh`: y is an output no autograd node keeps (linear's, addmm's, an
      // addition's; a LinearBase's backward might keep its own), so an adapter is added into it
      // in place, without addmm's copy of y (a pass over every LoRA layer's output). Linear on
      // the [tokens, in] view does what it does on x (addmm or mm), so the numbers are the same.
      at::Tensor y;
      bool fresh = !l.base_;
      if (l.base_) {
        y = l.base_->forward(x, l.bias);
        y = y.reshape({-1, y.size(-1)});
      } else {
        y = at::linear(x2, l.compute_weight(), l.bias);
      }
      for (size_t j = 0; j < l.adapters_.size(); ++j) {
        if (next < fused.size() && fused[next].layer == i &&
            fused[next].a == dynamic_cast<LowRankAdapter*>(l.adapters_[j].get())) {
          LowRankAdapter& a = *fused[next].a;
          if (fresh)
            y.addmm_(h[next], a.B().t(), /*beta=*/1, a.scaling());
          else
            y = at::addmm(y, h[next], a.B().t(), /*beta=*/1, a.scaling());
          ++next;
        } else {
          const at::Tensor d = l.adapters_[j]->forward(x, l.is_training());
          y = y + d.reshape({-1, d.size(-1)});
        }
        fresh = true;
      }
      std::vector<int64_t> shape = x.sizes().vec();
      shape.back() = y.size(-1);
      out.push_back(y.reshape(shape));
    }
    return out;
  }

  /// Replaces the dense weight with a frozen `base`: the "weight" parameter is removed (the
  /// member `weight` becomes undefined) and `frozen` (the base's packed storage and
  /// quantization state, e.g. "weight_nf4", "weight_absmax") are registered on this layer as
  /// parameters with requires_grad false — as bitsandbytes' Params4bit are Parameters — so they
  /// travel in state dicts and broadcasts under these names, and a sharding strategy shards them
  /// with the layer's unit as raw bytes (sharding::FrozenFlat), never as floats. They are never
  /// given to the optimizer (strategies hand it trainable parameters only). The base must hold
  /// the same tensor objects it registers: strategies move them in place (set_data).
  /// Throws Error when a base is already installed or adapters were added first.
  void set_base(std::shared_ptr<LinearBase> base,
                const std::vector<std::pair<std::string, at::Tensor>>& frozen) {
    TR_CHECK(base != nullptr, "Linear::set_base: base must not be null");
    TR_CHECK(!base_, "Linear::set_base: the layer already has a ", base_->format(), " base");
    TR_CHECK(adapters_.empty(), "Linear::set_base: install the base before adding adapters "
             "(the precision converts the model before callbacks' on_setup)");
    parameters_.erase("weight");
    weight = at::Tensor();
    for (const auto& [name, t] : frozen) register_parameter(name, t, /*requires_grad=*/false);
    base_ = std::move(base);
  }

  /// Adds `adapter`, registering its modules() on this layer. Throws Error when a module name
  /// is already taken on this layer.
  void add_adapter(std::shared_ptr<LinearAdapter> adapter) {
    TR_CHECK(adapter != nullptr, "Linear::add_adapter: adapter must not be null");
    for (auto& [name, m] : adapter->modules()) {
      TR_CHECK(!named_children().contains(name), "Linear::add_adapter: the layer already has a "
               "submodule '", name, "'");
      register_module(name, m);
    }
    adapters_.push_back(std::move(adapter));
  }

  /// The installed base, or nullptr when the weight is dense.
  const std::shared_ptr<LinearBase>& base() const { return base_; }
  /// The adapters, in the order they were added.
  const std::vector<std::shared_ptr<LinearAdapter>>& adapters() const { return adapters_; }

  /// The weight the base computes with, float32 [out, in], detached (the dense parameter's
  /// values, or the dequantized base).
  at::Tensor base_weight() {
    if (base_) return base_->dequantized_weight();
    return weight.detach().to(at::kFloat);
  }
  /// base_weight() plus every adapter's delta_weight(): the dense weight that gives this
  /// layer's outputs (dropout off) without adapters. float32 [out, in].
  at::Tensor merged_weight() {
    c10::NoGradGuard no_grad;
    at::Tensor w = base_weight().clone();
    for (auto& a : adapters_) w.add_(a->delta_weight().to(w.device()));
    return w;
  }

  /// Keeps a `dtype` copy of the dense weight for CPU autocast to `dtype`, when the weight is
  /// frozen (requires_grad false: a LoRA base), float32, on the CPU and resident (its storage
  /// allocated now, outside a forward: a weight a sharding strategy gathers per forward is not
  /// copied, so sharding keeps its memory). Autocast casts a weight that does not require grad
  /// again at every call (its cast cache holds only leaves that require grad); the copy is made
  /// once and used while autocast to `dtype` is on, and made again when the weight changed
  /// (another storage or an in-place write: a checkpoint loaded into it). Costs `dtype`'s bytes
  /// per weight element. Returns whether a copy is kept; a layer with a LinearBase keeps none.
  /// The core calls it for a v1::FrozenWeightCopies precision (bf16-mixed), after the strategy's
  /// setup and before the first forward.
  bool keep_frozen_weight_copy(at::ScalarType dtype) {
    frozen_copy_ = at::Tensor();
    if (base_ || !weight.defined() || weight.requires_grad() ||
        weight.scalar_type() != at::kFloat || !weight.device().is_cpu() || weight.numel() == 0 ||
        weight.storage().data() == nullptr)
      return false;
    frozen_copy_dtype_ = dtype;
    refresh_frozen_copy();
    return true;
  }
  /// The kept copy (undefined when none): the core's log and tests read it.
  const at::Tensor& frozen_weight_copy() const { return frozen_copy_; }

  torch::nn::LinearOptions options;
  /// [out_features, in_features]; undefined once a base is installed.
  at::Tensor weight;
  /// [out_features], or undefined without bias.
  at::Tensor bias;

 private:
  // The weight at::linear computes with: the kept copy under CPU autocast to its dtype, else
  // `weight` (autocast then casts it as before).
  const at::Tensor& compute_weight() {
    if (!frozen_copy_.defined() || !compat::autocast_enabled(c10::kCPU) ||
        compat::autocast_dtype(c10::kCPU) != frozen_copy_dtype_)
      return weight;
    if (weight.requires_grad()) {  // unfrozen since: the parameter itself must be used
      frozen_copy_ = at::Tensor();
      return weight;
    }
    if (weight.storage().data() != frozen_src_ || weight._version() != frozen_version_) {
      if (weight.storage().data() == nullptr) return weight;
      refresh_frozen_copy();
    }
    return frozen_copy_;
  }
  void refresh_frozen_copy() {
    c10::NoGradGuard no_grad;
    // A new tensor rather than a copy into the old one: a backward still pending may hold it.
    frozen_copy_ = weight.to(frozen_copy_dtype_);
    frozen_src_ = weight.storage().data();
    frozen_version_ = weight._version();
  }

  std::shared_ptr<LinearBase> base_;
  std::vector<std::shared_ptr<LinearAdapter>> adapters_;
  // ABI 1.11 (appended): the kept copy of keep_frozen_weight_copy. Only this header's inline
  // code reads them, in the plugin that built the layer.
  at::Tensor frozen_copy_;
  at::ScalarType frozen_copy_dtype_ = at::kBFloat16;
  const void* frozen_src_ = nullptr;
  int64_t frozen_version_ = 0;
};
TORCH_MODULE(Linear);

/// Whether `name` (a module's dotted path, "blocks.0.attn.c_attn") is selected by one of
/// `patterns`, with PEFT's rule for plain names (equal to the path, or its last dotted
/// components: "c_attn", "attn.c_attn") and fnmatch(3) globs ("c_*", "blocks.0.*") tried on the
/// path and on each such suffix. "all-linear" (PEFT's special value) selects every layer except
/// an output layer: "lm_head", or a sequence-classification head "score" / "classifier" (PEFT's
/// SEQ_CLS_HEAD_NAMES, which PEFT trains whole through modules_to_save instead).
inline bool module_name_matches(const std::string& name, const std::vector<std::string>& patterns) {
  for (const auto& p : patterns) {
    if (p == "all-linear") {
      bool head = false;
      for (const std::string h : {"lm_head", "score", "classifier"})
        head = head || name == h ||
               (name.size() > h.size() &&
                name.compare(name.size() - h.size() - 1, h.size() + 1, "." + h) == 0);
      if (!head) return true;
      continue;
    }
    const bool glob = p.find_first_of("*?[") != std::string::npos;
    // The path itself, then every suffix that starts after a '.'.
    for (size_t start = 0; start != std::string::npos;) {
      const std::string suffix = name.substr(start);
      if (glob ? fnmatch(p.c_str(), suffix.c_str(), 0) == 0 : suffix == p) return true;
      const size_t dot = name.find('.', start);
      start = dot == std::string::npos ? std::string::npos : dot + 1;
    }
  }
  return false;
}

/// One selected layer: its dotted path in the model and the layer.
struct NamedLinear {
  std::string name;
  std::shared_ptr<LinearImpl> layer;
};

/// The trainrun Linear layers of `model` selected by `targets` and not by `skips`
/// (module_name_matches), in registration order. `who` names the caller in errors
/// ("precision 'quant-nf4'"). Throws ConfigError naming the model (Model::describe()) when the
/// model is not a torch::nn::Module, when no trainrun Linear layer matches (then the message
/// lists the matching torch::nn::Linear layers, which cannot be converted: build them with
/// trainrun::v1::Linear), or (since ABI 1.15) when one entry of `targets` matches no Linear
/// layer at all: a misspelt entry beside a good one would otherwise train or convert less than
/// the job says. Those messages list the layers' short names ("q_proj, k_proj, ...", the last
/// dotted part of each path), not every path.
inline std::vector<NamedLinear> find_linear_layers(Model& model,
                                                   const std::vector<std::string>& targets,
                                                   const std::vector<std::string>& skips,
                                                   const std::string& who) {
  auto list = [](const std::vector<std::string>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", \"" : "\"") + v[i] + "\"";
    return s + "]";
  };
  torch::nn::Module* root = model.module();
  TR_CHECK_TYPED(ConfigError, root != nullptr, who, ": the model (", model.describe(),
                 ") is not a torch::nn::Module, so it has no trainrun Linear layers to convert");
  std::vector<NamedLinear> out;
  std::vector<std::string> plain, short_names;
  std::vector<bool> used(targets.size(), false);
  for (const auto& item : root->named_modules("", /*include_self=*/false)) {
    const std::string& name = item.key();
    auto l = std::dynamic_pointer_cast<LinearImpl>(item.value());
    const bool torch_linear =
        !l && std::dynamic_pointer_cast<torch::nn::LinearImpl>(item.value()) != nullptr;
    if (!l && !torch_linear) continue;
    const std::string last =
        name.substr(name.rfind('.') == std::string::npos ? 0 : name.rfind('.') + 1);
    if (std::find(short_names.begin(), short_names.end(), last) == short_names.end())
      short_names.push_back(last);
    for (size_t i = 0; i < targets.size(); ++i)
      if (!used[i] && module_name_matches(name, {targets[i]})) used[i] = true;
    if (l && module_name_matches(name, targets) && !module_name_matches(name, skips))
      out.push_back({name, l});
    else if (torch_linear && module_name_matches(name, targets))
      plain.push_back(name);
  }
  std::string names;
  for (size_t i = 0; i < short_names.size(); ++i) names += (i ? ", " : "") + short_names[i];
  const std::string hint =
      short_names.empty()
          ? std::string(
                "; it has no Linear layers built with trainrun::v1::Linear "
                "(trainrun/model/linear.hpp)")
          : "; its Linear layers are named " + names +
                " (an entry matches a layer's path or its last dotted parts, e.g. \"" +
                short_names.front() +
                "\"; globs such as \"*_proj\" too; \"all-linear\" selects "
                "all but the output layer)";
  for (size_t i = 0; i < targets.size(); ++i)
    TR_CHECK_TYPED(ConfigError, used[i], who, ": target_modules entry \"", targets[i],
                   "\" matches no layer of the model (", model.describe(), ")", hint);
  if (out.empty()) {
    std::string why =
        hint + (skips.empty() ? "" : "; skip_modules " + list(skips) + " excludes every match");
    if (!plain.empty())
      why = "; its layers " + list(plain) +
            " are torch::nn::Linear, which nothing outside the "
            "model can convert: build them with trainrun::v1::Linear (trainrun/model/linear.hpp)";
    TR_CHECK_TYPED(ConfigError, false, who, ": no trainrun Linear layers match target_modules ",
                   list(targets), " in the model (", model.describe(), ")", why);
  }
  return out;
}

}  // namespace trainrun::v1
