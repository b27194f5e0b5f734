// The finish phase: the weights checked once more, the end checkpoint, the final evaluation, the
// final model and the final state dict to whoever wants it, on_train_end, and the exit code with
// its one-line summary (or the diagnosis of a run that diverged).
#include "run.hpp"

#include <torch/types.h>
#include <torch/utils.h>

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
  resume();
  start();
  train_steps();
  return finish();
}

int Run::finish() {
  const int stop_sig = stop::received();
  stop::restore();
  if (!diverged_ && !weights_finite_everywhere()) watch_.weights_bad_after = step_;
  diverged_ = diverged_ || watch_.weights_bad_after >= 0 || watch_.too_many_skipped(max_skipped_fraction_);

  v1::TrainSummary summary;
  summary.steps = step_;
  summary.interrupted = stop_sig != 0 || stopped_early_ || diverged_;
  if (!summary.interrupted && policy_ != nullptr && last_saved_step_ != step_ &&
      policy_->should_save(step_, std::chrono::duration<double>(Clock::now() - t_loop_).count(),
                           v1::CheckpointReason::End))
    save_checkpoint_now(step_, "end");
  if (!summary.interrupted) {
    last_eval_ = evaluate(step_);
    if (job_.trainer.get_bool("save_final_model")) save_final_model();
    hand_over_final_state();
    final_state_.clear();
  }
  summary.elapsed_s = std::chrono::duration<double>(Clock::now() - t_start_).count();
  for (auto& cb : callbacks_) cb.call("on_train_end", [&](v1::Callback& c) { c.on_train_end(summary); return 0; });
  return print_result(summary, stop_sig);
}

// The gathered final state to the model and the callbacks that consume it
// (v1::FinalStateDictConsumer); gathered on every rank, handed over on rank 0.
void Run::hand_over_final_state() {
  if ((state_consumers_.empty() && !model_consumer_) || !gather_final_state(true) || !lead_) return;
  if (model_consumer_)
    model_.call("on_final_state_dict", [&](v1::Model&) {
      model_consumer_->on_final_state_dict(final_state_);
      return 0;
    });
  for (auto& [slot, consumer] : state_consumers_)
    slot->call("on_final_state_dict", [&, c = consumer](v1::Callback&) {
      c->on_final_state_dict(final_state_);
      return 0;
    });
}

int Run::print_result(const v1::TrainSummary& summary, int stop_sig) const {
  if (diverged_) {
    if (lead_) {
      std::cout << std::flush;
      std::cerr << "trainrun: error: " << watch_.diagnosis(max_skipped_fraction_, start_step_)
                << "; no final evaluation, no model written" << std::endl;
    }
    return kDivergedExit;
  }
  if (lead_) {
    const double loop_s = std::chrono::duration<double>(Clock::now() - t_loop_).count();
    if (stopped_early_ && stop_sig == 0) {
      std::cout << "stopped after " << step_ << " of " << plan_.total_steps
                << " steps ([trainer] stop_after_steps); no final evaluation" << std::endl;
      return 0;
    }
    if (summary.interrupted) {
      std::cout << "interrupted by signal " << stop_sig << " after " << step_ << " of "
                << plan_.total_steps << " steps (" << std::fixed << std::setprecision(1)
                << summary.elapsed_s << " s); no final evaluation" << std::endl;
      return 130;
    }
    std::cout << "final eval: loss " << std::fixed << std::setprecision(4) << last_eval_.loss;
    if (last_eval_.accuracy >= 0)
      std::cout << ", accuracy " << std::setprecision(2) << 100 * last_eval_.accuracy << "%";
    std::cout << " on " << last_eval_.samples << " held-out samples after " << step_ << " steps, "
              << std::setprecision(1) << summary.elapsed_s << " s, " << std::setprecision(0)
              << samples_done_ / loop_s << " samples/s";
    if (tokens_done_ > 0) std::cout << ", " << tokens_done_ / loop_s << " tokens/s";
    std::cout << std::endl;
  }
  return stop_sig != 0 ? 130 : 0;
}

}  // namespace trainrun::core
