// The step phase: one optimizer step is accumulation_steps micro-batches, each run through the
// strategy's forward under the precision's autocast, with the loss normalised by the number of
// targets in the whole global batch (so accumulation and world size do not change the
// gradient); then gradient sync, unscale + finite check, clipping, the optimizer step, the
// step's metrics, and at its end the decisions every rank takes together (evaluate, save, stop).
#include "run.hpp"

#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>
#include <time.h>
#include <unistd.h>

#include "stop_signal.hpp"
#include "trainrun/core/log.hpp"
#include "trainrun/core/memory.hpp"

namespace trainrun::core {

using v1::ConfigError;

namespace {

std::string fmt_duration(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  long t = static_cast<long>(s + 0.5);
  std::ostringstream os;
  if (t >= 3600) os << t / 3600 << "h" << std::setw(2) << std::setfill('0') << (t % 3600) / 60 << "m";
  else if (t >= 60) os << t / 60 << "m" << std::setw(2) << std::setfill('0') << t % 60 << "s";
  else os << t << "s";
  return os.str();
}

// CPU seconds this process has used so far, all its threads together. Beside the wall-clock
// step_time_s it measures the step's work where other processes share the cores: a rank that
// waits for a core loses wall time, not CPU time.
double process_cpu_s() {
  timespec ts{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::string fmt_scale(double scale) {
  std::ostringstream os;
  os << std::setprecision(12) << scale;
  return os.str();
}

// Whether every element of these (local) tensors is finite; the caller agrees over ranks.
bool all_finite(const std::vector<v1::NamedTensor>& tensors) {
  torch::NoGradGuard no_grad;
  for (const auto& t : tensors)
    if (t.tensor.defined() && t.tensor.is_floating_point() && !torch::isfinite(t.tensor).all().item<bool>())
      return false;
  return true;
}

// Batch as ABI 1.0-1.5 laid it out: a dataset built against such an SDK constructs only these
// fields in the caller's return slot, so the core must not receive it as a 1.6 Batch (whose
// appended tensors would be left unconstructed).
struct BatchAbi10 {
  at::Tensor input;
  at::Tensor target;
  int64_t num_samples = 0;
  int64_t num_targets = 0;
  int64_t num_tokens = 0;
};

// Dataset::batch of a dataset built against ABI < 1.6, through its own return layout. The
// virtual slot is the same (the interface is unchanged); only the returned struct is shorter,
// and both are returned through a caller-provided buffer (Itanium C++ ABI: non-trivial types).
v1::Batch legacy_batch(v1::Dataset& d, v1::Split split, const std::vector<int64_t>& idx) {
  using Fn = BatchAbi10 (v1::Dataset::*)(v1::Split, const std::vector<int64_t>&);
  const Fn fn = reinterpret_cast<Fn>(&v1::Dataset::batch);
  BatchAbi10 old = (d.*fn)(split, idx);
  v1::Batch b;
  b.input = std::move(old.input);
  b.target = std::move(old.target);
  b.num_samples = old.num_samples;
  b.num_targets = old.num_targets;
  b.num_tokens = old.num_tokens;
  return b;
}

}  // namespace

std::shared_ptr<v1::Work> Run::sum_over_ranks(torch::Tensor& t, const char* what) {
  // Sums of a few float64 figures over all ranks (counts and metrics), asynchronously so the
  // caller can overlap it with work; a world of one skips the communicator.
  if (ctx_.world_size == 1) return std::make_shared<v1::CompletedWork>();
  return accelerator_.call(what, [&](v1::Accelerator&) { return comm_->all_reduce(t); });
}

void Run::wait(const std::shared_ptr<v1::Work>& w, const char* what) {
  accelerator_.call(what, [&](v1::Accelerator&) { w->wait(); return 0; });
}

// Collective: every rank calls it at the same point (decided from agreed figures).
bool Run::weights_finite_everywhere() {
  torch::Tensor bad = torch::tensor({all_finite(params_) ? 0.0 : 1.0}, torch::kDouble);
  wait(sum_over_ranks(bad, "all_reduce (weights finite)"), "wait (weights finite)");
  return bad.item<double>() == 0;
}

v1::Batch Run::get_batch(v1::Split split, const std::vector<int64_t>& idx) {
  v1::Batch b = dataset_.call("batch", [&](v1::Dataset& d) {
    return data_abi_ < 6 ? legacy_batch(d, split, idx) : d.batch(split, idx);
  });
  // A model that does not read the fields would let packed samples attend to each other.
  if (!fields_reader_ && (b.position_ids.defined() || b.segment_ids.defined()))
    throw ConfigError(dataset_.label + " gives batches with position_ids/segment_ids (packing), which " +
                      model_.label + " does not read (it is no BatchFieldsReader): turn packing off");
  if (strategy_abi_ < 6 && (b.position_ids.defined() || b.segment_ids.defined()))
    throw ConfigError(dataset_.label + " gives batches with position_ids/segment_ids (packing), which " +
                      strategy_.label + ", built against ABI 1." + std::to_string(strategy_abi_) +
                      ", cannot pass on (ABI 1.6 added them): rebuild that plugin against this SDK");
  return b;
}

StepBatches Run::load_step(int64_t s) {
  StepBatches sb;
  const std::vector<int64_t> mine = sampler_->rank_batch(s / plan_.steps_per_epoch, s % plan_.steps_per_epoch);
  for (int64_t k = 0; k < plan_.accumulation_steps; ++k) {
    std::vector<int64_t> idx(mine.begin() + k * plan_.micro_batch_size,
                             mine.begin() + (k + 1) * plan_.micro_batch_size);
    sb.micro.push_back(get_batch(v1::Split::Train, idx));
    sb.local[0] += static_cast<double>(sb.micro.back().num_targets);
    sb.local[1] += static_cast<double>(sb.micro.back().num_tokens);
    sb.local[2] += static_cast<double>(sb.micro.back().num_samples);
  }
  return sb;
}

// Between resume and the first step: the sampler, the banner, on_train_start, the signal
// handlers, and the [trainer] settings the loop reads.
void Run::start() {
  DistributedSampler::Options sampler_options;
  sampler_options.num_samples = train_samples_;
  sampler_options.global_batch_size = plan_.global_batch_size;
  sampler_options.world_size = ctx_.world_size;
  sampler_options.rank = ctx_.rank;
  sampler_options.seed = ctx_.seed;
  sampler_options.drop_last = job_.trainer.get_bool("drop_last");
  sampler_.emplace(sampler_options);

  const size_t n_units = model_.call("units", [](v1::Model& m) { return m.units().size(); });
  if (lead_) print_banner(n_units);
  for (auto& cb : callbacks_) cb.call("on_train_start", [&](v1::Callback& c) { c.on_train_start(plan_); return 0; });
  stop::install();

  stop_after_ = job_.trainer.get_int("stop_after_steps");
  max_skipped_fraction_ = job_.trainer.get_double("max_skipped_fraction");
  clip_ = job_.trainer.get_double("gradient_clip_val");
  clip_by_value_ = job_.trainer.get_string("gradient_clip_algorithm") == "value";
  log_every_ = job_.trainer.get_int("log_every");
  eval_every_ = job_.trainer.get_int("eval_every");
  eval_max_batches_ = job_.trainer.get_int("eval_max_batches");
  eval_bs_ = job_.trainer.get_int("eval_batch_size") > 0 ? job_.trainer.get_int("eval_batch_size")
                                                         : plan_.micro_batch_size;

  model_.call("train", [](v1::Model& m) { m.train(true); return 0; });
  step_ = start_step_;
  t_loop_ = Clock::now();
  // Test hook for elastic restarts: TRAINRUN_TEST_SIGKILL_AT_STEP=N (1-based) makes rank
  // TRAINRUN_TEST_SIGKILL_RANK (default 0) kill itself with SIGKILL as step N starts, in the
  // first attempt only (not after a [launch] max_restarts restart).
  const char* kill_at_env = std::getenv("TRAINRUN_TEST_SIGKILL_AT_STEP");
  kill_at_ = kill_at_env && !std::getenv("TRAINRUN_RESTART") ? std::atoll(kill_at_env) : -1;
  const char* kill_rank_env = std::getenv("TRAINRUN_TEST_SIGKILL_RANK");
  kill_rank_ = kill_rank_env ? std::atoi(kill_rank_env) : 0;
  // A run resumed at or past stop_after_steps has nothing to do (the check in end_step runs at
  // the end of a step, which would be one step too late).
  if (stop_after_ > 0 && step_ >= stop_after_ && step_ < plan_.total_steps) stopped_early_ = true;
}

void Run::train_steps() {
  while (step_ < plan_.total_steps && !stopped_early_ && train_step()) {
  }
}

// One optimizer step; step_ is one further when it returns. Returns false when the run stops
// here (diverged, a signal, stop_after_steps).
bool Run::train_step() {
  if (step_ + 1 == kill_at_ && ctx_.rank == kill_rank_) {
    std::cerr << "test hook: rank " << ctx_.rank << " SIGKILLs itself at step " << kill_at_ << std::endl;
    ::kill(::getpid(), SIGKILL);
  }
  StepState st;
  st.t0 = Clock::now();
  st.cpu0 = process_cpu_s();
  reset_tracked_peak();
  st.epoch = step_ / plan_.steps_per_epoch;
  // The loss is normalised by the targets of the whole global batch, which only the ranks
  // together know. The step's counts normally arrived with the previous step's loss (one
  // all-reduce per step); the first step, or one after an interruption of that chain, sums
  // them on its own while the first micro-batch's forward runs.
  if (!next_counts_known_) {
    cur_ = load_step(step_);
    st.counts = torch::from_blob(cur_.local, {3}, torch::kDouble).clone();
    st.counts_work = sum_over_ranks(st.counts, "all_reduce (global batch size)");
  } else {
    cur_ = std::move(next_);
    st.counts = next_counts_;
  }
  forward_backward(st);
  strategy_.call("finish_gradient_sync", [](v1::Strategy& s) { s.finish_gradient_sync(); return 0; });
  issue_step_tail(st);
  std::vector<torch::Tensor> grads;
  for (auto& p : params_)
    if (p.tensor.grad().defined()) grads.push_back(p.tensor.grad());
  apply_gradients(st, grads);
  settle_step(st);
  report_step(st);
  return end_step(st);
}

void Run::forward_backward(StepState& st) {
  std::vector<v1::Batch>& micro = cur_.micro;
  for (int64_t k = 0; k < plan_.accumulation_steps; ++k) {
    const bool last = k + 1 == plan_.accumulation_steps;
    strategy_.call("before_backward", [&](v1::Strategy& s) { s.before_backward(last); return 0; });
    auto scope = precision_.call("autocast", [](v1::Precision& p) { return p.autocast(); });
    v1::ModelOutput out = strategy_.call("forward", [&](v1::Strategy& s) { return s.forward(micro[k]); });
    scope.reset();
    TR_CHECK(out.loss_sum.defined() && out.loss_sum.numel() == 1,
             model_.label, " returned no scalar loss_sum");
    if (k == 0) {
      if (st.counts_work) wait(st.counts_work, "wait (global batch size)");
      st.global_targets = st.counts.data_ptr<double>()[0];
      TR_CHECK(st.global_targets > 0, "step ", step_ + 1, ": the global batch has no targets");
    }
    // x world_size: data-parallel strategies average gradients over ranks, and the average of
    // the ranks' (loss_sum_r x W / targets) is the mean loss over the global batch.
    torch::Tensor loss = out.loss_sum.to(torch::kFloat) * (static_cast<double>(ctx_.world_size) / st.global_targets);
    torch::Tensor scaled = precision_.call("scale_loss", [&](v1::Precision& p) { return p.scale_loss(loss); });
    guarded(model_.label, "backward", [&] { scaled.backward(); return 0; });
    st.loss_sum += out.loss_sum.item<double>();
  }
}

// [loss sum of this step, next step's targets, tokens, samples]: one all-reduce, issued after
// the strategy's own collectives so that every rank issues them in the same order, and waited
// for at the end of the step.
void Run::issue_step_tail(StepState& st) {
  st.prefetch = step_ + 1 < plan_.total_steps;
  if (st.prefetch) next_ = load_step(step_ + 1);
  // Two more figures ride along so that the ranks agree without another collective: whether
  // rank 0's checkpoint policy saves after this step, and whether any rank got SIGTERM/SIGINT.
  st.elapsed_loop = std::chrono::duration<double>(Clock::now() - t_loop_).count();
  const bool want_save = lead_ && policy_ != nullptr &&
                         policy_->should_save(step_ + 1, st.elapsed_loop, v1::CheckpointReason::Step);
  st.tail = torch::tensor({st.loss_sum, st.prefetch ? next_.local[0] : 0.0,
                           st.prefetch ? next_.local[1] : 0.0, st.prefetch ? next_.local[2] : 0.0,
                           want_save ? 1.0 : 0.0, stop::received() ? 1.0 : 0.0},
                          torch::kDouble);
  st.tail_work = sum_over_ranks(st.tail, "all_reduce (step loss, next batch size)");
}

void Run::apply_gradients(StepState& st, std::vector<torch::Tensor>& grads) {
  st.finite = precision_.call("unscale_and_check", [&](v1::Precision& p) {
    return p.unscale_and_check(grads, *comm_);
  });
  st.grad_norm = std::numeric_limits<double>::quiet_NaN();
  if (st.finite) {
    st.grad_norm = strategy_.call("grad_norm", [](v1::Strategy& s) { return s.grad_norm(); });
    // The gradients are unscaled by now (unscale_and_check), so clip_val is in the units of
    // the true gradient; grad_norm is logged as it was before clipping (as Lightning does).
    if (clip_ > 0 && clip_by_value_) {
      torch::NoGradGuard ng;
      for (auto& g : grads) g.clamp_(-clip_, clip_);
    } else if (clip_ > 0 && st.grad_norm > clip_) {
      torch::NoGradGuard ng;
      const double factor = clip_ / (st.grad_norm + 1e-6);
      for (auto& g : grads) g.mul_(factor);
    }
    const int64_t step = step_;
    optimizer_.call("step", [&](v1::Optimizer& o) { o.step(step); return 0; });
    strategy_.call("after_optimizer_step", [](v1::Strategy& s) { s.after_optimizer_step(); return 0; });
  }
  // Parameters, gradients and optimizer state at rest (what ZeRO's formulas predict): the
  // gradients are still alive until zero_grad; the step's batches are included (small).
  st.mem_model_state = memory_now(false);
}

// The agreed loss: a skipped step is reported, the precision's scaler updated, the gradients
// zeroed, and a non-finite loss checked against the weights (divergence).
void Run::settle_step(StepState& st) {
  // The step's loss (all-reduced) tells a non-finite loss from overflowing gradients.
  wait(st.tail_work, "wait (step loss)");
  st.loss_finite = std::isfinite(st.tail.data_ptr<double>()[0]);
  if (!st.finite) {
    ++skipped_steps_;
    if (lead_) {
      const double used = precision_.call("loss_scale", [](v1::Precision& p) { return p.loss_scale(); });
      log_warn("step " + std::to_string(step_ + 1) + ": " +
               (st.loss_finite ? "non-finite gradients" : "non-finite loss (" + std::to_string(st.tail.data_ptr<double>()[0] / st.global_targets) + ")") +
               ", step skipped" +
               (used != 1.0 ? " (loss scale " + fmt_scale(used) + (st.loss_finite ? "" : ", kept") + ")" : std::string()));
    }
  }
  // A non-finite loss is not an fp16 overflow of the gradients: a smaller scale cannot help,
  // so the scaler does not count the step at all.
  if (st.finite || st.loss_finite) precision_.call("update", [&](v1::Precision& p) { p.update(!st.finite); return 0; });
  strategy_.call("zero_grad", [](v1::Strategy& s) { s.zero_grad(); return 0; });
  watch_.record(step_ + 1, st.loss_finite, st.finite);
  if (!st.loss_finite && !weights_finite_everywhere()) {
    watch_.weights_bad_after = step_;
    diverged_ = true;
  }
  next_counts_known_ = st.prefetch;
  if (st.prefetch) next_counts_ = st.tail.slice(0, 1, 4).clone();
}

// The step's metrics to the callbacks, and every log_every steps a line on rank 0.
void Run::report_step(StepState& st) {
  const double dt = std::chrono::duration<double>(Clock::now() - st.t0).count();
  samples_done_ += st.counts.data_ptr<double>()[2];
  tokens_done_ += st.counts.data_ptr<double>()[1];
  v1::StepMetrics m;
  m.step = step_ + 1;
  m.epoch = st.epoch;
  m.rank = ctx_.rank;
  m.loss = st.tail.data_ptr<double>()[0] / st.global_targets;
  m.lr = optimizer_.call("lr", [&](v1::Optimizer& o) { return o.lr(step_); });
  m.grad_norm = st.grad_norm;
  m.step_time_s = dt;
  m.extra["step_cpu_s"] = process_cpu_s() - st.cpu0;
  m.elapsed_s = std::chrono::duration<double>(Clock::now() - t_start_).count();
  const double loop_s = std::chrono::duration<double>(Clock::now() - t_loop_).count();
  m.samples_per_s = samples_done_ / loop_s;
  m.tokens_per_s = tokens_done_ / loop_s;
  m.total_steps = plan_.total_steps;
  const double scale = precision_.call("loss_scale", [](v1::Precision& p) { return p.loss_scale(); });
  if (scale != 1.0) m.extra["loss_scale"] = scale;
  if (!st.finite) m.extra["skipped"] = 1;
  if (skipped_steps_ > 0) m.extra["skipped_steps"] = static_cast<double>(skipped_steps_);
  if (mem_baseline_ >= 0) {
    m.extra["mem_peak_bytes"] = static_cast<double>(memory_now(true));
    m.extra["mem_current_bytes"] = static_cast<double>(memory_now(false));
    m.extra["mem_model_state_bytes"] = static_cast<double>(st.mem_model_state - mem_baseline_);
  }
  for (auto& [label, source] : metric_sources_)
    guarded(label, "add_step_metrics", [&] { source->add_step_metrics(m.extra); return 0; });
  for (auto& cb : callbacks_) cb.call("on_step_end", [&](v1::Callback& c) { c.on_step_end(m); return 0; });
  if (lead_ && ((step_ + 1) % log_every_ == 0 || step_ + 1 == plan_.total_steps)) {
    const double eta = loop_s / (step_ + 1) * (plan_.total_steps - step_ - 1);
    std::cout << "[step " << step_ + 1 << "/" << plan_.total_steps << "] epoch " << st.epoch
              << " | loss " << std::fixed << std::setprecision(4) << m.loss << std::defaultfloat
              << " | lr " << std::scientific << std::setprecision(3) << m.lr << std::defaultfloat
              << " | grad_norm " << std::setprecision(4) << st.grad_norm << " | "
              << std::setprecision(0) << std::fixed << m.samples_per_s << " samples/s";
    if (m.tokens_per_s > 0) std::cout << " | " << m.tokens_per_s << " tokens/s";
    if (scale != 1.0) std::cout << " | loss scale " << fmt_scale(scale);
    std::cout << std::defaultfloat << std::setprecision(6) << " | eta " << fmt_duration(eta)
              << std::endl;
  }
}

// The end of a step, the same on every rank: evaluate every eval_every steps, save when rank
// 0's policy, a signal or stop_after_steps says so, and stop on divergence, a signal (the
// agreed flag, or with one rank the flag itself) or stop_after_steps.
bool Run::end_step(StepState& st) {
  if (eval_every_ > 0 && (step_ + 1) % eval_every_ == 0 && step_ + 1 < plan_.total_steps) {
    last_eval_ = evaluate(step_ + 1);
  }
  const double* tail = st.tail.data_ptr<double>();
  const bool signalled = ctx_.world_size > 1 ? tail[5] > 0 : stop::received() != 0;
  const bool stop_here = stop_after_ > 0 && step_ + 1 >= stop_after_ && step_ + 1 < plan_.total_steps;
  bool save = tail[4] > 0;
  if (signalled && policy_ != nullptr)
    save = save || policy_->should_save(step_ + 1, st.elapsed_loop, v1::CheckpointReason::Signal);
  if (stop_here && policy_ != nullptr) save = true;
  if (save) save_checkpoint_now(step_ + 1, signalled ? "signal" : stop_here ? "stop_after_steps" : "step");
  ++step_;
  if (diverged_) return false;
  if (signalled || stop_here) {
    if (!signalled) stopped_early_ = true;
    else stop::set_received(stop::received() ? stop::received() : SIGTERM);
    return false;
  }
  return true;
}

}  // namespace trainrun::core
