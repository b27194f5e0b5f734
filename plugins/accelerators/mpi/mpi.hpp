#pragma once
// Accelerator `mpi`: the host CPU, with collectives over MPI (built and tested with MPICH 4.0.2).
// For jobs started as `mpiexec -n N trainrun --config job.toml`, or by trainrun's launcher
// through mpiexec. The MPI types stay in mpi_detail.hpp, so this header does not need <mpi.h>.
#include <trainrun/collectives/all_to_all.hpp>
#include <trainrun/interfaces.hpp>
#include <trainrun/runtime/cpu_runtime.hpp>
#include <trainrun/runtime/memory.hpp>

#include <memory>
#include <string>
#include <vector>

#include "communicator_overrides.hpp"

namespace trainrun::plugins {

namespace mpi_detail {
struct Runtime;  // the process's MPI library state: init/finalize, reduction ops, failure flag
struct Group;    // one MPI communicator with its Monitor and the operations in flight on it
struct Op;       // one nonblocking MPI operation
}  // namespace mpi_detail

/// One nonblocking MPI operation (MPI_Iallreduce, MPI_Isend, ...). wait() drives MPI's progress
/// by polling MPI_Test until the operation completes or its timeout expires, then throws Error
/// naming the operation, its sequence number and the ranks that have not arrived. What has to
/// happen after completion (Avg's division, copying out of a temporary, reporting the operation
/// finished to the Monitor) happens once, whichever call first sees the operation complete.
/// Dropping a Work before it completes is allowed: the communicator keeps the operation (and
/// its tensors) alive and completes it later.
class MpiWork final : public v1::Work {
 public:
  MpiWork(std::shared_ptr<mpi_detail::Group> group, std::shared_ptr<mpi_detail::Op> op);
  /// timeout_s <= 0: the operation's own (its options' timeout_s, else [accelerator] timeout_s).
  void wait(double timeout_s = 0) override;
  /// True once the operation has completed, successfully or not (wait() then throws the error).
  bool completed() const override;

 private:
  std::shared_ptr<mpi_detail::Group> group_;
  std::shared_ptr<mpi_detail::Op> op_;
};

/// Collectives and point-to-point transfers among the ranks of one MPI communicator (backend
/// "mpi"): a duplicate of MPI_COMM_WORLD for the accelerator's group, an MPI_Comm_split of it for
/// each new_group(). Every collective is checked (tensor, sizes, dtypes, root) and then issued to
/// the group's comm::Monitor, which numbers it and, with check_collectives, compares it with what
/// the other ranks issued at the same number, before any data moves. Supported dtypes: float32,
/// float64, int32, int64, uint8, and float16/bfloat16 (reduced in float by user-defined MPI ops).
/// Use from one thread at a time (MPI is initialised with MPI_THREAD_SERIALIZED).
class MpiCommunicator final : public v1::Communicator, public v1::AllToAllCommunicator {
 public:
  explicit MpiCommunicator(std::shared_ptr<mpi_detail::Group> group);
  ~MpiCommunicator() override;
  std::string backend() const override { return "mpi"; }

  TRAINRUN_COMMUNICATOR_OVERRIDES;
  /// ABI 1.13: MPI_Ialltoallv on bytes (each part below 2 GiB: MPI counts are 32-bit).
  std::shared_ptr<v1::Work> all_to_all(const at::Tensor& input, at::Tensor& output,
                                       const v1::AllToAllOptions& opts = {}) override;
  /// c10d semantics: every rank of this group calls it with the same list (ranks of this
  /// group); ranks not in the list get nullptr. In the new group, rank i is ranks[i].
  std::shared_ptr<v1::Communicator> new_group(const std::vector<int>& ranks) override;

 private:
  std::shared_ptr<mpi_detail::Group> group_;
};

/// The host CPU, and the job's ranks (MPI_COMM_WORLD) as its communicator. MPI is initialised
/// here unless the process already did it, and finalised when the accelerator (and every group
/// made from it) is gone, unless an operation failed or the accelerator is destroyed by an
/// exception: MPI_Finalize waits for every rank, so a failing rank that finalises keeps the job
/// alive until its peers time out, while one that does not makes mpiexec end every rank at once.
/// Options: threads, blas_threads, pin (as cpu's), timeout_s (default collective timeout), stall_warning_s (the
/// Monitor's stall report; 0 = off), check_collectives (the cross-rank order check).
class MpiAccelerator final : public v1::Accelerator {
 public:
  static void declare_options(v1::OptionSchema& schema);
  MpiAccelerator(const v1::Options& options, const v1::RunContext& ctx);
  ~MpiAccelerator() override;
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  v1::Communicator& communicator() override { return *world_; }
  /// This process's LibTorch CPU bytes (the tracker of trainrun/runtime/memory.hpp) and physical
  /// RAM.
  v1::MemoryStats memory_stats() const override { return v1::memory::cpu_stats(); }
  /// "mpi (MPICH 4.0.2), rank 0 of 4, 1 thread (auto: ...), BLAS 1 thread, pinned to CPU 0"
  std::string describe() const override;

 private:
  std::shared_ptr<mpi_detail::Runtime> runtime_;
  std::unique_ptr<MpiCommunicator> world_;
  v1::cpu::ThreadPlan threads_;
};

}  // namespace trainrun::plugins
