#include "gloo.hpp"

#include <trainrun/error.hpp>

#include "backend_options.hpp"
#include "comm_common.hpp"
#include "cpu_threads.hpp"

namespace trainrun::plugins {

using namespace trainrun::v1;

namespace {
constexpr const char* kBackend = "gloo-cpu";
}  // namespace

void GlooAccelerator::declare_options(OptionSchema& schema) {
  comm::declare_threads_option(schema);
  comm::declare_backend_options(schema);
  schema.boolean("shm", true,
                 "ranks on the same machine exchange through shared memory instead of loopback "
                 "TCP: send/recv always, all_reduce/reduce_scatter/all_gather when every rank "
                 "of the group is on this machine");
  schema.choice("allreduce_algorithm", "auto", {"auto", "ring", "bcube"},
                "all-reduce algorithm: auto (a ring over shared memory when every rank of the "
                "group is on this machine; two levels when it spans machines with the same "
                "number of its ranks on each: shared memory within a machine, Gloo's ring "
                "between machines; else Gloo's ring), or Gloo's ring (bandwidth-optimal) or "
                "bcube (fewer steps, better for small tensors) over TCP always");
}

GlooAccelerator::GlooAccelerator(const Options& options, const RunContext& ctx) {
  threads_ = comm::apply_threads_option(options, ctx, kBackend);
  GlooSettings s{comm::backend_options(options)};
  const std::string algorithm = options.get_string("allreduce_algorithm");
  s.allreduce_algorithm = algorithm == "bcube"  ? GlooSettings::Algorithm::Bcube
                          : algorithm == "ring" ? GlooSettings::Algorithm::Ring
                                                : GlooSettings::Algorithm::Auto;
  s.shm = options.get_bool("shm");
  all_reduce_over_shm_ = s.allreduce_algorithm == GlooSettings::Algorithm::Auto;
  s.rendezvous_timeout_s = comm::rendezvous_timeout_from_environment();
  GlooWorld world = open_gloo_world(s, ctx);
  transport_ = std::move(world.transport);
  comm_ = std::move(world.communicator);
}

std::string GlooAccelerator::describe() const {
  // "+ shm" when this rank reaches every other rank over shared memory, "+ shm (1 of 3
  // peers)" when only some are on its machine.
  const int shm = comm_->shm_peers(), others = comm_->world_size() - 1;
  const int single = comm_->shm_single_copy_peers();
  const std::string via = shm == 0       ? ""
                          : shm == others ? " + shm"
                                          : detail::cat(" + shm (", shm, " of ", others, " peers)");
  // Large messages read straight from the sender's memory, to every shm peer or some.
  const std::string copy = single == 0     ? ""
                           : single == shm ? " + single copy"
                                           : detail::cat(" + single copy (", single, " of ", shm, ")");
  // Which collectives run over shared memory (every rank of the world on this machine).
  const int machines = comm_->hierarchy_machines();
  const std::string collectives =
      machines > 0 ? detail::cat("; all_reduce in two levels: shm within a machine, TCP between ",
                                 machines, " machines")
      : !comm_->shm_collectives() ? ""
      : all_reduce_over_shm_      ? "; collectives over shm"
                                  : "; all_reduce by Gloo's TCP algorithm, other collectives over shm";
  return detail::cat(kBackend, " (", transport_, via, copy, collectives, "), rank ",
                     comm_->rank(), " of ", comm_->world_size(), ", ",
                     v1::cpu::describe(threads_));
}


}  // namespace trainrun::plugins
