#pragma once
// Shared by the collective backends (gloo-cpu, mpi, nccl); the static library
// trainrun_comm_common that each backend plugin links, not part of the SDK ABI.
//  - rendezvous through c10d's TCPStore (LibTorch's own key-value store, as torchrun uses it);
//  - per-group sequence numbers and the cross-rank collective-order check: every collective is
//    fingerprinted (op, reduce op/root, dtype, element count) and compared through the store
//    before it runs, so a rank that issues a different collective than its peers at the same
//    sequence number is an immediate error naming both, not a hang or a wrong answer;
//  - the stall inspector: a watchdog thread per group publishes this rank's progress (last
//    completed and first pending collective) and, when an operation has waited longer than
//    stall_warning_s, prints which ranks have not arrived, with host, pid and their progress;
//  - tensor preconditions and the Work object both backends return.
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <trainrun/error_text.hpp>
#include <trainrun/interfaces.hpp>
#include <trainrun/types.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend_options.hpp"

namespace trainrun::comm {

// ---------------------------------------------------------------------------------------------
// Rendezvous

/// Where the job's key-value store is (torchrun's environment).
struct StoreAddress {
  std::string host;           ///< MASTER_ADDR
  int port = 0;               ///< MASTER_PORT, 1..65535
  bool agent_serves = false;  ///< TRAINRUN_AGENT_STORE=1: the launcher serves it, not rank 0
  std::string from;           ///< where the address came from when not MASTER_ADDR/PORT
};

/// Reads MASTER_ADDR, MASTER_PORT and TRAINRUN_AGENT_STORE. Under srun (SLURM_PROCID) without
/// either: the first host of SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST) and a port of 20000 +
/// (SLURM_JOB_ID x 16 + SLURM_STEP_ID mod 16) mod 40000, served by rank 0. nullopt when none
/// of these is set; throws ConfigError naming the variable when one is missing or malformed.
std::optional<StoreAddress> store_address_from_environment();

/// Connects to the store, or on rank 0 (when no agent serves it) starts serving it first.
/// timeout_s bounds connecting and every later get/wait. Throws Error naming host:port (and
/// saying the port is in use when rank 0 cannot bind it).
std::shared_ptr<c10d::Store> open_store(const StoreAddress& address, int rank, int world_size,
                                        double timeout_s);

/// Starts a store server in this process on `port` (0 = any free port); returns it and sets
/// *bound_port. For backends that hand the address to peers themselves (mpi broadcasts it).
std::shared_ptr<c10d::Store> serve_store(int port, int world_size, double timeout_s,
                                         int* bound_port);

/// TRAINRUN_RENDEZVOUS_TIMEOUT_S (set by the launcher from [launch] rendezvous_timeout_s), in
/// seconds; 300 when unset. Throws ConfigError when it is not a positive number.
double rendezvous_timeout_from_environment();

/// This machine's host name (gethostname), for messages.
std::string host_name();

/// "0, 2, 3": a list of ranks as every backend's messages and group names write it.
std::string join_ranks(const std::vector<int>& ranks);

/// The steady-clock time `seconds` from now, the deadline of an operation's timeout.
inline std::chrono::steady_clock::time_point deadline_after(double seconds) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::duration<double>(seconds));
}

/// Who a rank is, for messages.
struct PeerIdentity {
  int rank = -1;
  std::string host;
  int64_t pid = 0;
};

/// Every rank announces itself under `prefix` and waits for all the others. Throws Error when
/// some have not arrived within timeout_s: "<where>: rendezvous of 4 ranks: rank(s) 2, 3 did
/// not arrive within 30 s (arrived: 0 on host a pid 11, 1 on host a pid 12)". Returns all
/// identities, index = rank.
std::vector<PeerIdentity> rendezvous(c10d::Store& store, const std::string& prefix, int rank,
                                     int world_size, double timeout_s, const std::string& where);

// ---------------------------------------------------------------------------------------------
// Operations

/// One collective as issued; what the order check compares and what messages show.
/// "3 s", "0.25 s", "12.5 s": a duration as every message of the backends writes it.
std::string seconds_text(double seconds);

struct OpDesc {
  std::string op;  ///< "all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", ...
  std::string detail;  ///< "sum", "avg", "root 2", "" (part of the fingerprint)
  c10::ScalarType dtype = c10::ScalarType::Undefined;  ///< Undefined for barrier
  /// Elements and bytes of this rank's input tensor; -1 where they differ between ranks
  /// (all_to_all), so that the order check compares op, detail and dtype only.
  int64_t numel = 0;
  int64_t bytes = 0;
  /// "all_reduce(sum, float32 x 1000, 4000 B)"
  std::string text() const;
  /// `op` with `detail` on this rank's contiguous `input`: its dtype, element and byte counts.
  static OpDesc of(std::string op, std::string detail, const at::Tensor& input);
  /// `op` on `input` whose size differs between ranks (all_to_all): its dtype only (numel and
  /// bytes -1), so that the order check compares op and dtype.
  static OpDesc of_uneven(std::string op, const at::Tensor& input);
};

/// Short dtype name as users write it: "float32", "bfloat16", "uint8", ... (the SDK's).
using v1::dtype_name;
/// float32, float64, bfloat16, float16, int32, int64, uint8 (the SDK's communicator_dtype).
inline bool supported_dtype(c10::ScalarType t) { return v1::communicator_dtype(t); }
/// "sum", "avg", "min", "max".
std::string reduce_op_name(v1::ReduceOp op);

/// Throws Error "<backend>: <op>: <role> tensor ..." unless `t` is defined, on the CPU, dense,
/// contiguous and of a supported dtype.
void check_tensor(const at::Tensor& t, const std::string& backend, const char* op,
                  const char* role);

/// reduce_scatter's preconditions: both tensors pass check_tensor, share a dtype, and input
/// holds world_size x output.numel() elements. Throws Error naming the backend and the sizes.
void check_reduce_scatter(const at::Tensor& input, const at::Tensor& output, int world_size,
                          const std::string& backend);
/// all_gather's: as reduce_scatter's, with output holding world_size x input.numel() elements.
void check_all_gather(const at::Tensor& input, const at::Tensor& output, int world_size,
                      const std::string& backend);
/// What those two check alike, for a backend whose tensors pass its own `check_one(tensor,
/// role)` instead of check_tensor (nccl: on its device): input ("input") and output ("output")
/// pass it, share a dtype, and `whole` (reduce_scatter's input, all_gather's output) holds
/// world_size x chunk.numel() elements, which `rule` words ("input must hold world_size x
/// output"). Throws Error "<backend>: <op>: ...".
void check_chunked(const at::Tensor& input, const at::Tensor& output, int world_size,
                   const std::string& backend, const char* op, const at::Tensor& whole,
                   const at::Tensor& chunk, const char* rule,
                   const std::function<void(const at::Tensor&, const char*)>& check_one);

// ---------------------------------------------------------------------------------------------
// Monitor: sequence numbers, order check, stall inspector

/// One Monitor per communicator (group).
class Monitor {
 public:
  struct Config {
    std::string backend;          ///< "gloo-cpu", "mpi"
    std::string group;            ///< "world", "group 1 [0, 2]"
    std::string prefix;           ///< store key prefix unique to this group, e.g. "g0/"
    int rank = 0;                 ///< rank in this group
    int world_size = 1;
    std::vector<int> global_ranks;  ///< global rank of each group rank (for messages)
    double stall_warning_s = 60;  ///< 0 = inspector off
    bool check_order = true;      ///< fingerprint every collective through the store
  };
  /// `peers`: identities by group rank (from rendezvous()). Starts the watchdog thread when
  /// stall_warning_s > 0.
  Monitor(std::shared_ptr<c10d::Store> store, Config config, std::vector<PeerIdentity> peers);
  ~Monitor();
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  /// Assigns the next sequence number (1, 2, ...), runs the order check and records the op as
  /// pending. Call on the issuing thread, in issue order, before the operation starts. Throws
  /// Error on a mismatch: "gloo-cpu: collective mismatch at #17 in group world: rank 1 issued
  /// all_reduce(sum, float32 x 10, 40 B) but rank 0 issued broadcast(root 0, float32 x 10, 40 B)".
  uint64_t issue(const OpDesc& op);
  /// issue() in two halves, for a backend that runs its operations on a worker thread: begin()
  /// assigns the sequence number and records the op as pending (cheap; on the issuing thread,
  /// in issue order); check_order() does the store round trip and throws on a mismatch (on the
  /// worker, in sequence order, right before the operation runs), so the issuing thread (e.g.
  /// autograd, launching a gradient bucket) never waits for the store.
  uint64_t begin(const OpDesc& op);
  void check_order(uint64_t seq, const OpDesc& op);
  /// For a backend whose transport checks the order in band (its messages carry each
  /// collective's description): words the mismatch it found at op `seq` between this rank's
  /// `op` and group rank `other`'s `other_text` exactly as check_order() does, records it in
  /// the store for the other ranks' failure reports (a store that cannot be reached is
  /// ignored), and returns the message. Never throws.
  std::string mismatch(uint64_t seq, const OpDesc& op, int other, const std::string& other_text);
  /// Marks op `seq` finished (successfully or not); ops finish in issue order.
  void finished(uint64_t seq);
  /// Error text for op `seq`: "<backend>: <op text> #<seq> in group <g> <what>; still missing:
  /// rank 2 (host h, pid 5; last completed #16 all_reduce(...); pending none; last heard 3.0 s
  /// ago)". Reads the peers' progress from the store (bounded by a short timeout).
  std::string describe_failure(uint64_t seq, const std::string& what) const;
  /// Writes this rank's progress to the store now (the watchdog does it at most once per tick).
  /// Called by a backend before it tears down its connections, so that the peers whose
  /// operations then fail report where this rank really was, not its last periodic record.
  /// Never throws (a lost store is ignored).
  void publish_now() noexcept;
  const Config& config() const { return config_; }
  /// Default operation timeout (seconds) used by backends; set by the owner.
  double timeout_s = 600;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Config config_;
};

/// A group's Monitor as every backend opens it: `group` names the group (backend, group,
/// prefix, rank, world_size, global_ranks); its stall_warning_s and check_order, and the
/// Monitor's default timeout_s, come from the accelerator's `options`.
std::shared_ptr<Monitor> open_monitor(std::shared_ptr<c10d::Store> store, Monitor::Config group,
                                      const BackendOptions& options,
                                      std::vector<PeerIdentity> peers);

// ---------------------------------------------------------------------------------------------
// Work

/// A Work completed by another thread (gloo-cpu runs each group's ops on one worker thread).
/// wait() rethrows the operation's error, or on timeout throws Error built by the monitor.
class FutureWork final : public v1::Work {
 public:
  FutureWork(std::shared_ptr<Monitor> monitor, uint64_t seq, std::string op_text,
             double timeout_s);
  /// Called once by the thread that ran the operation; `error` null on success.
  void finish(std::exception_ptr error);
  void wait(double timeout_s = 0) override;
  bool completed() const override;

 private:
  std::shared_ptr<Monitor> monitor_;
  uint64_t seq_;
  std::string op_text_;
  double timeout_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace trainrun::comm
