// What the build phase does to the model and the machine before the strategy sets up: initial
// weights, frozen parameters, activation checkpointing, the parameter count, the CPU runtime
// report, the checkpoint directory probe (declared in setup.hpp, called from build.cpp).
#include "setup.hpp"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <filesystem>
#include <fnmatch.h>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "trainrun/core/log.hpp"
#include "trainrun/core/runtime.hpp"
#include "trainrun/core/safetensors.hpp"
#include "trainrun/model/activation_checkpointing.hpp"
#include "trainrun/model/linear.hpp"

namespace fs = std::filesystem;

namespace trainrun::core {

using v1::ConfigError;

// [trainer] init_weights: every parameter and buffer of the model from a safetensors file, by
// name; a missing, extra or reshaped tensor is an error naming the file and the tensor, raised
// before anything trains.
void load_initial_weights(v1::Model& model, const std::string& path, const std::string& label) {
  std::map<std::string, at::Tensor> file;
  if (!fs::is_regular_file(path))
    throw ConfigError("[trainer] init_weights = \"" + path + "\": " +
                      (fs::is_directory(path) ? "is a directory (a sharded state dict? give one "
                                                "full model.safetensors)"
                                              : "no such file"));
  try {
    for (auto& t : read_safetensors(path, nullptr)) file[t.name] = t.tensor;
  } catch (const v1::Error& e) {
    throw ConfigError("[trainer] init_weights: " + std::string(e.what()));
  }
  std::vector<v1::NamedTensor> targets = model.named_parameters();
  for (auto& b : model.named_buffers()) targets.push_back(b);
  std::set<std::string> used;
  torch::NoGradGuard no_grad;
  for (auto& t : targets) {
    auto it = file.find(t.name);
    if (it == file.end())
      throw ConfigError("[trainer] init_weights = \"" + path + "\": no tensor '" + t.name +
                        "' for " + label);
    if (it->second.sizes() != t.tensor.sizes())
      throw ConfigError("[trainer] init_weights = \"" + path + "\": tensor '" + t.name +
                        "' has shape " + c10::str(it->second.sizes()) + ", the model's has " +
                        c10::str(t.tensor.sizes()));
    if (it->second.is_floating_point() && !torch::isfinite(it->second).all().item<bool>()) {
      const int64_t nan = torch::isnan(it->second).sum().item<int64_t>();
      const int64_t inf = torch::isinf(it->second).sum().item<int64_t>();
      throw ConfigError("[trainer] init_weights = \"" + path + "\": tensor '" + t.name + "' holds " +
                        std::to_string(nan) + " NaN and " + std::to_string(inf) + " infinite value(s)");
    }
    t.tensor.copy_(it->second);
    used.insert(t.name);
  }
  for (const auto& [name, _] : file)
    if (!used.count(name))
      throw ConfigError("[trainer] init_weights = \"" + path + "\": tensor '" + name +
                        "' is not a parameter or buffer of " + label);
  log_info("init_weights: " + std::to_string(targets.size()) + " tensors loaded from " + path);
}

// [trainer] freeze: requires_grad off for every parameter whose name matches one of the
// patterns (fnmatch globs). A pattern that matches nothing is a ConfigError naming it, since a
// typo would otherwise silently train everything. Returns "k of n parameters" ("" = none).
std::string freeze_parameters(const v1::Options& trainer, v1::Model& model) {
  const auto& patterns = trainer.get_string_list("freeze");
  if (patterns.empty()) return "";
  const auto params = model.named_parameters();
  std::set<std::string> frozen;
  for (const auto& pat : patterns) {
    bool hit = false;
    for (const auto& p : params)
      if (fnmatch(pat.c_str(), p.name.c_str(), 0) == 0) {
        hit = true;
        frozen.insert(p.name);
      }
    if (!hit)
      throw ConfigError("[trainer] freeze: \"" + pat + "\" matches no parameter (names look like \"" +
                        (params.empty() ? std::string("?") : params.front().name) + "\")");
  }
  torch::NoGradGuard no_grad;
  int64_t n = 0, total = 0;
  for (auto& p : params) {
    total += p.tensor.numel();
    if (frozen.count(p.name)) {
      p.tensor.requires_grad_(false);
      n += p.tensor.numel();
    }
  }
  return std::to_string(frozen.size()) + " parameters frozen (" + std::to_string(n) + " of " +
         std::to_string(total) + " elements)";
}

// The model's parameter count for the banner. A Linear layer whose weight a Precision replaced
// by a frozen quantized base holds packed bytes and quantization constants as parameters; it
// counts as its in x out weights, as PEFT's print_trainable_parameters counts a 4-bit weight.
int64_t count_model_parameters(v1::Model& model) {
  std::set<const void*> quant_state;
  int64_t n = 0;
  if (torch::nn::Module* root = model.module())
    for (const auto& item : root->named_modules("", false))
      if (auto l = std::dynamic_pointer_cast<v1::LinearImpl>(item.value()); l && l->base()) {
        n += l->options.in_features() * l->options.out_features();
        for (const auto& q : l->named_parameters(/*recurse=*/false))
          if (q.key() != "bias") quant_state.insert(q.value().unsafeGetTensorImpl());
      }
  for (const auto& p : model.named_parameters())
    if (!quant_state.count(p.tensor.unsafeGetTensorImpl())) n += p.tensor.numel();
  return n;
}

// A checkpoint directory that cannot be written is bad input found at the start, not at the
// first save (possibly hours later): create it and write and remove a probe file.
void check_checkpoint_dir_writable(const std::string& dir, int rank) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  bool ok = !ec;
  if (ok) {
    const fs::path probe = fs::path(dir) / (".write-test-rank-" + std::to_string(rank));
    std::ofstream f(probe);
    f << "trainrun\n";
    f.close();
    ok = f.good();
    std::error_code ignored;
    fs::remove(probe, ignored);
  }
  if (!ok)
    throw ConfigError("checkpoint directory " + dir + " is not writable (" +
                      (ec ? ec.message() : std::string("cannot create files in it")) +
                      "): fix its permissions or set the checkpoint callback's dir");
}

// [trainer] activation_checkpointing: a checkpointer on every unit of the model, or on those
// named in activation_checkpointing_units. Returns "k of n units" for the banner ("" = off).
std::string install_activation_checkpointing(const v1::Options& trainer, Slot<v1::Model>& model) {
  const bool on = trainer.get_bool("activation_checkpointing");
  const auto& only = trainer.get_string_list("activation_checkpointing_units");
  if (!on) {
    if (!only.empty())
      throw ConfigError("[trainer] activation_checkpointing_units is set, but "
                        "activation_checkpointing = false; set activation_checkpointing = true");
    return "";
  }
  const std::vector<v1::Unit*> units = model.call("units", [](v1::Model& m) { return m.units(); });
  if (units.empty())
    throw ConfigError("[trainer] activation_checkpointing = true, but the model (" + model.label +
                      ") has no units: only a model that runs parts of its forward through "
                      "Unit::run(input, fn) can recompute them (e.g. gpt's blocks)");
  std::string names;
  for (const v1::Unit* u : units) names += (names.empty() ? "" : ", ") + u->name();
  for (const auto& want : only) {
    bool found = false;
    for (const v1::Unit* u : units) found = found || u->name() == want;
    if (!found)
      throw ConfigError("[trainer] activation_checkpointing_units: the model has no unit '" + want +
                        "'; its units are " + names);
  }
  size_t n = 0;
  for (v1::Unit* u : units) {
    if (!only.empty() && std::find(only.begin(), only.end(), u->name()) == only.end()) continue;
    v1::enable_activation_checkpointing(*u);
    ++n;
  }
  return std::to_string(n) + " of " + std::to_string(units.size()) + " units";
}

// Each rank reads its CPU runtime back from the libraries and the kernel (thread pools, BLAS
// kernel, affinity), writes it to <run_dir>/runtime/rank-N.json, and the ranks all-gather the
// numbers so rank 0's banner shows every rank. Returns the banner lines (used on rank 0).
std::vector<std::string> report_runtime(Slot<v1::Accelerator>& accelerator, const v1::RunContext& ctx) {
  const v1::cpu::Readback rb = v1::cpu::read_back();
  const char* choice = std::getenv("TRAINRUN_BLAS_CHOICE");
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  {
    nlohmann::ordered_json j;
    j["rank"] = ctx.rank;
    char host[256] = {};
    j["host"] = gethostname(host, sizeof host - 1) == 0 ? host : "?";  // where a launcher put the rank
    j["local_rank"] = ctx.local_rank;
    j["local_world_size"] = ctx.local_world_size;
    j["intra_op_threads"] = rb.intra_op;
    j["inter_op_threads"] = rb.inter_op;
    j["blas"] = {{"openblas", rb.blas.openblas}, {"config", rb.blas.config},
                 {"corename", rb.blas.corename}, {"threads", rb.blas.threads},
                 {"choice", choice ? choice : ""}, {"OPENBLAS_CORETYPE", coretype ? coretype : ""}};
    j["affinity"] = rb.affinity;
    j["threads_total"] = rb.threads_total;
    j["threads_elsewhere"] = rb.threads_elsewhere;
    const fs::path dir = fs::path(ctx.run_dir) / "runtime";
    fs::create_directories(dir);
    std::ofstream f(dir / ("rank-" + std::to_string(ctx.rank) + ".json"));
    f << j.dump(2) << "\n";
  }
  constexpr int64_t kFields = 8;
  const int64_t first = rb.affinity.empty() ? -1 : rb.affinity.front();
  const int64_t last = rb.affinity.empty() ? -1 : rb.affinity.back();
  torch::Tensor mine = torch::tensor(
      {int64_t{rb.intra_op}, int64_t{rb.inter_op}, int64_t{rb.blas.threads},
       static_cast<int64_t>(rb.affinity.size()), first, last, int64_t{rb.threads_elsewhere},
       int64_t{rb.threads_total}},
      torch::kLong);
  torch::Tensor all = torch::empty({ctx.world_size * kFields}, torch::kLong);
  accelerator.call("all_gather (runtime report)", [&](v1::Accelerator& a) {
    a.communicator().all_gather(mine, all)->wait();
    return 0;
  });
  std::vector<std::string> lines;
  lines.push_back(libtorch_build_text() + " | " +
                  (rb.blas.openblas ? rb.blas.config : std::string("BLAS: not OpenBLAS")));
  lines.push_back("BLAS " + std::string(choice ? choice : ("kernel " + rb.blas.corename)));
  std::string ranks;
  const auto a = all.accessor<int64_t, 1>();
  const int shown = std::min(ctx.world_size, 8);
  for (int r = 0; r < shown; ++r) {
    const int64_t* v = &a[r * kFields];
    std::ostringstream os;
    os << "rank " << r << ": intra-op " << v[0] << ", inter-op " << v[1] << ", BLAS " << v[2]
       << ", CPU" << (v[3] == 1 ? " " : "s ");
    if (v[3] == v[5] - v[4] + 1) os << (v[3] == 1 ? std::to_string(v[4]) : std::to_string(v[4]) + "-" + std::to_string(v[5]));
    else os << v[3] << " of " << v[4] << "-" << v[5];
    if (v[6] > 0) os << " (" << v[6] << " of " << v[7] << " threads elsewhere)";
    ranks += (ranks.empty() ? "" : " | ") + os.str();
  }
  if (ctx.world_size > shown) ranks += " | ... (" + std::to_string(ctx.world_size - shown) + " more)";
  lines.push_back(ranks);
  return lines;
}

}  // namespace trainrun::core
