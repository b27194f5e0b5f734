// The finish phase: the weights checked once more, the end checkpoint, the final evaluation, the
// final model and the final state dict to whoever wants it, on_train_end, and the exit code with
// its one-line summary (or the diagnosis of a run that diverged).
#include "run.hpp"

#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "stop_signal.hpp"

namespace trainrun::core {

void DivergenceWatch::record(int64_t step, bool loss_finite, bool grads_finite) {
  ++steps;
  if (!loss_finite && bad_loss++ == 0) first_bad_loss = step;
  if (loss_finite && !grads_finite && bad_grads++ == 0) first_bad_grads = step;
  if (!grads_finite || !loss_finite) ++skipped;
  else last_good = step;
}

bool DivergenceWatch::too_many_skipped(double max_fraction) const {
  return steps > 0 && static_cast<double>(skipped) > max_fraction * static_cast<double>(steps);
}

std::string DivergenceWatch::diagnosis(double max_fraction, int64_t start_step) const {
  std::ostringstream os;
  os << "training diverged: ";
  if (weights_bad_after >= 0) os << "the weights are non-finite after step " << weights_bad_after << "; ";
  os << skipped << " of " << steps << " steps skipped ([trainer] max_skipped_fraction = "
     << max_fraction << ")";
  if (bad_loss > 0)
    os << "; non-finite loss at " << bad_loss << " step(s), first at step " << first_bad_loss;
  if (bad_grads > 0)
    os << "; non-finite gradients (with a finite loss) at " << bad_grads
       << " step(s), first at step " << first_bad_grads;
  if (last_good >= 0) os << "; last step with a finite loss and gradients: " << last_good;
  else os << "; no step of this run" << (start_step > 0 ? " (resumed at step " + std::to_string(start_step) + ")" : std::string())
          << " had a finite loss and gradients";
  os << ". Lower the learning rate, check the data and init_weights, or use fp32/bf16 where "
        "fp16 overflows";
  return os.str();
}

int Run::execute() {
  state_ = RunState::Resuming;
  resume();
  start();
  train_steps();
  return finish();
}

int Run::finish() {
  const int stop_sig = stop::received();
  stop::restore();
  Progress& p = progress_;
  if (state_ != RunState::Diverged && !weights_finite_everywhere()) p.watch.weights_bad_after = p.step;
  if (p.watch.weights_bad_after >= 0 || p.watch.too_many_skipped(plan_->max_skipped_fraction))
    state_ = RunState::Diverged;
  // A signal that came after the last step's agreement still counts as an interruption.
  if (state_ == RunState::Training) state_ = stop_sig != 0 ? RunState::Interrupted : RunState::Finished;

  v1::TrainSummary summary;
  summary.steps = p.step;
  summary.interrupted = stop_sig != 0 || state_ != RunState::Finished;
  if (!summary.interrupted && caps_.policy != nullptr && p.last_saved_step != p.step &&
      caps_.policy->should_save(p.step, std::chrono::duration<double>(Clock::now() - p.t_loop).count(),
                                v1::CheckpointReason::End))
    save_checkpoint_now(p.step, "end");
  if (!summary.interrupted) {
    p.last_eval = evaluate(p.step);
    if (job_.trainer.get_bool("save_final_model")) save_final_model();
    hand_over_final_state();
    p.final_state.reset();
  }
  summary.elapsed_s = std::chrono::duration<double>(Clock::now() - env_.t_start).count();
  for (auto& cb : parts_.callbacks) cb.call("on_train_end", [&](v1::Callback& c) { c.on_train_end(summary); return 0; });
  return print_result(summary, stop_sig);
}

// The gathered final state to the model and the callbacks that consume it
// (v1::FinalStateDictConsumer); gathered on every rank, handed over on rank 0.
void Run::hand_over_final_state() {
  if ((caps_.state_consumers.empty() && !caps_.model_consumer) || !gather_final_state(true) || !env_.lead) return;
  if (caps_.model_consumer)
    parts_.model.call("on_final_state_dict", [&](v1::Model&) {
      caps_.model_consumer->on_final_state_dict(*progress_.final_state);
      return 0;
    });
  for (auto& [slot, consumer] : caps_.state_consumers)
    slot->call("on_final_state_dict", [&, c = consumer](v1::Callback&) {
      c->on_final_state_dict(*progress_.final_state);
      return 0;
    });
}

int Run::print_result(const v1::TrainSummary& summary, int stop_sig) const {
  if (state_ == RunState::Diverged) {
    if (env_.lead) {
      std::cout << std::flush;
      std::cerr << "trainrun: error: " << progress_.watch.diagnosis(plan_->max_skipped_fraction, progress_.start_step)
                << "; no final evaluation, no model written" << std::endl;
    }
    return kDivergedExit;
  }
  if (env_.lead) {
    const double loop_s = std::chrono::duration<double>(Clock::now() - progress_.t_loop).count();
    if (state_ == RunState::StoppedEarly && stop_sig == 0) {
      std::cout << "stopped after " << progress_.step << " of " << plan_->steps().total_steps
                << " steps ([trainer] stop_after_steps); no final evaluation" << std::endl;
      return 0;
    }
    if (summary.interrupted) {
      std::cout << "interrupted by signal " << stop_sig << " after " << progress_.step << " of "
                << plan_->steps().total_steps << " steps (" << std::fixed << std::setprecision(1)
                << summary.elapsed_s << " s); no final evaluation" << std::endl;
      return 130;
    }
    if (progress_.last_eval.samples == 0)
      std::cout << "final eval: none ([data] " << job_.data.plugin << " gives no held-out samples)";
    else if (caps_.online != nullptr)  // rollouts: rewards, no loss
      std::cout << "final eval: reward " << std::fixed << std::setprecision(4)
                << (progress_.last_eval.extra.count("reward")
                        ? progress_.last_eval.extra.at("reward")
                        : std::nan(""));
    else
      std::cout << "final eval: loss " << std::fixed << std::setprecision(4)
                << progress_.last_eval.loss;
    if (progress_.last_eval.samples > 0 && progress_.last_eval.accuracy >= 0)
      std::cout << (progress_.last_eval.targets > progress_.last_eval.samples
                        ? ", next-token accuracy "
                        : ", accuracy ")
                << std::setprecision(2) << 100 * progress_.last_eval.accuracy << "%";
    std::cout << " on " << progress_.last_eval.samples
              << (caps_.online != nullptr ? " held-out completions after "
                                          : " held-out samples after ")
              << progress_.step << " steps, " << std::setprecision(1) << summary.elapsed_s << " s, "
              << std::setprecision(0) << progress_.samples_done / loop_s << " samples/s";
    if (progress_.tokens_done > 0) std::cout << ", " << progress_.tokens_done / loop_s << " tokens/s";
    std::cout << std::endl;
  }
  return stop_sig != 0 ? 130 : 0;
}

}  // namespace trainrun::core
