// The evaluate phase: the held-out split, sharded over the ranks (every rank runs the same number
// of forwards), its loss and accuracy summed over ranks, to the callbacks and on rank 0's console.
#include "run.hpp"

#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <iomanip>
#include <iostream>

namespace trainrun::core {

// Every evaluation ends so: the [eval] tasks (eval_tasks.cpp), the time since t0, the callbacks.
void Run::end_evaluation(int64_t step, v1::EvalMetrics& em, Clock::time_point t0) {
  evaluate_tasks(step, em);
  em.time_s = std::chrono::duration<double>(Clock::now() - t0).count();
  for (auto& cb : parts_.callbacks)
    cb.call("on_eval_end", [&](v1::Callback& c) {
      c.on_eval_end(em);
      return 0;
    });
}

v1::EvalMetrics Run::evaluate(int64_t step) {
  if (caps_.online != nullptr && plan_->eval_samples > 0) return evaluate_rollouts(step);
  const auto t0 = Clock::now();
  v1::EvalMetrics em;
  em.step = step;
  em.rank = env_.ctx.rank;
  // No held-out sample: nothing to evaluate, and a loss of 0 would look like a result (the
  // warning at setup names the empty set); callbacks see no evaluation.
  if (plan_->eval_samples == 0) {
    em.loss = std::nan("");
    if (eval_tasks_) end_evaluation(step, em, t0);
    return em;
  }
  // [loss_sum, correct, samples, targets, has_accuracy], summed over ranks at the end.
  double totals[5] = {0, 0, 0, 0, 0};
  const EvalShard shard = eval_shard(plan_->eval_samples, plan_->eval_max_batches * plan_->eval_batch_size * env_.ctx.world_size,
                                     plan_->eval_batch_size, env_.ctx.world_size, env_.ctx.rank);
  parts_.model.call("train", [](v1::Model& m) { m.train(false); return 0; });
  {
    torch::NoGradGuard no_grad;
    for (int64_t b = 0; b < shard.batches; ++b) {
      std::vector<int64_t> idx = shard.batch(b);
      // Every rank runs the same number of forwards (a sharded strategy's forward is a
      // collective); a rank whose share ran out evaluates sample 0 and discards the result.
      const bool filler = idx.empty();
      if (filler) idx = {0};
      v1::Batch batch = get_batch(v1::Split::Eval, idx);
      v1::ModelOutput out = objective_forward(v1::Split::Eval, batch, idx, filler);
      if (filler) continue;
      totals[0] += out.loss_sum.item<double>();
      totals[2] += static_cast<double>(batch.num_samples);
      totals[3] += static_cast<double>(batch.num_targets);
      if (out.num_correct >= 0) totals[1] += static_cast<double>(out.num_correct), totals[4] = 1;
    }
  }
  // The objective's held-out figures (sum, count) follow the five totals.
  std::vector<double> all(totals, totals + 5);
  const std::vector<v1::ObjectiveMetric> objective = objective_metrics(v1::Split::Eval);
  for (const auto& m : objective) all.push_back(m.sum), all.push_back(m.count);
  torch::Tensor t = torch::tensor(all, torch::kDouble);
  wait(sum_over_ranks(t, "all_reduce (evaluation metrics)"), "wait (evaluation metrics)");
  const double* r = t.data_ptr<double>();
  const double loss_sum = r[0];
  const int64_t correct = static_cast<int64_t>(std::llround(r[1]));
  em.samples = static_cast<int64_t>(std::llround(r[2]));
  em.targets = static_cast<int64_t>(std::llround(r[3]));
  const bool has_acc = r[4] > 0;
  parts_.model.call("train", [](v1::Model& m) { m.train(true); return 0; });
  em.loss = em.targets ? loss_sum / static_cast<double>(em.targets) : 0;
  em.accuracy = has_acc && em.targets ? static_cast<double>(correct) / em.targets : -1;
  for (size_t i = 0; i < objective.size(); ++i)
    if (r[5 + 2 * i + 1] > 0) em.extra[objective[i].name] = r[5 + 2 * i] / r[5 + 2 * i + 1];
  end_evaluation(step, em, t0);
  if (env_.lead) {
    std::cout << "[eval step " << step << "] loss " << std::fixed << std::setprecision(4) << em.loss;
    // More targets than samples: a language model's tokens, each predicted from those before.
    if (em.accuracy >= 0)
      std::cout << (em.targets > em.samples ? " | next-token accuracy " : " | accuracy ")
                << std::setprecision(2) << 100 * em.accuracy << "%";
    for (const char* k : {"rewards/margins", "logps/chosen"})
      if (auto it = em.extra.find(k); it != em.extra.end())
        std::cout << " | " << k << " " << std::setprecision(4) << it->second;
    std::cout << std::defaultfloat << " | " << em.samples << " samples | " << std::setprecision(3)
              << em.time_s << " s" << std::defaultfloat << std::setprecision(6) << std::endl;
  }
  return em;
}

}  // namespace trainrun::core
