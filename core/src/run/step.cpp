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

// Worlds up to this size log every rank's memory in rank 0's metrics (mem_*/rank_N).
constexpr int kPerRankMemoryRanks = 16;

}  // namespace

std::shared_ptr<v1::Work> Run::sum_over_ranks(torch::Tensor& t, const char* what) {
  // Sums of a few float64 figures over all ranks (counts and metrics), asynchronously so the
  // caller can overlap it with work; a world of one skips the communicator.
  if (env_.ctx.world_size == 1) return std::make_shared<v1::CompletedWork>();
  return parts_.accelerator.call(what, [&](v1::Accelerator&) { return parts_.comm->all_reduce(t); });
}

void Run::wait(const std::shared_ptr<v1::Work>& w, const char* what) {
  parts_.accelerator.call(what, [&](v1::Accelerator&) { w->wait(); return 0; });
}

// Collective: every rank calls it at the same point (decided from agreed figures).
bool Run::weights_finite_everywhere() {
  torch::Tensor bad = torch::tensor({all_finite(parts_.params) ? 0.0 : 1.0}, torch::kDouble);
  wait(sum_over_ranks(bad, "all_reduce (weights finite)"), "wait (weights finite)");
  return bad.item<double>() == 0;
}

v1::Batch Run::get_batch(v1::Split split, const std::vector<int64_t>& idx) {
  v1::Batch b = parts_.dataset.call("batch", [&](v1::Dataset& d) {
    return caps_.data_abi < 6 ? legacy_batch(d, split, idx) : d.batch(split, idx);
  });
  // A model that does not read the fields would let packed samples attend to each other.
  if (!caps_.fields_reader && (b.position_ids.defined() || b.segment_ids.defined()))
    throw ConfigError(parts_.dataset.label + " gives batches with position_ids/segment_ids (packing), which " +
                      parts_.model.label + " does not read (it is no BatchFieldsReader): turn packing off");
  if (caps_.strategy_abi < 6 && (b.position_ids.defined() || b.segment_ids.defined()))
    throw ConfigError(parts_.dataset.label + " gives batches with position_ids/segment_ids (packing), which " +
                      parts_.strategy.label + ", built against ABI 1." + std::to_string(caps_.strategy_abi) +
                      ", cannot pass on (ABI 1.6 added them): rebuild that plugin against this SDK");
  return b;
}

StepBatches Run::load_step(int64_t s) {
  if (caps_.online != nullptr) return rollout_step(s);
  StepBatches sb;
  const v1::TrainPlan& layout = plan_->steps();
  const std::vector<int64_t> mine =
      plan_->batches.sampler.rank_batch(s / layout.steps_per_epoch, s % layout.steps_per_epoch);
  for (int64_t k = 0; k < layout.accumulation_steps; ++k) {
    std::vector<int64_t> idx(mine.begin() + k * layout.micro_batch_size,
                             mine.begin() + (k + 1) * layout.micro_batch_size);
    sb.micro.push_back(get_batch(v1::Split::Train, idx));
    sb.indices.push_back(std::move(idx));
    sb.local[0] += static_cast<double>(sb.micro.back().num_targets);
    sb.local[1] += static_cast<double>(sb.micro.back().num_tokens);
    sb.local[2] += static_cast<double>(sb.micro.back().num_samples);
  }
  return sb;
}

// Between resume and the first step: the banner, on_train_start, the signal handlers.
void Run::start() {
  const size_t n_units = parts_.model.call("units", [](v1::Model& m) { return m.units().size(); });
  if (env_.lead) print_banner(n_units);
  for (auto& cb : parts_.callbacks) cb.call("on_train_start", [&](v1::Callback& c) { c.on_train_start(plan_->steps()); return 0; });
  stop::install();
  parts_.model.call("train", [](v1::Model& m) { m.train(true); return 0; });
  progress_.step = progress_.start_step;
  progress_.t_loop = Clock::now();
  state_ = RunState::Training;
  if (plan_->eval_on_start && progress_.step < plan_->steps().total_steps)
    progress_.last_eval = evaluate(progress_.step);
  // A run resumed at or past stop_after_steps has nothing to do (the check in end_step runs at
  // the end of a step, which would be one step too late).
  if (plan_->stop_after > 0 && progress_.step >= plan_->stop_after && progress_.step < plan_->steps().total_steps)
    state_ = RunState::StoppedEarly;
}

void Run::train_steps() {
  while (progress_.step < plan_->steps().total_steps && state_ == RunState::Training && train_step()) {
  }
}

// One optimizer step; progress_.step is one further when it returns. Returns false when the run stops
// here (diverged, a signal, stop_after_steps).
bool Run::train_step() {
  if (progress_.step + 1 == plan_->kill_at && env_.ctx.rank == plan_->kill_rank) {
    std::cerr << "test hook: rank " << env_.ctx.rank << " SIGKILLs itself at step " << plan_->kill_at << std::endl;
    ::kill(::getpid(), SIGKILL);
  }
  StepState st;
  st.t0 = Clock::now();
  st.cpu0 = process_cpu_s();
  reset_tracked_peak();
  st.epoch = progress_.step / plan_->steps().steps_per_epoch;
  // The loss is normalised by the targets of the whole global batch, which only the ranks
  // together know. The step's counts normally arrived with the previous step's loss (one
  // all-reduce per step); the first step, or one after an interruption of that chain, sums
  // them on its own while the first micro-batch's forward runs.
  if (!progress_.next_counts) {
    progress_.cur = load_step(progress_.step);
    st.counts = torch::from_blob(progress_.cur.local, {3}, torch::kDouble).clone();
    st.counts_work = sum_over_ranks(st.counts, "all_reduce (global batch size)");
  } else {
    progress_.cur = std::move(progress_.next);
    st.counts = *progress_.next_counts;
  }
  forward_backward(st);
  parts_.strategy.call("finish_gradient_sync", [](v1::Strategy& s) { s.finish_gradient_sync(); return 0; });
  sync_expert_gradients();
  issue_step_tail(st);
  std::vector<torch::Tensor> grads;
  for (auto& p : parts_.params)
    if (p.tensor.grad().defined()) grads.push_back(p.tensor.grad());
  apply_gradients(st, grads);
  settle_step(st);
  report_step(st);
  return end_step(st);
}

void Run::forward_backward(StepState& st) {
  std::vector<v1::Batch>& micro = progress_.cur.micro;
  for (int64_t k = 0; k < plan_->steps().accumulation_steps; ++k) {
    const bool last = k + 1 == plan_->steps().accumulation_steps;
    parts_.strategy.call("before_backward", [&](v1::Strategy& s) { s.before_backward(last); return 0; });
    v1::ModelOutput out =
        objective_forward(v1::Split::Train, micro[k], progress_.cur.indices[k], false);
    TR_CHECK(out.loss_sum.defined() && out.loss_sum.numel() == 1,
             parts_.model.label, " returned no scalar loss_sum");
    if (k == 0) {
      if (st.counts_work) wait(st.counts_work, "wait (global batch size)");
      st.global_targets = st.counts.data_ptr<double>()[0];
      TR_CHECK(st.global_targets > 0, "step ", progress_.step + 1, ": the global batch has no targets");
    }
    // x world_size: data-parallel strategies average gradients over ranks, and the average of
    // the ranks' (loss_sum_r x W / targets) is the mean loss over the global batch.
    torch::Tensor loss = out.loss_sum.to(torch::kFloat) * (static_cast<double>(env_.ctx.world_size) / st.global_targets);
    torch::Tensor scaled = parts_.precision.call("scale_loss", [&](v1::Precision& p) { return p.scale_loss(loss); });
    guarded(parts_.model.label, "backward", [&] { scaled.backward(); return 0; });
    st.loss_sum += out.loss_sum.item<double>();
  }
}

// [loss sum of this step, next step's targets, tokens, samples]: one all-reduce, issued after
// the strategy's own collectives so that every rank issues them in the same order, and waited
// for at the end of the step.
void Run::issue_step_tail(StepState& st) {
  // An online objective's next batches are completions of the model this step is about to
  // change: they are made when that step begins, not here.
  st.prefetch = progress_.step + 1 < plan_->steps().total_steps && caps_.online == nullptr;
  if (st.prefetch) progress_.next = load_step(progress_.step + 1);
  // Two more figures ride along so that the ranks agree without another collective: whether
  // rank 0's checkpoint policy saves after this step, and whether any rank got SIGTERM/SIGINT.
  st.elapsed_loop = std::chrono::duration<double>(Clock::now() - progress_.t_loop).count();
  const bool want_save = env_.lead && caps_.policy != nullptr &&
                         caps_.policy->should_save(progress_.step + 1, st.elapsed_loop, v1::CheckpointReason::Step);
  std::vector<double> tail = {st.loss_sum,
                              st.prefetch ? progress_.next.local[0] : 0.0,
                              st.prefetch ? progress_.next.local[1] : 0.0,
                              st.prefetch ? progress_.next.local[2] : 0.0,
                              want_save ? 1.0 : 0.0,
                              stop::received() ? 1.0 : 0.0};
  // The objective's figures ride along too (the same names on every rank, sorted).
  for (const auto& m : objective_metrics(v1::Split::Train)) {
    st.objective_metrics.push_back(m.name);
    tail.push_back(m.sum);
    tail.push_back(m.count);
  }
  st.tail = torch::tensor(tail, torch::kDouble);
  st.tail_work = sum_over_ranks(st.tail, "all_reduce (step loss, next batch size)");
}

void Run::apply_gradients(StepState& st, std::vector<torch::Tensor>& grads) {
  st.finite = parts_.precision.call("unscale_and_check", [&](v1::Precision& p) {
    return p.unscale_and_check(grads, *parts_.comm);
  });
  st.grad_norm = std::numeric_limits<double>::quiet_NaN();
  if (st.finite) {
    st.grad_norm = parts_.strategy.call("grad_norm", [](v1::Strategy& s) { return s.grad_norm(); });
    if (experts_.model != nullptr)
      st.grad_norm = std::sqrt(st.grad_norm * st.grad_norm + expert_grad_sq());
    // The gradients are unscaled by now (unscale_and_check), so clip_val is in the units of
    // the true gradient; grad_norm is logged as it was before clipping (as Lightning does).
    if (plan_->clip > 0 && plan_->clip_by_value) {
      torch::NoGradGuard ng;
      for (auto& g : grads) g.clamp_(-plan_->clip, plan_->clip);
    } else if (plan_->clip > 0 && st.grad_norm > plan_->clip) {
      torch::NoGradGuard ng;
      const double factor = plan_->clip / (st.grad_norm + 1e-6);
      for (auto& g : grads) g.mul_(factor);
    }
    const int64_t step = progress_.step;
    parts_.optimizer.call("step", [&](v1::Optimizer& o) { o.step(step); return 0; });
    parts_.strategy.call("after_optimizer_step", [](v1::Strategy& s) { s.after_optimizer_step(); return 0; });
    if (experts_.state_bytes < 0) measure_expert_bytes();
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
    ++progress_.skipped_steps;
    if (env_.lead) {
      const double used = parts_.precision.call("loss_scale", [](v1::Precision& p) { return p.loss_scale(); });
      log_warn("step " + std::to_string(progress_.step + 1) + ": " +
               (st.loss_finite ? "non-finite gradients" : "non-finite loss (" + std::to_string(st.tail.data_ptr<double>()[0] / st.global_targets) + ")") +
               ", step skipped" +
               (used != 1.0 ? " (loss scale " + fmt_scale(used) + (st.loss_finite ? "" : ", kept") + ")" : std::string()));
    }
  }
  // A non-finite loss is not an fp16 overflow of the gradients: a smaller scale cannot help,
  // so the scaler does not count the step at all.
  if (st.finite || st.loss_finite) parts_.precision.call("update", [&](v1::Precision& p) { p.update(!st.finite); return 0; });
  parts_.strategy.call("zero_grad", [](v1::Strategy& s) { s.zero_grad(); return 0; });
  drop_expert_grads();
  progress_.watch.record(progress_.step + 1, st.loss_finite, st.finite);
  if (!st.loss_finite && !weights_finite_everywhere()) {
    progress_.watch.weights_bad_after = progress_.step;
    state_ = RunState::Diverged;
  }
  progress_.next_counts.reset();
  if (st.prefetch) progress_.next_counts = st.tail.slice(0, 1, 4).clone();
}

// The step's metrics to the callbacks, and every log_every steps a line on rank 0.
void Run::report_step(StepState& st) {
  const double dt = std::chrono::duration<double>(Clock::now() - st.t0).count();
  progress_.samples_done += st.counts.data_ptr<double>()[2];
  progress_.tokens_done += st.counts.data_ptr<double>()[1];
  v1::StepMetrics m;
  m.step = progress_.step + 1;
  m.epoch = st.epoch;
  m.rank = env_.ctx.rank;
  m.loss = st.tail.data_ptr<double>()[0] / st.global_targets;
  m.lr = parts_.optimizer.call("lr", [&](v1::Optimizer& o) { return o.lr(progress_.step); });
  m.grad_norm = st.grad_norm;
  m.step_time_s = dt;
  m.extra["step_cpu_s"] = process_cpu_s() - st.cpu0;
  m.elapsed_s = std::chrono::duration<double>(Clock::now() - env_.t_start).count();
  const double loop_s = std::chrono::duration<double>(Clock::now() - progress_.t_loop).count();
  m.samples_per_s = progress_.samples_done / loop_s;
  m.tokens_per_s = progress_.tokens_done / loop_s;
  m.total_steps = plan_->steps().total_steps;
  const double scale = parts_.precision.call("loss_scale", [](v1::Precision& p) { return p.loss_scale(); });
  if (scale != 1.0) m.extra["loss_scale"] = scale;
  if (!st.finite) m.extra["skipped"] = 1;
  if (progress_.skipped_steps > 0) m.extra["skipped_steps"] = static_cast<double>(progress_.skipped_steps);
  if (env_.mem_baseline >= 0) {
    m.extra["mem_peak_bytes"] = static_cast<double>(memory_now(true));
    m.extra["mem_current_bytes"] = static_cast<double>(memory_now(false));
    m.extra["mem_model_state_bytes"] = static_cast<double>(st.mem_model_state - env_.mem_baseline);
    // Every rank's figures on every rank (a sharded run's ranks differ: the rank holding the
    // remainder of a shard, the one writing checkpoints), for the report's per-rank lines
    // without all_ranks metrics files: one all_reduce of 2 x world float64s.
    const int world = env_.ctx.world_size;
    if (world > 1 && world <= kPerRankMemoryRanks) {
      torch::Tensor per_rank = torch::zeros({2 * world}, torch::kFloat64);
      per_rank[2 * env_.ctx.rank] = m.extra["mem_model_state_bytes"];
      per_rank[2 * env_.ctx.rank + 1] = m.extra["mem_peak_bytes"];
      wait(sum_over_ranks(per_rank, "all_reduce (memory per rank)"), "wait (memory per rank)");
      for (int r = 0; r < world; ++r) {
        m.extra["mem_model_state_bytes/rank_" + std::to_string(r)] = per_rank[2 * r].item<double>();
        m.extra["mem_peak_bytes/rank_" + std::to_string(r)] = per_rank[2 * r + 1].item<double>();
      }
    }
  }
  if (experts_.state_bytes >= 0) m.extra["expert_state_bytes"] = experts_.state_bytes;
  for (size_t i = 0; i < st.objective_metrics.size(); ++i) {
    const double count = st.tail.data_ptr<double>()[6 + 2 * i + 1];
    if (count > 0) m.extra[st.objective_metrics[i]] = st.tail.data_ptr<double>()[6 + 2 * i] / count;
  }
  add_rollout_metrics(m.extra);
  for (auto& [label, source] : caps_.metric_sources)
    guarded(label, "add_step_metrics", [&] { source->add_step_metrics(m.extra); return 0; });
  for (auto& cb : parts_.callbacks) cb.call("on_step_end", [&](v1::Callback& c) { c.on_step_end(m); return 0; });
  const int64_t done = progress_.step + 1, total = plan_->steps().total_steps;
  if (env_.lead && (done % plan_->log_every == 0 || done == total)) {
    const double eta = loop_s / done * (total - done);
    std::cout << "[step " << done << "/" << total << "] epoch " << st.epoch
              << " | loss " << std::fixed << std::setprecision(4) << m.loss << std::defaultfloat
              << " | lr " << std::scientific << std::setprecision(3) << m.lr << std::defaultfloat
              << " | grad_norm " << std::setprecision(4) << st.grad_norm << " | "
              << std::setprecision(0) << std::fixed << m.samples_per_s << " samples/s";
    if (m.tokens_per_s > 0) std::cout << " | " << m.tokens_per_s << " tokens/s";
    if (scale != 1.0) std::cout << " | loss scale " << fmt_scale(scale);
    // A preference objective's two figures a user watches (the rest are in metrics.jsonl); a
    // reward model's (objective reward) under TRL's names for them.
    for (const char* k : {"rewards/accuracies", "rewards/margins", "accuracy", "margin"})
      if (auto it = m.extra.find(k); it != m.extra.end())
        std::cout << " | " << k << " " << std::setprecision(3) << it->second;
    std::cout << std::defaultfloat << std::setprecision(6) << " | eta " << fmt_duration(eta)
              << std::endl;
  }
}

// The end of a step, the same on every rank: evaluate every eval_every steps, save when rank
// 0's policy, a signal or stop_after_steps says so, and stop on divergence, a signal (the
// agreed flag, or with one rank the flag itself) or stop_after_steps.
bool Run::end_step(StepState& st) {
  const int64_t done = progress_.step + 1, total = plan_->steps().total_steps;
  if (plan_->eval_every > 0 && done % plan_->eval_every == 0 && done < total) {
    progress_.last_eval = evaluate(done);
  }
  const double* tail = st.tail.data_ptr<double>();
  const bool signalled = env_.ctx.world_size > 1 ? tail[5] > 0 : stop::received() != 0;
  const bool stop_here = plan_->stop_after > 0 && done >= plan_->stop_after && done < total;
  bool save = tail[4] > 0;
  if (signalled && caps_.policy != nullptr)
    save = save || caps_.policy->should_save(done, st.elapsed_loop, v1::CheckpointReason::Signal);
  if (stop_here && caps_.policy != nullptr) save = true;
  if (save) save_checkpoint_now(done, signalled ? "signal" : stop_here ? "stop_after_steps" : "step");
  ++progress_.step;
  if (state_ == RunState::Diverged) return false;
  if (signalled || stop_here) {
    if (!signalled) {
      state_ = RunState::StoppedEarly;
    } else {
      state_ = RunState::Interrupted;
      stop::set_received(stop::received() ? stop::received() : SIGTERM);
    }
    return false;
  }
  return true;
}

}  // namespace trainrun::core
