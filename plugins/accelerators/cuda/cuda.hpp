#pragma once
// Accelerator `cuda`: one CUDA device per rank and a communicator over NCCL (or Gloo through
// host memory). Built only where the LibTorch found is a CUDA build (the PyPI wheel's).
#include <trainrun/interfaces.hpp>
#include <trainrun/runtime/cpu_runtime.hpp>

#include <memory>
#include <string>
#include <vector>

#include "communicator_overrides.hpp"

namespace trainrun::plugins::cuda {

/// Runs each operation of a host (CPU) communicator on CUDA tensors by staging them through
/// host memory: copy to the host (which waits for the current stream), run the inner operation
/// to completion, copy back. Synchronous (returns completed Work); it is how two ranks share one
/// GPU, which NCCL refuses, and a fallback where NCCL is missing. Tensors already on the CPU go
/// to the inner communicator as they are.
class HostStagingCommunicator final : public v1::Communicator {
 public:
  /// `owner` keeps whatever owns `inner` alive (the Gloo communicator).
  HostStagingCommunicator(std::shared_ptr<void> owner, v1::Communicator& inner);
  /// "gloo-cpu via host" for Gloo.
  std::string backend() const override { return inner_.backend() + " via host"; }

  TRAINRUN_COMMUNICATOR_OVERRIDES;
  std::shared_ptr<v1::Communicator> new_group(const std::vector<int>& ranks) override;

 private:
  std::shared_ptr<void> owner_;
  v1::Communicator& inner_;
  std::shared_ptr<v1::Communicator> group_;  // keeps a sub-group's inner communicator alive
};

/// The cuda accelerator. Options: `device_ids` (device per local rank; default: the local
/// rank), `collectives` ("nccl" | "gloo"), `timeout_s`, `stall_warning_s`, `check_collectives`,
/// `blocking_wait`, `threads` (as cpu's). Throws ConfigError (exit code 2) when no CUDA device is
/// visible (the message carries the CUDA runtime's error), when a local rank has no device,
/// and when nccl is asked to put two ranks on one device.
class CudaAccelerator final : public v1::Accelerator {
 public:
  static void declare_options(v1::OptionSchema& schema);
  CudaAccelerator(const v1::Options& options, const v1::RunContext& ctx);
  ~CudaAccelerator() override;
  c10::Device device() const override;
  v1::Communicator& communicator() override { return *comm_; }
  /// The CUDA caching allocator's statistics of this device: current and peak allocated bytes
  /// (what tensors hold, as the CPU tracker counts), total = the device's memory.
  v1::MemoryStats memory_stats() const override;
  std::string describe() const override;

 private:
  int device_ = 0;
  std::string collectives_;
  std::string device_text_;
  std::shared_ptr<void> gloo_;  // the Gloo communicator behind collectives = "gloo"
  std::shared_ptr<v1::Communicator> comm_;
  v1::cpu::ThreadPlan threads_;
};

/// The number of visible CUDA devices; throws ConfigError "[accelerator] cuda: no CUDA device
/// visible (cudaGetDeviceCount: <CUDA error name>: <text>)" when there are none.
int visible_devices(const std::string& context);

/// Duplicate devices among the first `local_world_size` entries of device_ids (NCCL refuses two
/// ranks on one GPU): the text "device 0 for local ranks 0 and 1", or "" when there is none.
std::string shared_device(const std::vector<int64_t>& device_ids, int local_world_size);

}  // namespace trainrun::plugins::cuda
