// One training run in phases, as docs/design.md's step picture draws it: build (the constructor:
// run directory, components, capabilities, strategy setup) -> resume -> step (the loop) ->
// evaluate -> save -> finish. Each phase is one file in this folder; core::train (trainer.cpp)
// builds a Run and executes it. Private to the core: no plugin or app includes this header.
//
// The Run owns its state as four small parts, each written by one phase and read by the later
// ones: the Environment and the Components (build), the Capabilities (resolved once in build:
// the loop only reads the pointers), the RunPlan (build: what the run will do) and the Progress
// (resume, then the steps); where the run stands is one RunState, not a set of flags.
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
#include <trainrun/generation.hpp>
#include <trainrun/objective.hpp>
#include <trainrun/rollout.hpp>

#include "trainrun/core/config.hpp"
#include "trainrun/core/registry.hpp"
#include "trainrun/core/rewards.hpp"
#include "trainrun/core/run_dir.hpp"
#include "trainrun/core/plan.hpp"
#include "trainrun/core/sampler.hpp"

namespace trainrun::v1 {
class ExpertParallelModel;  // model/expert_parallel.hpp
struct GenerationRequest;   // batch_generation.hpp
struct GenerationResult;
}  // namespace trainrun::v1

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
  std::vector<std::vector<int64_t>> indices;  ///< the train split's samples of each micro-batch
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
  /// [loss sum, next targets, tokens, samples, save, signal, then the objective's metrics as
  /// (sum, count) pairs], summed over ranks
  at::Tensor tail;
  std::vector<std::string> objective_metrics;  ///< names of the tail's pairs, in order
  std::shared_ptr<v1::Work> tail_work;
  bool finite = true;  ///< gradients finite, agreed by the ranks
  double grad_norm = 0;
  int64_t mem_model_state = 0;
  bool loss_finite = true;
};

// Where a run stands. The ways training ends are states of their own because finish() tells
// them apart (exit code, summary line, whether the end checkpoint, the final evaluation and the
// model are written). Evaluating and saving happen inside Training, on every rank at the same
// step, and leave the run where it was, so they are no states.
enum class RunState {
  Building,      ///< the constructor: components, capabilities, plan, strategy setup
  Resuming,      ///< loading a checkpoint, if any
  Training,      ///< the loop
  StoppedEarly,  ///< [trainer] stop_after_steps reached (or resumed at or past it)
  Interrupted,   ///< SIGINT/SIGTERM on some rank, agreed by all
  Diverged,      ///< non-finite weights (in the loop or at the end), or too many skipped steps
  Finished,      ///< every step done, no signal: final evaluation and model follow
};

// What this process is and where it writes, fixed in build. lead, rotate_here and
// device_memory are facts of the environment read once, not state that changes.
struct Environment {
  Clock::time_point t_start;
  v1::RunContext ctx;
  bool lead = false;         ///< rank 0: prints, writes job.toml and the final model
  bool rotate_here = false;  ///< no agent rotated run_dir: this run does (build.cpp)
  bool device_memory = false;  ///< mem_* metrics from the accelerator, not the CPU tracker
  int64_t mem_baseline = 0;
  std::unique_ptr<RunDirLock> run_dir_lock;
  std::vector<std::string> runtime_lines;
  std::string ckpt_root;
};

// The components the registry built, with the communicator of the accelerator.
struct Components {
  Slot<v1::Accelerator> accelerator;
  Slot<v1::Dataset> dataset;
  Slot<v1::Model> model;
  Slot<v1::Precision> precision;
  Slot<v1::Strategy> strategy;
  Slot<v1::Optimizer> optimizer;
  std::vector<Slot<v1::Callback>> callbacks;
  Slot<v1::Objective> objective;       ///< ABI 1.8; obj null: the model's own loss
  std::unique_ptr<RewardSet> rewards;  ///< [[rewards]], created for an online objective
  v1::Communicator* comm = nullptr;
  std::vector<v1::NamedTensor> params;  ///< what the strategy hands the optimizer
};

// The capability interfaces the components implement, looked up once (build.cpp).
struct Capabilities {
  uint32_t data_abi = 0, strategy_abi = 0;
  v1::BatchFieldsReader* fields_reader = nullptr;
  std::vector<std::pair<std::string, v1::StepMetricsSource*>> metric_sources;
  v1::CheckpointPolicy* policy = nullptr;
  v1::CheckpointableStrategy* checkpointable = nullptr;
  std::vector<std::pair<std::string, v1::CheckpointState*>> state_holders;
  v1::ShardedStateDictSource* sharded_source = nullptr;
  std::vector<std::pair<Slot<v1::Callback>*, v1::FinalStateDictConsumer*>> state_consumers;
  v1::FinalStateDictConsumer* model_consumer = nullptr;
  v1::ObjectiveModel* objective_model = nullptr;  ///< set when the job has an [objective]
  v1::AdapterSwitch* adapters = nullptr;          ///< a callback that can switch adapters off
  v1::ObjectiveExtremes* extremes = nullptr;      ///< the objective's minima/maxima (ABI 1.9)
  v1::SampleValues* sample_values = nullptr;      ///< the dataset's per-sample values (ABI 1.10)
  v1::OnlineObjective* online = nullptr;          ///< ABI 1.12: the objective trains on rollouts
  v1::RolloutSpec rollout;                        ///< its spec, read once (online only)
  v1::PromptSource* prompts = nullptr;            ///< the dataset's prompts (online only)
  v1::IncrementalDecoder* decoder = nullptr;      ///< the model's KV-cache decoder (online only)
};

// [parallel] ep (experts.cpp): the model's experts split over groups of ep consecutive ranks;
// the core does for them what the strategy does for the other parameters.
struct ExpertShards {
  v1::ExpertParallelModel* model = nullptr;  ///< null: ep = 1, every rank holds every expert
  int ep = 1;
  std::shared_ptr<v1::Communicator> group;     ///< the ranks sharing the experts out
  std::shared_ptr<v1::Communicator> replicas;  ///< the ranks holding the same experts
  std::vector<v1::NamedTensor> params;         ///< this rank's experts, frozen ones included
  std::vector<v1::NamedTensor> trainable;      ///< the ones the optimizer updates
  /// Measured after the first step: this rank's expert parameters, gradients and optimizer
  /// state in bytes (any ep, 1 included, for a model with experts); -1 = not measured.
  double state_bytes = -1;
};

// How the reference model of an objective with Objective::reference_width() > 0 is computed.
enum class ReferenceMode {
  None,         ///< no objective, or one without a reference
  AdaptersOff,  ///< the policy with its adapters switched off, per micro-batch
  Precomputed,  ///< the initial model, once, before training (Progress::reference)
};

// What the run will do, decided in build: the batch layout and its data order, the split sizes,
// the model as set up, and the [trainer] settings the loop reads. clip_by_value is the
// [trainer] gradient_clip_algorithm, a setting.
struct RunPlan {
  BatchPlan batches;
  int64_t train_samples = 0, eval_samples = 0;
  int64_t n_params = 0;
  std::string checkpointed;  ///< activation checkpointing, for the banner ("" = off)
  int64_t stop_after = 0;
  double max_skipped_fraction = 0;
  double clip = 0;
  bool clip_by_value = false;
  int64_t log_every = 1, eval_every = 0, eval_max_batches = 0, eval_batch_size = 0;
  bool eval_on_start = false;
  ReferenceMode reference = ReferenceMode::None;
  int64_t kill_at = -1;  ///< test hook TRAINRUN_TEST_SIGKILL_AT_STEP (-1: off)
  int kill_rank = 0;

  const v1::TrainPlan& steps() const { return batches.steps; }
};

// One rollout of an online objective on this rank: the prompt batch it completed (the sampler's
// step), its micro-batches (rows = completions), and what making it took.
struct Rollout {
  int64_t batch = -1;
  StepBatches batches;
  bool fresh = true;  ///< made for the step in progress (not reused from an earlier one)
  double generation_s = 0, generated_tokens = 0, reward_s = 0;
};

// What changes as the run trains. The prefetched counts and the gathered final state are
// optional values: present or not, never a flag beside a value.
struct Progress {
  int64_t start_step = 0;
  int64_t last_saved_step = -1;
  int64_t skipped_steps = 0;
  int64_t step = 0;
  DivergenceWatch watch;
  StepBatches cur, next;
  std::optional<at::Tensor> next_counts;  ///< the next step's counts, summed with this step's loss
  v1::EvalMetrics last_eval;
  double samples_done = 0, tokens_done = 0;
  Clock::time_point t_loop;
  std::optional<std::vector<v1::NamedTensor>> final_state;
  /// ReferenceMode::Precomputed: float64 [samples, reference_width] per split [train, eval].
  at::Tensor reference[2];
  std::optional<Rollout> rollout;  ///< an online objective's current rollout
};

// The [eval] tasks, their tokenizer and the model's answers to them (eval_tasks.cpp).
struct EvalTasks;

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
  void end_evaluation(int64_t step, v1::EvalMetrics& em, Clock::time_point t0);
  // objective.cpp
  void set_up_objective();
  void prepare_reference();
  v1::ModelOutput objective_forward(v1::Split split, const v1::Batch& batch,
                                    const std::vector<int64_t>& indices, bool filler);
  std::vector<v1::ObjectiveMetric> objective_metrics(v1::Split split);
  // rollout_phase.cpp
  void set_up_online_objective();
  void check_online_reference();
  StepBatches rollout_step(int64_t s);
  void make_rollout(int64_t batch);
  v1::GenerationRequest rollout_request();
  std::unique_ptr<v1::Scope> whole_parameters(const std::string& who);
  v1::GenerationResult generate_whole(const v1::GenerationRequest& req, const char* what);
  std::vector<v1::RewardSample> reward_samples(const std::vector<v1::PromptSample>& prompts,
                                               const v1::GenerationResult& gen);
  void score_rollout(Rollout& r, const std::vector<v1::PromptSample>& prompts,
                     const v1::GenerationResult& gen);
  void cut_rollout(Rollout& r, const std::vector<v1::PromptSample>& prompts,
                   const v1::GenerationResult& gen);
  void rollout_passes();
  void add_rollout_metrics(std::map<std::string, double>& extra) const;
  uint32_t abi_minor_of_model() const;
  v1::EvalMetrics evaluate_rollouts(int64_t step);
  // eval_tasks.cpp
  void set_up_eval_tasks();
  void evaluate_tasks(int64_t step, v1::EvalMetrics& em);
  // experts.cpp
  void set_up_experts();
  void sync_expert_gradients();
  double expert_grad_sq();
  void drop_expert_grads();
  void measure_expert_bytes();
  c10::Device device_of_experts() const;
  std::vector<v1::CheckpointPiece> expert_pieces(bool optimizer) const;
  std::vector<v1::NamedTensor> gather_experts();
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
  RunState state_ = RunState::Building;
  Environment env_;
  Components parts_;
  Capabilities caps_;
  ExpertShards experts_;
  std::optional<RunPlan> plan_;  ///< set in build, once the dataset's size is known
  Progress progress_;
  std::shared_ptr<EvalTasks> eval_tasks_;  ///< [eval] tasks (null: none)
};

}  // namespace trainrun::core
