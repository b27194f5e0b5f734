#pragma once
// The NCCL communicator's bookkeeping of operations in flight, kept free of CUDA so that it is
// unit-tested without a device (tests/unit/unit_cuda.cpp drives it with scripted events).
//
// Each operation enqueued on the communicator's stream is recorded here with the event recorded
// after it, its deadline and its text. The watchdog thread polls: operations complete in stream
// order, so it retires finished ones from the front; the first unfinished one whose deadline has
// passed is the timeout to report (NCCL kernels of later operations cannot finish before it).
// The tensors an operation uses stay referenced here until it is retired, so the caching
// allocator cannot hand their memory to another stream's kernels while NCCL still reads them.
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace trainrun::plugins::cuda {

/// What the bookkeeping needs of a CUDA event: has the work before it finished?
class CompletionProbe {
 public:
  virtual ~CompletionProbe() = default;
  /// True once every operation recorded before the event has finished (cudaEventQuery ==
  /// cudaSuccess). Must not block.
  virtual bool done() = 0;
};

/// One operation in flight.
struct PendingOp {
  uint64_t seq = 0;          ///< the Monitor's sequence number (0 for send/recv)
  std::string text;          ///< "all_reduce(sum, float32 x 1000, 4000 B)"
  std::chrono::steady_clock::time_point deadline;
  std::shared_ptr<CompletionProbe> end;  ///< recorded on the stream after the operation
  std::shared_ptr<void> keep_alive;      ///< the tensors it reads and writes
};

/// Result of one poll.
struct PollResult {
  std::vector<uint64_t> finished;   ///< sequence numbers retired, in order (seq 0 omitted)
  std::optional<PendingOp> expired;  ///< the oldest unfinished op past its deadline
};

/// FIFO of operations in stream order; thread-safe (the issuing thread adds, the watchdog polls).
class PendingOps {
 public:
  using Clock = std::chrono::steady_clock;

  /// Appends an op enqueued after all earlier ones on the same stream.
  void add(PendingOp op) {
    std::lock_guard<std::mutex> lock(mu_);
    ops_.push_back(std::move(op));
  }

  /// Retires the finished ops at the front; reports the first unfinished one if it is past its
  /// deadline at `now`. An op is only examined once every op before it has finished, since a
  /// later op on the same stream cannot finish first.
  PollResult poll(Clock::time_point now) {
    PollResult r;
    std::lock_guard<std::mutex> lock(mu_);
    while (!ops_.empty()) {
      PendingOp& front = ops_.front();
      if (front.end->done()) {
        if (front.seq != 0) r.finished.push_back(front.seq);
        ops_.pop_front();
        continue;
      }
      if (now >= front.deadline) r.expired = front;
      break;
    }
    return r;
  }

  /// Ops not yet retired.
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ops_.size();
  }

  /// Drops every op (after an abort: their events will never be waited on again).
  std::vector<PendingOp> clear() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<PendingOp> out(ops_.begin(), ops_.end());
    ops_.clear();
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::deque<PendingOp> ops_;
};

/// The device a rank uses: device_ids[local_rank] when device_ids is given, else local_rank.
/// Throws ConfigError-style text through `fail` (context-free so it is unit-testable):
/// device_ids shorter than the ranks on this node, an id outside [0, device_count), or a
/// local rank with no device of its own when device_ids is empty.
inline int select_device(const std::vector<int64_t>& device_ids, int local_rank,
                         int local_world_size, int device_count,
                         const std::function<void(const std::string&)>& fail) {
  if (!device_ids.empty()) {
    if (static_cast<int64_t>(device_ids.size()) < local_world_size) {
      fail("device_ids lists " + std::to_string(device_ids.size()) + " device(s) but " +
           std::to_string(local_world_size) + " ranks run on this node (one id per local rank)");
      return -1;
    }
    const int64_t id = device_ids[static_cast<size_t>(local_rank)];
    if (id < 0 || id >= device_count) {
      fail("device_ids[" + std::to_string(local_rank) + "] = " + std::to_string(id) +
           " is not a visible CUDA device (" + std::to_string(device_count) +
           " visible: 0.." + std::to_string(device_count - 1) + ")");
      return -1;
    }
    return static_cast<int>(id);
  }
  if (local_rank >= device_count) {
    fail("local rank " + std::to_string(local_rank) + " has no CUDA device of its own (" +
         std::to_string(device_count) +
         " visible); run at most as many ranks per node as GPUs, or share one with "
         "device_ids = [0, 0, ...] and collectives = \"gloo\" (NCCL refuses two ranks on one GPU)");
    return -1;
  }
  return local_rank;
}

}  // namespace trainrun::plugins::cuda
