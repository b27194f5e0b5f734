// The rollout phase of an online objective (ABI 1.12, trainrun/rollout.hpp): every
// num_iterations optimizer steps, this rank's prompts of the step are completed by the model
// (KV-cache batched generation, evaluation mode, adapters active), the completions scored by the
// job's [[rewards]], handed to the objective (advantages), cut into the step's micro-batches and,
// where the objective asks, scored once more under no_grad by the current model (Old) and by the
// reference model (adapters off). Each rollout is appended to <run_dir>/completions/rank-N.jsonl.
#include <torch/types.h>
#include <torch/utils.h>

#include <trainrun/batch_generation.hpp>
#include <trainrun/generation.hpp>
#include <trainrun/rollout.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "objective_task.hpp"
#include "run.hpp"
#include "trainrun/core/rewards.hpp"

namespace fs = std::filesystem;

namespace trainrun::core {

using v1::ConfigError;

namespace {

// Whether every parameter of the model holds its whole value: a strategy that shards
// parameters (fsdp, zero-3) frees their storage between forwards.
std::string sharded_parameter(v1::Model& model) {
  for (const auto& p : model.named_parameters()) {
    const at::Tensor& t = p.tensor;
    if (!t.has_storage()) return p.name;
    const size_t need = static_cast<size_t>(t.storage_offset() + t.numel()) * t.element_size();
    if (t.numel() > 0 && t.storage().nbytes() < need) return p.name;
  }
  return "";
}

}  // namespace

void check_online_job(const JobConfig& job, const v1::RolloutSpec& spec, int world_size) {
  if (job.rewards.empty())
    throw ConfigError(job.file + ": [objective] " + job.objective.plugin +
                      " trains on rewards: list at least one [[rewards]] table (docs/rl.md)");
  const int64_t global = job.trainer.get_int("global_batch_size");
  if (spec.num_generations < 1 || global % (spec.num_generations * world_size) != 0)
    throw ConfigError(job.file + ": [trainer] global_batch_size " + std::to_string(global) +
                      " counts completions and must be a multiple of [objective] "
                      "num_generations " +
                      std::to_string(spec.num_generations) + " x world_size " +
                      std::to_string(world_size) +
                      " (each prompt's completions are generated on one rank)");
}

// In build (set_up_model), before the plan: an online objective's needs, checked where they can
// be before anything runs.
void Run::set_up_online_objective() {
  if (!parts_.objective.obj) return;
  caps_.online = dynamic_cast<v1::OnlineObjective*>(parts_.objective.obj.get());
  if (caps_.online == nullptr) return;
  const v1::RolloutSpec spec = parts_.objective.call(
      "rollout_spec", [&](v1::Objective&) { return caps_.online->rollout_spec(); });
  caps_.rollout = spec;
  const std::string who = job_.file + ": [objective] " + job_.objective.plugin;
  caps_.prompts = dynamic_cast<v1::PromptSource*>(parts_.dataset.obj.get());
  if (caps_.prompts == nullptr)
    throw ConfigError(who + " generates from prompts: [data] " + job_.data.plugin +
                      " is no prompt dataset (ABI 1.12 PromptSource); use [data] plugin = "
                      "\"prompts\"");
  caps_.decoder = dynamic_cast<v1::IncrementalDecoder*>(parts_.model.obj.get());
  if (caps_.decoder == nullptr ||
      dynamic_cast<v1::PaddedDecoder*>(parts_.model.obj.get()) == nullptr)
    throw ConfigError(who + " generates completions during training: " + parts_.model.label +
                      " cannot decode batches of prompts with a KV cache (ABI 1.10 "
                      "PaddedDecoder); the llama plugin can");
  if (spec.temperature != 1.0 && abi_minor_of_model() < 12)
    throw ConfigError(who + ": temperature = " + std::to_string(spec.temperature) + " needs a " +
                      "model that scores logits / temperature (ABI 1.12 LogitTemperature); " +
                      parts_.model.label + " is built against an older SDK: use temperature = 1");
  check_online_job(job_, spec, env_.ctx.world_size);
  parts_.rewards = std::make_unique<RewardSet>(job_, registry_, env_.ctx);
  // Every prompt's row has the fields the rewards compare with: found now, not at a rollout.
  for (v1::Split split : {v1::Split::Train, v1::Split::Eval}) {
    std::vector<v1::RewardSample> rows;
    const int64_t n = parts_.dataset.call("size", [&](v1::Dataset& d) { return d.size(split); });
    for (int64_t i = 0; i < n; ++i) {
      const v1::PromptSample p = caps_.prompts->prompt(split, i);
      v1::RewardSample s;
      s.row = p.row;
      s.row_index = p.row_index;
      rows.push_back(std::move(s));
    }
    parts_.rewards->check_rows(rows);
  }
}

// After the callbacks' on_setup: a KL term needs the reference model, which is the policy with
// its adapters off (a frozen copy of a fully trained model is not built yet).
void Run::check_online_reference() {
  if (caps_.online == nullptr || !caps_.rollout.reference) return;
  if (caps_.adapters == nullptr)
    throw ConfigError(job_.file + ": [objective] " + job_.objective.plugin +
                      " beta > 0 needs a reference model: with a [[callbacks]] lora it is the "
                      "model with its adapters off; a frozen copy of a fully trained model is not "
                      "built yet (set beta = 0, TRL's default, or train adapters)");
}

// The model's parameters whole on this rank until the scope ends: a strategy that shards them
// gathers them (FullParameters, collective: every rank calls this at the same point); one that
// shards them without offering that is refused, naming `who` wants them.
std::unique_ptr<v1::Scope> Run::whole_parameters(const std::string& who) {
  auto* whole = dynamic_cast<v1::FullParameters*>(parts_.strategy.obj.get());
  if (whole != nullptr)
    return parts_.strategy.call("full_parameters",
                                [&](v1::Strategy&) { return whole->full_parameters(); });
  if (const std::string p = sharded_parameter(*parts_.model.obj); !p.empty())
    throw ConfigError(job_.file + ": " + who + " with the whole model on each rank, and " +
                      parts_.strategy.label + " shards it (" + p +
                      " is not whole between forwards) without offering its parameters whole " +
                      "(ABI 1.12 FullParameters)");
  return nullptr;
}

// The objective's sampling settings, the dataset's EOS and padding ids; no prompts yet.
v1::GenerationRequest Run::rollout_request() {
  const v1::RolloutSpec& spec = caps_.rollout;
  v1::GenerationRequest req;
  req.num_generations = spec.num_generations;
  req.max_completion_length = spec.max_completion_length;
  req.temperature = spec.temperature;
  req.top_k = spec.top_k;
  req.top_p = spec.top_p;
  req.eos_token_ids = parts_.dataset.call(
      "eos_token_ids", [&](v1::Dataset&) { return caps_.prompts->eos_token_ids(); });
  req.pad_token_id = parts_.dataset.call(
      "pad_token_id", [&](v1::Dataset&) { return caps_.prompts->pad_token_id(); });
  return req;
}

// Generation with the whole model, in evaluation mode, without autograd: a strategy that shards
// parameters gathers them once for the whole generation (FullParameters, collective: every rank
// calls this at the same point, with or without prompts) and releases them after.
v1::GenerationResult Run::generate_whole(const v1::GenerationRequest& req, const char* what) {
  const std::unique_ptr<v1::Scope> scope =
      whole_parameters("[objective] " + job_.objective.plugin + " generates");
  v1::GenerationResult gen;
  if (req.prompts.empty()) return gen;
  parts_.model.call("train", [](v1::Model& m) {
    m.train(false);
    return 0;
  });
  {
    torch::NoGradGuard no_grad;
    gen = parts_.model.call(what,
                            [&](v1::Model&) { return v1::generate_batch(*caps_.decoder, req); });
  }
  parts_.model.call("train", [](v1::Model& m) {
    m.train(true);
    return 0;
  });
  return gen;
}

// The step's micro-batches: the current rollout's, made anew every num_iterations steps.
StepBatches Run::rollout_step(int64_t s) {
  const int64_t mu = caps_.rollout.num_iterations;
  const int64_t batch = s / mu;
  if (!progress_.rollout || progress_.rollout->batch != batch)
    make_rollout(batch);
  else
    progress_.rollout->fresh = false;
  return progress_.rollout->batches;
}

void Run::make_rollout(int64_t batch) {
  const int64_t per_epoch = plan_->batches.sampler.steps_per_epoch();
  const std::vector<int64_t> idx =
      plan_->batches.sampler.rank_batch(batch / per_epoch, batch % per_epoch);
  Rollout r;
  r.batch = batch;
  std::vector<v1::PromptSample> prompts;
  v1::GenerationRequest req = rollout_request();
  for (int64_t i : idx) {
    prompts.push_back(parts_.dataset.call(
        "prompt", [&](v1::Dataset&) { return caps_.prompts->prompt(v1::Split::Train, i); }));
    req.prompts.push_back(prompts.back().ids);
  }
  // One seed per completion from (job seed, rollout, the prompt's place in the step's global
  // batch, its generation): the sampler gives rank r the places r, r + W, ..., so the same job
  // draws the same completions at any world size, and again when it runs again.
  const uint64_t rollout_seed = v1::detail::mix_seed(env_.ctx.seed, static_cast<uint64_t>(batch));
  for (size_t j = 0; j < idx.size(); ++j) {
    const uint64_t place =
        static_cast<uint64_t>(env_.ctx.rank) + j * static_cast<uint64_t>(env_.ctx.world_size);
    for (int64_t g = 0; g < req.num_generations; ++g)
      req.completion_seeds.push_back(v1::detail::mix_seed(v1::detail::mix_seed(rollout_seed, place),
                                                          static_cast<uint64_t>(g)));
  }
  const auto t0 = Clock::now();
  v1::GenerationResult gen = generate_whole(req, "generate (rollout)");
  r.generation_s = std::chrono::duration<double>(Clock::now() - t0).count();
  for (const auto& c : gen.completions) r.generated_tokens += static_cast<double>(c.ids.size());
  score_rollout(r, prompts, gen);
  cut_rollout(r, prompts, gen);
  progress_.rollout = std::move(r);
  rollout_passes();
}

// What the rewards see of each completion: its prompt's row and text, its decoded text and ids.
std::vector<v1::RewardSample> Run::reward_samples(const std::vector<v1::PromptSample>& prompts,
                                                  const v1::GenerationResult& gen) {
  std::vector<v1::RewardSample> samples;
  for (const auto& c : gen.completions) {
    const v1::PromptSample& p = prompts[static_cast<size_t>(c.prompt)];
    v1::RewardSample s;
    s.row = p.row;
    s.prompt = p.text;
    s.completion =
        parts_.dataset.call("decode", [&](v1::Dataset&) { return caps_.prompts->decode(c.ids); });
    s.completion_ids = c.ids;
    s.row_index = p.row_index;
    samples.push_back(std::move(s));
  }
  return samples;
}

// Rewards for every completion, to the objective, and to the rank's completions file.
void Run::score_rollout(Rollout& r, const std::vector<v1::PromptSample>& prompts,
                        const v1::GenerationResult& gen) {
  const int64_t N = static_cast<int64_t>(gen.completions.size());
  const std::vector<v1::RewardSample> samples = reward_samples(prompts, gen);
  const auto t0 = Clock::now();
  const std::vector<std::vector<double>> scores = parts_.rewards->score(samples);
  const std::vector<double> combined = parts_.rewards->combine(scores);
  r.reward_s = std::chrono::duration<double>(Clock::now() - t0).count();
  v1::RolloutScores rs;
  const int64_t K = static_cast<int64_t>(parts_.rewards->size());
  rs.rewards = torch::tensor(combined, torch::kDouble);
  rs.per_reward = torch::empty({N, K}, torch::kDouble);
  for (int64_t k = 0; k < K; ++k) {
    rs.reward_names.push_back(parts_.rewards->name(static_cast<size_t>(k)));
    for (int64_t i = 0; i < N; ++i)
      rs.per_reward[i][k] = scores[static_cast<size_t>(k)][static_cast<size_t>(i)];
  }
  rs.completion_lengths = torch::empty({N}, torch::kLong);
  rs.truncated = torch::empty({N}, torch::kBool);
  for (int64_t i = 0; i < N; ++i) {
    rs.completion_lengths[i] =
        static_cast<int64_t>(gen.completions[static_cast<size_t>(i)].ids.size());
    rs.truncated[i] = gen.completions[static_cast<size_t>(i)].finish == "length";
  }
  rs.num_generations = caps_.rollout.num_generations;
  parts_.objective.call("begin_rollout", [&](v1::Objective&) {
    caps_.online->begin_rollout(rs, env_.ctx.world_size > 1 ? parts_.comm : nullptr);
    return 0;
  });
  // One line per completion, for reading and for replaying a rollout elsewhere (TRL).
  const fs::path dir = fs::path(env_.ctx.run_dir) / "completions";
  fs::create_directories(dir);
  std::ofstream f(dir / ("rank-" + std::to_string(env_.ctx.rank) + ".jsonl"), std::ios::app);
  for (int64_t i = 0; i < N; ++i) {
    const auto& c = gen.completions[static_cast<size_t>(i)];
    nlohmann::json j;
    j["step"] = r.batch * caps_.rollout.num_iterations + 1;
    j["rank"] = env_.ctx.rank;
    j["completion_index"] = i;
    j["row_index"] = prompts[static_cast<size_t>(c.prompt)].row_index;
    j["prompt"] = samples[static_cast<size_t>(i)].prompt;
    j["prompt_ids"] = prompts[static_cast<size_t>(c.prompt)].ids;
    j["completion"] = samples[static_cast<size_t>(i)].completion;
    j["completion_ids"] = c.ids;
    j["finish"] = c.finish;
    nlohmann::json per = nlohmann::json::object();
    for (int64_t k = 0; k < K; ++k) {
      const double v = scores[static_cast<size_t>(k)][static_cast<size_t>(i)];
      per[rs.reward_names[static_cast<size_t>(k)]] =
          std::isnan(v) ? nlohmann::json() : nlohmann::json(v);
    }
    j["rewards"] = per;
    j["reward"] = combined[static_cast<size_t>(i)];
    f << j.dump() << "\n";
  }
  if (!f)
    throw v1::Error("cannot write " +
                    (dir / ("rank-" + std::to_string(env_.ctx.rank) + ".jsonl")).string());
}

// The rollout's rows (prompt + completion; the targets are the completion's tokens) cut into the
// step's micro-batches in completion order, each right-padded to its longest row.
void Run::cut_rollout(Rollout& r, const std::vector<v1::PromptSample>& prompts,
                      const v1::GenerationResult& gen) {
  const int64_t mb = plan_->steps().micro_batch_size, steps = plan_->steps().accumulation_steps;
  const int64_t N = static_cast<int64_t>(gen.completions.size());
  TR_CHECK(N == mb * steps, "rollout: ", N, " completions for ", steps, " micro-batches of ", mb);
  const int64_t pad = parts_.dataset.call(
      "pad_token_id", [&](v1::Dataset&) { return caps_.prompts->pad_token_id(); });
  for (int64_t k = 0; k < steps; ++k) {
    int64_t T = 1;
    for (int64_t i = k * mb; i < (k + 1) * mb; ++i) {
      const auto& c = gen.completions[static_cast<size_t>(i)];
      T = std::max<int64_t>(
          T,
          static_cast<int64_t>(prompts[static_cast<size_t>(c.prompt)].ids.size() + c.ids.size()) -
              1);
    }
    at::Tensor input = torch::full({mb, T}, pad, torch::kLong);
    at::Tensor target = torch::full({mb, T}, v1::kIgnoreIndex, torch::kLong);
    auto in = input.accessor<int64_t, 2>(), tg = target.accessor<int64_t, 2>();
    v1::Batch b;
    std::vector<int64_t> indices;
    for (int64_t row = 0; row < mb; ++row) {
      const int64_t i = k * mb + row;
      const auto& c = gen.completions[static_cast<size_t>(i)];
      std::vector<int64_t> ids = prompts[static_cast<size_t>(c.prompt)].ids;
      const int64_t P = static_cast<int64_t>(ids.size());
      ids.insert(ids.end(), c.ids.begin(), c.ids.end());
      for (int64_t t = 0; t + 1 < static_cast<int64_t>(ids.size()); ++t) {
        in[row][t] = ids[static_cast<size_t>(t)];
        if (t + 1 >= P) tg[row][t] = ids[static_cast<size_t>(t + 1)];
      }
      b.num_tokens += static_cast<int64_t>(ids.size()) - 1;
      indices.push_back(i);
    }
    b.input = input;
    b.target = target;
    b.num_samples = mb;
    b.num_targets = mb;  // the loss is summed over completions (rollout.hpp)
    r.batches.micro.push_back(std::move(b));
    r.batches.indices.push_back(std::move(indices));
    r.batches.local[0] += static_cast<double>(mb);
    r.batches.local[1] += static_cast<double>(r.batches.micro.back().num_tokens);
    r.batches.local[2] += static_cast<double>(mb);
  }
}

// The objective's no-grad passes over a new rollout: the current model (Old: the importance
// ratio's denominator for the later iterations) and the reference (adapters off).
void Run::rollout_passes() {
  const Rollout& r = *progress_.rollout;
  for (v1::ObjectivePass pass : {v1::ObjectivePass::Old, v1::ObjectivePass::Reference}) {
    if (pass == v1::ObjectivePass::Old ? !caps_.rollout.old_logps : !caps_.rollout.reference)
      continue;
    const bool off = pass == v1::ObjectivePass::Reference;
    torch::NoGradGuard no_grad;
    if (off) caps_.adapters->set_adapters_enabled(false);
    try {
      for (size_t k = 0; k < r.batches.micro.size(); ++k) {
        v1::ObjectiveForward f;
        f.split = v1::Split::Train;
        f.pass = pass;
        f.indices = r.batches.indices[k];
        parts_.objective.call("begin_forward", [&](v1::Objective& o) {
          o.begin_forward(f);
          return 0;
        });
        auto scope =
            parts_.precision.call("autocast", [](v1::Precision& p) { return p.autocast(); });
        parts_.strategy.call("forward",
                             [&](v1::Strategy& s) { return s.forward(r.batches.micro[k]); });
      }
    } catch (...) {
      if (off) caps_.adapters->set_adapters_enabled(true);
      throw;
    }
    if (off) caps_.adapters->set_adapters_enabled(true);
  }
}

// The rollout's own figures for the step's metrics: time and speed of generation and rewards.
void Run::add_rollout_metrics(std::map<std::string, double>& extra) const {
  if (!progress_.rollout || !progress_.rollout->fresh) return;
  const Rollout& r = *progress_.rollout;
  extra["generation_s"] = r.generation_s;
  extra["generation_tokens_per_s"] = r.generation_s > 0 ? r.generated_tokens / r.generation_s : 0;
  extra["reward_s"] = r.reward_s;
}

}  // namespace trainrun::core

namespace trainrun::core {

// An online objective's evaluation: num_generations completions of every held-out prompt (the
// prompts split over the ranks; at most eval_max_batches x eval_batch_size completions per rank
// when eval_max_batches is set), sampled as in training from one seed per rank, so evaluations
// at different steps draw from the same random streams; scored by the [[rewards]]. No loss: the
// figures are the rewards' means (TRL's eval_reward, eval_rewards/<name>/mean; an accuracy
// reward's mean is the fraction solved) and the completions' lengths.
v1::EvalMetrics Run::evaluate_rollouts(int64_t step) {
  const auto t0 = Clock::now();
  v1::EvalMetrics em;
  em.step = step;
  em.rank = env_.ctx.rank;
  em.loss = std::nan("");
  const v1::RolloutSpec& spec = caps_.rollout;
  const int world = env_.ctx.world_size, rank = env_.ctx.rank;
  int64_t limit = plan_->eval_samples;
  if (plan_->eval_max_batches > 0)
    limit = std::min(limit, std::max<int64_t>(1, plan_->eval_max_batches * plan_->eval_batch_size *
                                                     world / spec.num_generations));
  std::vector<v1::PromptSample> prompts;
  v1::GenerationRequest req = rollout_request();
  for (int64_t i = rank; i < limit; i += world) {
    prompts.push_back(parts_.dataset.call(
        "prompt", [&](v1::Dataset&) { return caps_.prompts->prompt(v1::Split::Eval, i); }));
    req.prompts.push_back(prompts.back().ids);
  }
  req.batch_size = plan_->eval_batch_size;
  req.seed = v1::detail::mix_seed(v1::detail::mix_seed(env_.ctx.seed, 0xE7A1ULL),
                                  static_cast<uint64_t>(rank));
  const size_t K = parts_.rewards->size();
  // [completions, tokens, truncated, combined reward sum, then per reward: count, sum]
  std::vector<double> sums(4 + 2 * K, 0.0);
  {
    v1::GenerationResult gen = generate_whole(req, "generate (evaluation)");
    const std::vector<v1::RewardSample> samples = reward_samples(prompts, gen);
    for (const auto& c : gen.completions)
      sums[0] += 1, sums[1] += static_cast<double>(c.ids.size()),
          sums[2] += c.finish == "length" ? 1 : 0;
    const auto scores =
        samples.empty() ? std::vector<std::vector<double>>(K) : parts_.rewards->score(samples);
    for (double v : parts_.rewards->combine(scores)) sums[3] += v;
    for (size_t k = 0; k < K; ++k)
      for (double v : scores[k])
        if (!std::isnan(v)) sums[4 + 2 * k] += 1, sums[5 + 2 * k] += v;
  }
  at::Tensor t = torch::tensor(sums, torch::kDouble);
  wait(sum_over_ranks(t, "all_reduce (evaluation rewards)"), "wait (evaluation rewards)");
  const double* r = t.data_ptr<double>();
  em.samples = static_cast<int64_t>(std::llround(r[0]));
  em.targets = static_cast<int64_t>(std::llround(r[1]));
  if (r[0] > 0) {
    em.extra["reward"] = r[3] / r[0];
    em.extra["completions/mean_length"] = r[1] / r[0];
    em.extra["completions/clipped_ratio"] = r[2] / r[0];
  }
  for (size_t k = 0; k < K; ++k)
    if (r[4 + 2 * k] > 0)
      em.extra["rewards/" + parts_.rewards->name(k) + "/mean"] = r[5 + 2 * k] / r[4 + 2 * k];
  end_evaluation(step, em, t0);
  if (env_.lead) {
    std::cout << "[eval step " << step << "] reward " << std::fixed << std::setprecision(4)
              << (r[0] > 0 ? r[3] / r[0] : std::nan(""));
    for (size_t k = 0; k < K; ++k)
      if (r[4 + 2 * k] > 0)
        std::cout << " | " << parts_.rewards->name(k) << " " << r[5 + 2 * k] / r[4 + 2 * k];
    std::cout << std::defaultfloat << " | " << em.samples << " completions of " << limit
              << " prompts | " << std::setprecision(3) << em.time_s << " s" << std::setprecision(6)
              << std::endl;
  }
  return em;
}

}  // namespace trainrun::core
