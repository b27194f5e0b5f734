// core::train: one rank's training run, built and executed as a Run in phases (core/src/run/:
// build -> resume -> step -> evaluate -> save -> finish, as docs/design.md's step picture draws
// it).
#include "trainrun/core/trainer.hpp"

#include "run/run.hpp"

namespace trainrun::core {

int train(const JobConfig& job, const Registry& registry) {
  Run run(job, registry);
  return run.execute();
}

}  // namespace trainrun::core
