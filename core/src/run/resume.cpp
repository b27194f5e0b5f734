// The resume phase: an explicit [trainer] resume or an elastic restart's latest checkpoint,
// verified, checked against this job, then loaded into the strategy, the optimizer and every
// component with checkpoint state; the data order and the RNG streams continue from it.
#include "run.hpp"

#include <torch/types.h>
#include <torch/utils.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "trainrun/core/checkpoint.hpp"
#include "trainrun/core/launcher.hpp"
#include "trainrun/core/log.hpp"

namespace fs = std::filesystem;

namespace trainrun::core {

using v1::ConfigError;

namespace {

// What a resume would silently change, checked against the checkpoint's metadata before any
// tensor is read: another optimizer is an error (its state would be dropped), another seed and
// an init_weights that resume overrides are warnings saying what the run does.
void check_resume(const nlohmann::json& meta, const JobConfig& job, const std::string& path,
                  uint64_t seed, bool from_restart, bool lead) {
  std::string saved_optimizer;
  for (const auto& p : meta.at("job").value("plugins", nlohmann::json::array()))
    if (p.value("role", std::string()) == "optimizer") saved_optimizer = p.value("component", std::string());
  if (!saved_optimizer.empty() && saved_optimizer != job.optimizer.plugin)
    throw ConfigError("[trainer] resume: checkpoint " + path + " was written with [optimizer] plugin = \"" +
                      saved_optimizer + "\", this run uses \"" + job.optimizer.plugin +
                      "\": its optimizer state (e.g. moments) would be dropped. Resume with the same "
                      "optimizer, or start a new run from its weights (`trainrun consolidate " + path +
                      " DIR`, then [trainer] init_weights = \"DIR/model.safetensors\")");
  if (!lead) return;
  const auto& ts = meta.at("trainer_state");
  if (ts.contains("seed") && ts.at("seed").get<uint64_t>() != seed)
    log_warn("resume: checkpoint " + path + " was written with [trainer] seed = " + ts.at("seed").dump() +
             ", this run uses " + std::to_string(seed) + ": the data order of the current epoch is "
             "drawn again from the new seed (samples of this epoch may repeat or be left out) and "
             "dropout streams differ; the run is not the continuation of the checkpointed one");
  if (!job.trainer.get_string("init_weights").empty() && !from_restart)
    log_warn("resume: [trainer] init_weights = \"" + job.trainer.get_string("init_weights") +
             "\" is ignored: the weights come from checkpoint " + path);
}

}  // namespace

v1::CheckpointableStrategy& Run::checkpointable() const {
  if (caps_.checkpointable == nullptr)
    throw v1::NotSupportedError(parts_.strategy.label + " does not support checkpoints: it has no "
                                "CheckpointableStrategy capability (ABI 1.4); drop the "
                                "`checkpoint` callback and [trainer] resume, or use a "
                                "strategy that has it");
  return *caps_.checkpointable;
}

std::vector<v1::CheckpointPiece> Run::optimizer_pieces() {
  auto& c = checkpointable();
  auto params = parts_.strategy.call("optimizer_parameter_pieces", [&](v1::Strategy&) { return c.optimizer_parameter_pieces(); });
  for (auto& p : expert_pieces(true)) params.push_back(std::move(p));
  auto state = parts_.optimizer.call("state", [](v1::Optimizer& o) { return o.state(); });
  return optimizer_state_pieces(params, state);
}

void Run::resume() {
  std::string resume = job_.trainer.get_string("resume");
  if (const auto restart = restart_of_this_job(); restart && resume.empty()) {
    // An elastic restart ([launch] max_restarts) or a requeued SLURM job: continue from the
    // latest checkpoint if any (a first run that set resume = "latest" would fail on none).
    const bool any = fs::exists(fs::path(env_.ckpt_root) / "latest");
    if (env_.lead)
      log_info(*restart + ": " +
               (any ? "resuming from the latest checkpoint in " + env_.ckpt_root
                    : "no checkpoint in " + env_.ckpt_root + " yet, starting from step 0"));
    if (any) resume = "latest";
  }
  if (!resume.empty()) load_checkpoint(resume);
}

void Run::load_checkpoint(const std::string& resume) {
  const auto t0 = Clock::now();
  const std::string path = resolve_checkpoint(resume, env_.ckpt_root, env_.lead);
  nlohmann::json meta;
  try {
    meta = verify_checkpoint(path);
  } catch (const CheckpointError& e) {
    // A damaged checkpoint is bad input (exit 2), and there may be an intact older one.
    throw v1::ConfigError(std::string("[trainer] resume = \"") + resume + "\": " + e.what() +
                          (resume == "latest-valid"
                               ? std::string()
                               : "; resume = \"latest-valid\" falls back to the newest checkpoint that verifies"));
  }
  check_resume(meta, job_, path, env_.ctx.seed, job_.trainer.get_string("resume").empty(), env_.lead);
  auto& c = checkpointable();
  auto model_pieces = parts_.strategy.call("model_checkpoint_pieces", [&](v1::Strategy&) { return c.model_checkpoint_pieces(); });
  for (auto& p : expert_pieces(false)) model_pieces.push_back(std::move(p));
  load_checkpoint_pieces(path, meta, "model", model_pieces);
  auto opt_pieces = optimizer_pieces();
  load_checkpoint_pieces(path, meta, "optimizer", opt_pieces);
  parts_.strategy.call("after_checkpoint_load", [&](v1::Strategy&) { c.after_checkpoint_load(); return 0; });
  const auto& states = meta.at("component_state");
  for (auto& [key, holder] : caps_.state_holders) {
    if (!states.contains(key)) {
      if (env_.lead) log_warn("checkpoint " + path + " holds no state for the " + key + "; it starts fresh");
      continue;
    }
    holder->load_checkpoint_state(states.at(key).get<std::map<std::string, double>>());
  }
  // progress_.last_saved_step stays -1: a resumed run writes its own end checkpoint even at the step it
  // loaded (into its own checkpoint directory, which is how a checkpoint is converted to
  // another layout).
  progress_.start_step = meta.at("step").get<int64_t>();
  progress_.skipped_steps = meta.at("trainer_state").value("skipped_steps", int64_t{0});
  const bool rng = restore_rng_state(meta, env_.ctx.rank, env_.ctx.world_size);
  if (env_.lead) {
    const int saved_world = meta.at("world_size").get<int>();
    log_info("resumed from " + path + " at step " + std::to_string(progress_.start_step) + " (written by " +
             meta.at("job").value("strategy", std::string("?")) + " at world size " +
             std::to_string(saved_world) + ") in " +
             std::to_string(std::chrono::duration<double>(Clock::now() - t0).count()) + " s");
    if (!rng)
      log_info("the checkpoint's RNG states are per rank of world size " + std::to_string(saved_world) +
               "; this run's ranks keep their seeded streams");
    if (meta.at("global_batch_size").get<int64_t>() != plan_->steps().global_batch_size)
      log_warn("checkpoint global_batch_size " + meta.at("global_batch_size").dump() +
               " differs from this run's " + std::to_string(plan_->steps().global_batch_size) +
               ": the data order continues from step " + std::to_string(progress_.start_step) + " of the new layout");
    if (meta.at("total_steps").get<int64_t>() != plan_->steps().total_steps)
      log_warn("checkpoint total_steps " + meta.at("total_steps").dump() + " differs from this run's " +
               std::to_string(plan_->steps().total_steps) + ": a step-dependent LR schedule changes");
  }
  TR_CHECK_TYPED(ConfigError, progress_.start_step <= plan_->steps().total_steps, "[trainer] resume: the checkpoint is at step ",
                 progress_.start_step, ", past this run's ", plan_->steps().total_steps, " steps");
}

}  // namespace trainrun::core
