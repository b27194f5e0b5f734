// The run's context from the environment and its batch plan (plan.hpp).
#include "trainrun/core/plan.hpp"

#include <string>

#include "trainrun/core/launcher.hpp"
#include "trainrun/core/log.hpp"
#include "trainrun/core/run_dir.hpp"

namespace trainrun::core {

v1::RunContext context_from_environment(const JobConfig& job) {
  const WorkerEnvironment env = detect_worker_environment();
  v1::RunContext ctx;
  ctx.rank = env.rank;
  ctx.world_size = env.world_size;
  ctx.local_rank = env.local_rank;
  ctx.local_world_size = env.local_world_size;
  const int64_t nproc = job.launch.get_int("nproc_per_node");
  const int64_t nnodes = job.launch.get_int("nnodes");
  if (!env.is_worker && nproc * nnodes > 1)
    throw v1::ConfigError(job.file + ": [launch] asks for " + std::to_string(nproc * nnodes) +
                          " processes, but this process was not started by a launcher; run it "
                          "with `trainrun --config` (which launches them) or under mpiexec/srun");
  if (env.is_worker && env.world_size != nproc * nnodes && env.rank == 0)
    log_info(env.source + " started " + std::to_string(env.world_size) +
             " process(es); [launch] asks for " + std::to_string(nproc * nnodes) +
             " (nproc_per_node " + std::to_string(nproc) + " x nnodes " + std::to_string(nnodes) +
             "): the launcher's world size is used");
  ctx.seed = static_cast<uint64_t>(job.trainer.get_int("seed"));
  ctx.job_file = job.file;
  ctx.run_dir = run_dir_of(job);
  return ctx;
}

namespace {

// The layout is checked before the sampler exists, so its error is the job's sentence.
DistributedSampler::Options sampler_options(const v1::Options& trainer, int world_size, int rank,
                                            int64_t train_samples, int64_t per_sample) {
  const int64_t global = trainer.get_int("global_batch_size");
  const std::string error =
      batch_layout_error(global, trainer.get_int("micro_batch_size"), world_size);
  if (!error.empty()) throw v1::ConfigError(error);
  DistributedSampler::Options so;
  so.num_samples = train_samples;
  so.global_batch_size = global / per_sample;
  so.world_size = world_size;
  so.rank = rank;
  so.seed = static_cast<uint64_t>(trainer.get_int("seed"));
  so.drop_last = trainer.get_bool("drop_last");
  return so;
}

}  // namespace

BatchPlan make_plan(const v1::Options& trainer, int world_size, int rank, int64_t train_samples,
                    int64_t completions_per_sample, int64_t steps_per_batch) {
  BatchPlan bp{v1::TrainPlan{},
               DistributedSampler(sampler_options(trainer, world_size, rank, train_samples,
                                                  completions_per_sample))};
  v1::TrainPlan& plan = bp.steps;
  plan.global_batch_size = trainer.get_int("global_batch_size");
  const int64_t micro = trainer.get_int("micro_batch_size");
  const int64_t mb = micro > 0 ? micro : plan.global_batch_size / world_size;
  plan.micro_batch_size = mb;
  plan.accumulation_steps = plan.global_batch_size / (mb * world_size);
  plan.steps_per_epoch = bp.sampler.steps_per_epoch() * steps_per_batch;
  const int64_t max_steps = trainer.get_int("max_steps");
  const int64_t max_epochs = trainer.get_int("max_epochs");
  if (max_steps == 0 && max_epochs == 0)
    throw v1::ConfigError("[trainer] set max_steps or max_epochs (both are 0)");
  plan.total_steps = max_steps > 0 ? max_steps : max_epochs * plan.steps_per_epoch;
  return bp;
}

}  // namespace trainrun::core
