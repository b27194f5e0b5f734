// The launch checks (launcher.hpp: launch_layout_problem), asked by the job validation and by
// launch(), so that `trainrun check` and a launch refuse the same layouts with the same words.
#include "trainrun/core/launcher.hpp"

#include <string>

namespace trainrun::core {

std::optional<LaunchLayoutProblem> launch_layout_problem(const LaunchSpec& spec) {
  const std::string nnodes = std::to_string(spec.nnodes);
  if (spec.nproc_per_node < 1) return LaunchLayoutProblem{"nproc_per_node", "[launch] nproc_per_node must be at least 1"};
  if (spec.nnodes < 1) return LaunchLayoutProblem{"nnodes", "[launch] nnodes must be at least 1"};
  if (spec.node_rank < 0) return LaunchLayoutProblem{"node_rank", "[launch] node_rank must be at least 0"};
  if (spec.node_rank >= spec.nnodes)
    return LaunchLayoutProblem{"node_rank", "[launch] node_rank " + std::to_string(spec.node_rank) +
                                                " must be less than nnodes " + nnodes};
  if (spec.master_port < 0 || spec.master_port > 65535)
    return LaunchLayoutProblem{"master_port", "[launch] master_port " + std::to_string(spec.master_port) +
                                                  " is not a port"};
  if (spec.master_port == 0 && spec.nnodes > 1)
    return LaunchLayoutProblem{"master_port",
                               "[launch] master_port = 0 (pick a free port) works only with nnodes = 1; "
                               "with nnodes = " + nnodes +
                               " every node must be given the same port (e.g. master_port = 29500)"};
  if (spec.mpiexec && spec.nnodes > 1)
    return LaunchLayoutProblem{"nnodes",
                               "[launch] nnodes = " + nnodes +
                               " with the mpiexec launcher: trainrun starts mpiexec on one node only; for "
                               "several nodes run `mpiexec -f hostfile -n N trainrun --config ...` yourself "
                               "(each process then reads its rank from mpiexec)"};
  if (!(spec.rendezvous_timeout_s > 0))
    return LaunchLayoutProblem{"rendezvous_timeout_s", "[launch] rendezvous_timeout_s must be > 0"};
  if (!(spec.grace_s >= 0)) return LaunchLayoutProblem{"stop_grace_s", "[launch] stop_grace_s must be >= 0"};
  if (!(spec.save_timeout_s >= 0))
    return LaunchLayoutProblem{"stop_save_timeout_s", "[launch] stop_save_timeout_s must be >= 0"};
  if (spec.max_restarts > 0 && spec.mpiexec)
    return LaunchLayoutProblem{"max_restarts", "[launch] max_restarts works with trainrun's own agent, not mpiexec"};
  return std::nullopt;
}

}  // namespace trainrun::core
