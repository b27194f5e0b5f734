// The save phase: a checkpoint (the policy's, a signal's, the end's) through the core's
// checkpoint I/O with the strategy's pieces, and the final model (model.safetensors, or each
// rank's pieces under state_dict_type = "sharded").
#include "run.hpp"

#include <torch/types.h>
#include <torch/utils.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "stop_signal.hpp"
#include "trainrun/core/checkpoint.hpp"
#include "trainrun/core/log.hpp"
#include "trainrun/core/safetensors.hpp"

namespace fs = std::filesystem;

namespace trainrun::core {

void Run::save_checkpoint_now(int64_t done, const char* reason) {
  const auto t0 = Clock::now();
  auto& c = checkpointable();
  stop::control_message("saving " + std::to_string(done));
  // Test hook for the launcher's stop protocol: a save that takes this many seconds longer.
  if (const char* d = std::getenv("TRAINRUN_TEST_SAVE_DELAY_S"))
    std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(d)));
  CheckpointSaveRequest req;
  req.root = env_.ckpt_root;
  req.step = done;
  req.steps_per_epoch = plan_->steps().steps_per_epoch;
  req.global_batch_size = plan_->steps().global_batch_size;
  req.total_steps = plan_->steps().total_steps;
  req.rank = env_.ctx.rank;
  req.world_size = env_.ctx.world_size;
  req.keep_last = caps_.policy ? caps_.policy->checkpoint_settings().keep_last : 0;
  req.reason = reason;
  nlohmann::json plugins = nlohmann::json::array();
  auto add_plugin = [&](const char* role, const ComponentConfig& cc) {
    plugins.push_back({{"role", role}, {"component", cc.plugin},
                       {"plugin", cc.info ? cc.info->plugin_name : ""},
                       {"version", cc.info ? cc.info->plugin_version : ""}});
  };
  add_plugin("model", job_.model);
  add_plugin("data", job_.data);
  add_plugin("strategy", job_.strategy);
  add_plugin("accelerator", job_.accelerator);
  add_plugin("precision", job_.precision);
  add_plugin("optimizer", job_.optimizer);
  for (const auto& cb : job_.callbacks) add_plugin("callback", cb);
  req.job = {{"file", job_.file}, {"strategy", job_.strategy.plugin}, {"plugins", plugins},
             {"toml", job_.resolved_toml}};
  req.trainer_state = {{"skipped_steps", progress_.skipped_steps}, {"seed", env_.ctx.seed}};
  for (auto& [key, holder] : caps_.state_holders) req.component_state[key] = holder->checkpoint_state();
  req.model = parts_.strategy.call("model_checkpoint_pieces", [&](v1::Strategy&) { return c.model_checkpoint_pieces(); });
  for (auto& p : expert_pieces(false)) req.model.push_back(std::move(p));
  req.optimizer = optimizer_pieces();
  const std::string path = save_checkpoint(req, env_.ctx.world_size > 1 ? parts_.comm : nullptr);
  progress_.last_saved_step = done;
  stop::control_message("saved " + std::to_string(done));
  if (caps_.policy) caps_.policy->on_checkpoint_saved(done, path);
  if (env_.lead)
    log_info("checkpoint " + path + " (step " + std::to_string(done) + ", " + reason + ") written in " +
             std::to_string(std::chrono::duration<double>(Clock::now() - t0).count()) + " s");
}

// state_dict_type = "sharded": every rank writes its own pieces, nothing is gathered. Each
// file's metadata maps a tensor to its whole shape and the offset of its piece, so the files of
// all ranks rebuild the model under any layout.
bool Run::save_sharded_model() {
  if (caps_.sharded_source == nullptr) {
    if (env_.lead)
      log_warn("[trainer] state_dict_type = \"sharded\": strategy '" + job_.strategy.plugin +
               "' has no sharded state dict; writing the full one");
    return false;
  }
  auto pieces = parts_.strategy.call("sharded_state_dict", [&](v1::Strategy&) { return caps_.sharded_source->sharded_state_dict(); });
  for (auto& p : expert_pieces(false))
    if (p.writer) pieces.push_back(std::move(p.piece));
  nlohmann::json index = nlohmann::json::object();
  std::vector<v1::NamedTensor> tensors;
  for (auto& p : pieces) {
    index[p.name] = {{"shape", p.shape}, {"offset", p.offset}};
    tensors.push_back({p.name, p.data.contiguous()});
  }
  const fs::path dir = fs::path(env_.ctx.run_dir) / "model-shards";
  fs::create_directories(dir);
  const std::string path = (dir / ("rank-" + std::to_string(env_.ctx.rank) + "-of-" +
                                   std::to_string(env_.ctx.world_size) + ".safetensors")).string();
  write_safetensors(path, tensors, {{"format", "pt"}, {"trainrun_step", std::to_string(progress_.step)},
                                    {"trainrun_strategy", job_.strategy.plugin},
                                    {"trainrun_rank", std::to_string(env_.ctx.rank)},
                                    {"trainrun_world_size", std::to_string(env_.ctx.world_size)},
                                    {"trainrun_pieces", index.dump()}});
  if (env_.lead) log_info("wrote " + dir.string() + "/rank-*-of-" + std::to_string(env_.ctx.world_size) + ".safetensors");
  return true;
}

// Every rank asks (a sharded strategy gathers, which is a collective); rank 0 uses it.
bool Run::gather_final_state(bool quiet) {
  if (progress_.final_state) return true;
  try {
    progress_.final_state = parts_.strategy.call("full_state_dict", [](v1::Strategy& s) { return s.full_state_dict(); });
    for (auto& t : gather_experts()) progress_.final_state->push_back(std::move(t));
  } catch (const v1::NotSupportedError& e) {
    if (env_.lead && !quiet) log_warn(std::string("model.safetensors not written: ") + e.what());
    return false;
  }
  return true;
}

void Run::save_final_model() {
  if (job_.trainer.get_string("state_dict_type") == "sharded" && save_sharded_model()) return;
  if (!gather_final_state(false)) return;
  if (!env_.lead) return;
  const std::string path = (fs::path(env_.ctx.run_dir) / "model.safetensors").string();
  write_safetensors(path, *progress_.final_state, {{"format", "pt"}, {"trainrun_step", std::to_string(progress_.step)},
                                         {"trainrun_strategy", job_.strategy.plugin}});
  log_info("wrote " + path);
}

}  // namespace trainrun::core
