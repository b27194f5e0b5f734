// One training run in phases, as docs/design.md's step picture draws it: build (the constructor:
// run directory, components, capabilities, strategy setup) -> resume -> step (the loop) ->
// evaluate -> save -> finish. Each phase is one file in this folder; core::train (trainer.cpp)
// builds a Run and executes it. Private to the core: no plugin or app includes this header.
//
// Capabilities (the v1 interfaces a component may also implement) are resolved once, when the
// run is built; the loop only reads the pointers kept here.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <trainrun/interfaces.hpp>

#include "trainrun/core/config.hpp"
#include "trainrun/core/registry.hpp"
#include "trainrun/core/run_dir.hpp"
#include "trainrun/core/sampler.hpp"

namespace trainrun::core {

using Clock = std::chrono::steady_clock;

// A component plus the label that guarded calls put in front of its errors.
template <class T>
struct Slot {
  std::unique_ptr<T> obj;
  std::string label;
  template <class F>
  auto call(const char* op, F&& fn) {
    return guarded(label, op, [&] { return fn(*obj); });
  }
};

// Exit code of a run that diverged: its weights became non-finite, or it skipped more than
// [trainer] max_skipped_fraction of its steps (distinct from 1, an error, and 2, bad input).
constexpr int kDivergedExit = 3;

// Non-finite values over a run: which kind (loss, gradients, weights), when first, and the last
// step that was wholly finite, for the diagnosis of a run that diverged. Every rank records the
// same thing: the loss is the all-reduced one and the gradient check is agreed by the ranks.
struct DivergenceWatch {
  int64_t steps = 0, skipped = 0;
  int64_t bad_loss = 0, first_bad_loss = 0;
  int64_t bad_grads = 0, first_bad_grads = 0;
  int64_t last_good = -1;          ///< last step with a finite loss and gradients (-1: none yet)
  int64_t weights_bad_after = -1;  ///< found non-finite after this step (-1: not found)

  void record(int64_t step, bool loss_finite, bool grads_finite);
  bool too_many_skipped(double max_fraction) const;
  std::string diagnosis(double max_fraction, int64_t start_step) const;
};

// One step's micro-batches and this rank's [targets, tokens, samples] in them.
struct StepBatches {
  std::vector<v1::Batch> micro;
  double local[3] = {0, 0, 0};
};

// The figures of the step in progress, handed between the parts of Run::train_step.
struct StepState {
  Clock::time_point t0;
  double cpu0 = 0;  ///< process CPU seconds (every thread) when the step began
  int64_t epoch = 0;
  at::Tensor counts;  ///< the global [targets, tokens, samples] of this step
  std::shared_ptr<v1::Work> counts_work;
  double global_targets = 0;
  double loss_sum = 0;  ///< this rank's loss sum over its micro-batches
  bool prefetch = false;
  double elapsed_loop = 0;
  at::Tensor tail;  ///< [loss sum, next targets, tokens, samples, save, signal], summed over ranks
  std::shared_ptr<v1::Work> tail_work;
  bool finite = true;  ///< gradients finite, agreed by the ranks
  double grad_norm = 0;
  int64_t mem_model_state = 0;
  bool loss_finite = true;
};

class Run {
 public:
  /// The build phase (build.cpp): run directory, components, capabilities, strategy setup.
  Run(const JobConfig& job, const Registry& registry);
  /// resume -> steps -> finish; returns the process exit code (0, 130, kDivergedExit).
  int execute();

 private:
  // build.cpp
  void prepare_run_dir();
  void write_job() const;
  void build_components();
  void add_default_callbacks();
  void resolve_capabilities();
  void set_up_model();
  void set_up_checkpoints();
  void print_banner(size_t n_units);
  int64_t memory_now(bool peak);
  // resume.cpp
  void resume();
  void load_checkpoint(const std::string& resume);
  v1::CheckpointableStrategy& checkpointable() const;
  std::vector<v1::CheckpointPiece> optimizer_pieces();
  // step.cpp
  void start();
  void train_steps();
  bool train_step();
  StepBatches load_step(int64_t s);
  v1::Batch get_batch(v1::Split split, const std::vector<int64_t>& idx);
  void forward_backward(StepState& st);
  void issue_step_tail(StepState& st);
  void apply_gradients(StepState& st, std::vector<at::Tensor>& grads);
  void settle_step(StepState& st);
  void report_step(StepState& st);
  bool end_step(StepState& st);
  std::shared_ptr<v1::Work> sum_over_ranks(at::Tensor& t, const char* what);
  void wait(const std::shared_ptr<v1::Work>& w, const char* what);
  bool weights_finite_everywhere();
  // evaluate.cpp
  v1::EvalMetrics evaluate(int64_t step);
  // save.cpp
  void save_checkpoint_now(int64_t done, const char* reason);
  bool save_sharded_model();
  bool gather_final_state(bool quiet);
  void save_final_model();
  // finish.cpp
  int finish();
  void hand_over_final_state();
  int print_result(const v1::TrainSummary& summary, int stop_sig) const;

  const JobConfig& job_;
  const Registry& registry_;
  Clock::time_point t_start_;
  v1::RunContext ctx_;
  bool lead_ = false;
  bool rotate_here_ = false;
  std::unique_ptr<RunDirLock> run_dir_lock_;
  std::vector<std::string> runtime_lines_;

  // Components.
  Slot<v1::Accelerator> accelerator_;
  Slot<v1::Dataset> dataset_;
  Slot<v1::Model> model_;
  Slot<v1::Precision> precision_;
  Slot<v1::Strategy> strategy_;
  Slot<v1::Optimizer> optimizer_;
  std::vector<Slot<v1::Callback>> callbacks_;
  v1::Communicator* comm_ = nullptr;

  // Capabilities, resolved once in build.
  uint32_t data_abi_ = 0, strategy_abi_ = 0;
  v1::BatchFieldsReader* fields_reader_ = nullptr;
  std::vector<std::pair<std::string, v1::StepMetricsSource*>> metric_sources_;
  v1::CheckpointPolicy* policy_ = nullptr;
  v1::CheckpointableStrategy* checkpointable_ = nullptr;
  std::vector<std::pair<std::string, v1::CheckpointState*>> state_holders_;
  v1::ShardedStateDictSource* sharded_source_ = nullptr;
  std::vector<std::pair<Slot<v1::Callback>*, v1::FinalStateDictConsumer*>> state_consumers_;
  v1::FinalStateDictConsumer* model_consumer_ = nullptr;

  // The plan and the model as set up.
  bool device_memory_ = false;
  int64_t mem_baseline_ = 0;
  int64_t train_samples_ = 0, eval_samples_ = 0;
  v1::TrainPlan plan_;
  int64_t n_params_ = 0;
  std::string checkpointed_;
  std::vector<v1::NamedTensor> params_;
  std::string ckpt_root_;
  std::optional<DistributedSampler> sampler_;

  // [trainer] settings read once.
  int64_t stop_after_ = 0;
  double max_skipped_fraction_ = 0;
  double clip_ = 0;
  bool clip_by_value_ = false;
  int64_t log_every_ = 1, eval_every_ = 0, eval_max_batches_ = 0, eval_bs_ = 0;
  int64_t kill_at_ = -1;
  int kill_rank_ = 0;

  // Progress.
  int64_t start_step_ = 0;
  int64_t last_saved_step_ = -1;
  int64_t skipped_steps_ = 0;
  int64_t step_ = 0;
  bool stopped_early_ = false;
  bool diverged_ = false;
  DivergenceWatch watch_;
  StepBatches cur_, next_;
  bool next_counts_known_ = false;
  at::Tensor next_counts_;
  v1::EvalMetrics last_eval_;
  double samples_done_ = 0, tokens_done_ = 0;
  Clock::time_point t_loop_;
  std::vector<v1::NamedTensor> final_state_;
  bool have_final_state_ = false;
};

}  // namespace trainrun::core
