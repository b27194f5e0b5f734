#pragma once
// Accelerator `cpu`: the host CPU and a world-of-one communicator.
#include <trainrun/interfaces.hpp>
#include <trainrun/runtime/cpu_runtime.hpp>
#include <trainrun/runtime/memory.hpp>

#include <memory>
#include <string>
#include <vector>

namespace trainrun::plugins {

/// The communicator of a single process (backend "local"). Every collective is what the
/// operation means for world_size 1: all_reduce and broadcast leave the tensor as it is (Avg
/// divides by 1), all_gather and reduce_scatter copy the input into the output, barrier returns
/// at once. send/recv throw, since there is no peer. Preconditions (defined, contiguous, CPU,
/// sizes, dtypes) are checked as a multi-rank communicator checks them, so code that passes
/// here does not fail only once it runs on more ranks.
class LocalCommunicator final : public v1::Communicator {
 public:
  explicit LocalCommunicator(double default_timeout_s) : timeout_s_(default_timeout_s) {}
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "local"; }
  /// The timeout used where an operation's options give none (seconds; unused by the ops).
  double default_timeout_s() const { return timeout_s_; }

  std::shared_ptr<v1::Work> all_reduce(at::Tensor& tensor, const v1::AllReduceOptions& opts = {}) override;
  std::shared_ptr<v1::Work> reduce_scatter(const at::Tensor& input, at::Tensor& output,
                                       const v1::ReduceScatterOptions& opts = {}) override;
  std::shared_ptr<v1::Work> all_gather(const at::Tensor& input, at::Tensor& output,
                                   const v1::AllGatherOptions& opts = {}) override;
  std::shared_ptr<v1::Work> broadcast(at::Tensor& tensor, const v1::BroadcastOptions& opts = {}) override;
  std::shared_ptr<v1::Work> send(const at::Tensor& tensor, const v1::PointToPointOptions& opts) override;
  std::shared_ptr<v1::Work> recv(at::Tensor& tensor, const v1::PointToPointOptions& opts) override;
  std::shared_ptr<v1::Work> barrier(const v1::BarrierOptions& opts = {}) override;
  std::shared_ptr<v1::Communicator> new_group(const std::vector<int>& ranks) override;

 private:
  double timeout_s_;
};

/// The host CPU. Options `threads`, `blas_threads`, `pin`: the rank's thread pools and core
/// pinning (comm-common/cpu_threads.hpp, SDK trainrun/runtime/cpu_runtime.hpp).
class CpuAccelerator final : public v1::Accelerator {
 public:
  static void declare_options(v1::OptionSchema& schema);
  CpuAccelerator(const v1::Options& options, const v1::RunContext& ctx);
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  v1::Communicator& communicator() override { return comm_; }
  /// This process's LibTorch CPU bytes (the tracker of trainrun/runtime/memory.hpp) and physical
  /// RAM.
  v1::MemoryStats memory_stats() const override { return v1::memory::cpu_stats(); }
  std::string describe() const override;

 private:
  LocalCommunicator comm_;
  v1::cpu::ThreadPlan threads_;
};

}  // namespace trainrun::plugins
