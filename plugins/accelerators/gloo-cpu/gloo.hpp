#pragma once
// Accelerator `gloo-cpu`: the host CPU and a communicator over Gloo's TCP transport, one process
// per rank (started by the trainrun launcher, torchrun or by hand with the torchrun
// environment). The communicator is comm-gloo's GlooCommunicator (shared with cuda's
// collectives = "gloo"); this plugin owns the accelerator: its options, threads and banner.
#include <trainrun/interfaces.hpp>
#include <trainrun/runtime/cpu_runtime.hpp>
#include <trainrun/runtime/memory.hpp>

#include <memory>
#include <string>

#include "gloo_communicator.hpp"

namespace trainrun::plugins {

/// The host CPU with a Gloo communicator across all ranks of the job. Options: `threads`,
/// `blas_threads`, `pin` (as cpu's), `timeout_s`, `stall_warning_s`, `check_collectives`,
/// `allreduce_algorithm` (auto|ring|bcube), `shm` (shared memory between ranks of one machine).
/// The world is joined by open_gloo_world() (store from MASTER_ADDR/MASTER_PORT, the network
/// interface Gloo listens on); the rendezvous timeout comes from TRAINRUN_RENDEZVOUS_TIMEOUT_S
/// (default 300 s).
class GlooAccelerator final : public v1::Accelerator {
 public:
  static void declare_options(v1::OptionSchema& schema);
  GlooAccelerator(const v1::Options& options, const v1::RunContext& ctx);
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  v1::Communicator& communicator() override { return *comm_; }
  /// This process's LibTorch CPU bytes (the tracker of trainrun/runtime/memory.hpp) and physical
  /// RAM.
  v1::MemoryStats memory_stats() const override { return v1::memory::cpu_stats(); }
  std::string describe() const override;

 private:
  std::string transport_;  ///< "tcp 127.0.0.1", "tcp eth0", "tcp host-a" (describe() adds "+ shm")
  std::unique_ptr<GlooCommunicator> comm_;
  bool all_reduce_over_shm_ = true;  ///< allreduce_algorithm auto (the banner says so)
  v1::cpu::ThreadPlan threads_;
};

}  // namespace trainrun::plugins
