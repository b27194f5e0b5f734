#pragma once
// The mpi plugin's state behind mpi.hpp, private to the plugin. Its parts, one file each:
//  - mpi_runtime.cpp: the process's MPI library (init/finalize, error texts, the 16-bit
//    reduction ops) and waiting for set-up requests;
//  - mpi_ops.cpp: operations in flight (issuing a collective, completion, waiting, Work);
//  - mpi.cpp: MpiCommunicator, each operation mapped onto its MPI call, and new_group;
//  - mpi_accelerator.cpp: the accelerator (the job's store, MPI_COMM_WORLD's duplicate).
#include <mpi.h>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend_options.hpp"
#include "comm_common.hpp"
#include "mpi.hpp"

namespace trainrun::plugins::mpi_detail {

using Clock = std::chrono::steady_clock;

constexpr const char* kBackend = "mpi";

// --- the MPI library (mpi_runtime.cpp) -------------------------------------------------------

/// The error class of an MPI error code, and its most specific line where that says more.
std::string error_string(int code);

/// "600", "2.5": a timeout as the user wrote it.
std::string seconds_text(double s);

// --- process-wide MPI state ------------------------------------------------------------------

/// Shared by the accelerator and every group made from it, so MPI is finalised only after the
/// last communicator is gone (a group can outlive the accelerator in a strategy's hands, and
/// freeing its MPI_Comm after MPI_Finalize would be an error).
///
/// Whether to finalise follows from how MPICH's mpiexec (Hydra) treats a rank that exits: after
/// MPI_Finalize, the others carry on; without it, mpiexec ends every rank at once and exits with
/// that rank's code. MPI_Finalize waits for every rank, so a rank that finalises after a failure
/// waits for peers that may be stuck until their own timeout; one that skips it ends the job now,
/// with its error. A rank that finishes normally must finalise, or it ends its peers' work.
struct Runtime {
  bool initialized_here = false;
  const char* abandon_reason = nullptr;  // set: do not finalise (see above), and why
  int64_t pending_ops = 0;               // posted, completion not yet seen, over all groups
  bool shut_down = false;
  std::string library;
  MPI_Op half_ops[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};  // sum, min, max
  MPI_Op bf16_ops[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  int accelerators = 0;  // created so far: keeps each one's store keys apart
  // The store rank 0 serves, kept until after MPI_Finalize: finalising waits for every rank, so
  // no peer's Monitor still reads the store when its server goes away.
  std::shared_ptr<c10d::Store> served_store;

  static std::shared_ptr<Runtime> acquire();
  void fail(const char* why = "an MPI operation failed or timed out") {
    if (!abandon_reason) abandon_reason = why;
  }
  void shutdown();
  ~Runtime() { shutdown(); }
};

bool finalized();

// --- waiting ---------------------------------------------------------------------------------

/// MPI moves data only inside MPI calls (MPICH runs no progress thread unless asked to): a
/// large collective is a pipeline of small steps, each started by some MPI_Test, so a waiting rank
/// that sleeps between tests stalls the transfer (4 MiB all_reduce, 2 ranks: 0.8 ms when
/// spinning, 10 ms with a 100 us spin and then sleeps). So the poll spins for the first 10 ms,
/// which covers a bucket-sized collective, yielding so that with more ranks than cores a peer on
/// the same core still gets to make its progress. Past that the peers are late, not busy: the
/// poll sleeps, doubling up to 1 ms, and tests in bursts between sleeps so a long transfer still
/// moves.
class Backoff {
 public:
  void pause() {
    if (burst_ > 0 || Clock::now() - start_ < std::chrono::milliseconds(10)) {
      if (burst_ > 0) --burst_;
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
    burst_ = 32;
  }

 private:
  Clock::time_point start_ = Clock::now();
  std::chrono::microseconds sleep_{20};
  int burst_ = 0;
};

/// Waits for a request that is not a communicator operation (set-up steps), with a timeout so
/// that set-up, too, cannot hang on a rank that never arrives.
void wait_request(MPI_Request& request, double timeout_s, const std::string& what, Runtime& rt);

/// Throws Error "mpi: <what>: <call> failed: ..." (and marks the runtime failed) unless rc is
/// MPI_SUCCESS.
void check_mpi(int rc, const char* call, const std::string& what, Runtime& rt);

// --- operations and groups (mpi_ops.cpp) -----------------------------------------------------

struct Op {
  MPI_Request request = MPI_REQUEST_NULL;
  uint64_t seq = 0;       // the Monitor's sequence number; 0 for send/recv, which it does not see
  std::string text;       // "all_reduce(sum, float32 x 10, 40 B)", "send(...) to rank 1 tag 0"
  const char* call = "";  // the MPI function, for error messages
  double timeout_s = 0;
  std::vector<at::Tensor> keep_alive;  // MPI reads/writes these until completion
  std::function<void(const MPI_Status&)> on_success;
  bool posted = false;  // counted in Runtime::pending_ops
  bool done = false;
  std::exception_ptr error;
};

struct Group {
  std::shared_ptr<Runtime> rt;
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  int tag_ub = 32767;             // the smallest MPI_TAG_UB the standard allows
  std::string number;             // "" for the world, "1", "1.2" for groups of groups
  std::string name;               // "world", "group 1 [0, 2]"
  std::string prefix;             // store keys of this group's Monitor
  std::vector<int> global_ranks;  // by rank in this group
  std::shared_ptr<c10d::Store> store;
  std::shared_ptr<comm::Monitor> monitor;
  comm::BackendOptions options;  // timeout_s, stall_warning_s, check_collectives
  int children = 0;  // new_group calls so far: numbers sub-groups identically on every rank

  std::vector<std::shared_ptr<Op>> in_flight;  // posted, completion not yet seen; oldest first
  std::deque<std::shared_ptr<Op>> unreported;  // collectives not yet reported to the Monitor

  ~Group();
};

// What has to happen once per operation, when its completion (or failure) is first seen.
void on_completion(Group& g, Op& op, int rc, const MPI_Status& status);
// Whether `op` has completed (MPI_Test), running on_completion the first time it has.
bool test(Group& g, Op& op);
// Lets MPI progress the operations already in flight and retires those that finished, so that
// a Work nobody waits on still completes (and its Avg division runs) and the Monitor's progress
// stays current while a strategy issues bucket after bucket.
void progress(Group& g);
// Polls `op` until it completes or timeout_s (<= 0: its own) passes; throws its error, or one
// naming the ranks that have not arrived.
void wait_op(Group& g, Op& op, double timeout_s);

// After the MPI call that started `op` returned `rc`: `op` is in flight, or has failed and its
// error is thrown.
void track_posted(Group& g, const std::shared_ptr<Op>& op, int rc);

/// Starts one collective: the order check, then the MPI call (skipped for empty tensors, where
/// MPI has nothing to move but the sequence number and the check must still advance).
std::shared_ptr<v1::Work> start_collective(const std::shared_ptr<Group>& g,
                                           const comm::OpDesc& desc, double timeout_s, bool empty,
                                           const char* call,
                                           const std::function<int(MPI_Request*)>& post,
                                           std::vector<at::Tensor> keep_alive,
                                           std::function<void(const MPI_Status&)> on_success);

// --- groups (mpi.cpp) ------------------------------------------------------------------------

// `comm` as the group's communicator: its rank, size and tag bound, errors returned as codes.
void set_comm(Group& g, MPI_Comm comm, const std::string& what);
// The new group's Monitor, after every member has announced itself in the group's own store
// prefix (rendezvous also proves every member reached this point).
void attach_monitor(Group& g);

}  // namespace trainrun::plugins::mpi_detail
