#include "gloo_communicator.hpp"

#include <trainrun/collectives/ring_reduce_scatter.hpp>
#include <trainrun/error.hpp>
#include <trainrun/error_text.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <mutex>
#include <thread>
#include <type_traits>

#include "comm_common.hpp"
#include "reduce.hpp"
#include "shm.hpp"
#include "shm_collectives.hpp"

namespace trainrun::plugins {

using namespace trainrun::v1;

namespace {

constexpr const char* kBackend = "gloo-cpu";

using Millis = std::chrono::milliseconds;

Millis to_millis(double seconds) {
  return Millis(std::max<int64_t>(1, std::llround(seconds * 1000.0)));
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Element types and reductions

template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with the C++ type that has the tensor's dtype's layout. float16 and
// bfloat16 travel as c10's 16-bit types: Gloo's own float16 reductions are not exported from
// libgloo, and it has no bfloat16 at all, so both are reduced here, through float.
template <class F>
void dispatch(c10::ScalarType t, F&& f) {
  switch (t) {
    case c10::ScalarType::Float: return f(TypeTag<float>{});
    case c10::ScalarType::Double: return f(TypeTag<double>{});
    case c10::ScalarType::Half: return f(TypeTag<c10::Half>{});
    case c10::ScalarType::BFloat16: return f(TypeTag<c10::BFloat16>{});
    case c10::ScalarType::Int: return f(TypeTag<int32_t>{});
    case c10::ScalarType::Long: return f(TypeTag<int64_t>{});
    case c10::ScalarType::Byte: return f(TypeTag<uint8_t>{});
    default: TR_FAIL(kBackend, ": dtype ", comm::dtype_name(t), " is not supported");
  }
}

// Gloo's all-reduce of the contiguous CPU tensor `t` over `context` (Avg reduces as Sum; the
// caller divides).
void gloo_all_reduce(const std::shared_ptr<gloo::rendezvous::Context>& context, at::Tensor& t,
                     ReduceOp op, gloo::AllreduceOptions::Algorithm algorithm, uint32_t tag,
                     Millis timeout) {
  dispatch(t.scalar_type(), [&](auto type) {
    using T = typename decltype(type)::type;
    gloo::AllreduceOptions o(context);
    o.setOutput<T>(t.data_ptr<T>(), t.numel());
    o.setReduceFunction(comm::reduce_function<T>(op));
    o.setAlgorithm(algorithm);
    o.setTag(tag);
    o.setTimeout(timeout);
    gloo::allreduce(o);
  });
}

// Avg is a sum divided by the group size afterwards; integers truncate toward zero, as NCCL's
// ncclAvg does for them.
void divide_in_place(at::Tensor& t, int world_size) {
  if (world_size == 1) return;
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/false))
    t.div_(world_size, "trunc");
  else
    t.div_(world_size);
}

constexpr uint8_t kReduceScatterSlotPrefix = 0x71;  // unused by Gloo's collectives (0x01-0x08)

// ---------------------------------------------------------------------------------------------
// Gloo's rendezvous store on top of c10d's

// Gloo's connectFullMesh needs a gloo::rendezvous::Store; the job's store is a c10d one
// (TCPStore, or HashStore for a world of one), shared by every group. Keys get the group's
// prefix here rather than through c10d::PrefixStore, which wants an intrusive_ptr to a store
// that comm-common hands out as a shared_ptr.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(std::shared_ptr<c10d::Store> store, std::string prefix, Millis timeout)
      : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(prefix_ + key, std::vector<uint8_t>(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const auto v = store_->get(prefix_ + key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const Millis& timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    store_->wait(full, timeout);
  }

 private:
  std::shared_ptr<c10d::Store> store_;
  std::string prefix_;
  Millis timeout_;
};

// ---------------------------------------------------------------------------------------------
// A thread that runs tasks in the order they were posted

class SerialQueue {
 public:
  SerialQueue() : thread_([this] { loop(); }) {}
  ~SerialQueue() { stop(); }

  void post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> g(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_all();
  }
  /// Runs `task` on the calling thread if nothing is queued or running (so it still follows
  /// everything posted before it), else queues it. Saves a thread hand-off per message on the
  /// shared-memory path, where posting is all the worker would do.
  void run_or_post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (running_ || !tasks_.empty()) {
        tasks_.push_back(std::move(task));
        cv_.notify_all();
        return;
      }
      running_ = true;
    }
    task();  // tasks catch their own errors
    bool wake;
    {
      std::lock_guard<std::mutex> g(mu_);
      running_ = false;
      wake = !tasks_.empty() || stopping_;
    }
    // Only when the worker has something to do now: waking it after every inline task made
    // each small collective cost two context switches per rank (worker up, finds nothing,
    // sleeps), which on two cores preempted the ranks' own polling: a 4 KiB all-reduce at 2
    // ranks took 45-58 us, 3.8 switches per operation.
    if (wake) cv_.notify_all();
  }
  /// Runs what is queued, then joins.
  void stop() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return (stopping_ || !tasks_.empty()) && !running_; });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
        running_ = true;
      }
      task();  // tasks catch their own errors
      {
        std::lock_guard<std::mutex> g(mu_);
        running_ = false;
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool running_ = false;  // a task runs, on the worker or inline in run_or_post
  bool stopping_ = false;
  std::thread thread_;
};

// A send or recv through shared memory: waiting drives the transport on the waiting thread
// (see shm.hpp) instead of sleeping until another thread has copied the message.
class ShmWork final : public Work {
 public:
  ShmWork(std::shared_ptr<comm::FutureWork> inner, std::shared_ptr<shm::Transport> transport,
          std::string text)
      : inner_(std::move(inner)), transport_(std::move(transport)), text_(std::move(text)) {}
  /// The op's own timeout ends it with an error naming the channel (checked while waiting); a
  /// `timeout_s` given here ends only this wait.
  void wait(double timeout_s = 0) override {
    if (!inner_->completed()) {
      const auto deadline =
          timeout_s > 0 ? std::chrono::steady_clock::now() +
                              std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(timeout_s))
                        : std::chrono::steady_clock::time_point::max();
      transport_->wait_until([this] { return inner_->completed(); }, deadline);
      if (!inner_->completed()) TR_FAIL(text_, " timed out after ", timeout_s, " s");
    }
    inner_->wait();  // returns, or rethrows the op's error
  }
  bool completed() const override { return inner_->completed(); }

 private:
  std::shared_ptr<comm::FutureWork> inner_;
  std::shared_ptr<shm::Transport> transport_;
  std::string text_;
};

// Slots of point-to-point messages: a prefix no Gloo collective uses (theirs are 0x01-0x08;
// old-style algorithms take small integers from Context::nextSlot), then the tag, then a hash
// of dtype and byte count. Gloo enforces matching sizes inside its I/O thread, where a mismatch
// ends the process; with the size in the slot a mismatched send/recv pair never matches and
// both sides time out with an error naming the operation instead.
constexpr uint64_t kPointToPointSlotPrefix = 0x70;

// Shared-memory collectives of at most this many bytes run on the calling thread when the worker
// is idle. Below about 1 MiB the two thread hand-offs of a queued operation (to the worker and
// back) cost as much as moving the data, and callers of small collectives (a loss, a norm, a
// flag) wait for them at once; larger ones stay on the worker so that they overlap the
// caller's work (ddp's buckets during backward).
constexpr int64_t kInlineBytes = 1 << 20;

uint64_t point_to_point_slot(int tag, c10::ScalarType dtype, int64_t bytes) {
  uint64_t h = static_cast<uint64_t>(bytes) * 0x9E3779B97F4A7C15ull ^
               (static_cast<uint64_t>(dtype) + 1) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 29;
  return (kPointToPointSlotPrefix << 56) |
         (static_cast<uint64_t>(static_cast<uint32_t>(tag)) << 24) | (h & 0xFFFFFF);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// GlooCommunicator

struct GlooCommunicator::Impl {
  std::shared_ptr<c10d::Store> store;
  std::shared_ptr<gloo::transport::Device> device;
  GlooSettings settings;
  std::string id;      // "" for the world, "1", "1.2" for sub-groups
  std::string name;    // "world", "1 [0, 2]": messages say "group <name>"
  std::string prefix;  // store keys of this group: "g0/", "g1/", "g1.2/"
  std::vector<int> global_ranks;
  int rank = 0;
  int size = 1;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::shared_ptr<comm::Monitor> monitor;

  // Held from Monitor::issue until the task is queued, so that queue order is sequence order
  // even when several threads issue. Also guards groups_created.
  std::mutex issue_mu;
  int groups_created = 0;

  // poison: the first error; later calls rethrow it. broken: the transport is unusable, queued
  // operations fail without running. A collective-order mismatch poisons at once but breaks
  // only after the operations issued before it ran (the peers need them).
  std::mutex state_mu;
  std::exception_ptr poison;
  bool broken = false;
  gloo::transport::UnboundBuffer* reaping = nullptr;  // the buffer the reaper waits on
  bool reaping_send = false;
  // Operations issued and not yet completed; counted down before their Work completes, so a
  // caller that waited for everything sees 0.
  std::atomic<int64_t> in_flight{0};
  std::vector<unsigned char> reduce_scatter_scratch;  // the worker's, reused between calls
  // send/recv to peers on this machine (null: shm off, or no such peer); see shm.hpp. Its
  // threads complete Works through this Impl, so it is stopped in ~GlooCommunicator.
  std::shared_ptr<shm::Transport> shm;
  // Every rank of the group reaches every other over shm, agreed by all at set-up: the
  // collectives then run over shared memory (shm_collectives.hpp).
  bool shm_collectives = false;
  // The group spans machines, each holding the same number (>= 2) of its ranks, all reaching
  // each other over shm (agreed by all at set-up, plan_hierarchy): all_reduce runs in two
  // levels. node_ring: the group ranks on this machine, ascending; node_position: this rank's
  // index in it; column: Gloo's TCP mesh of the ranks at node_position on every machine
  // (machines ordered by their lowest group rank). Null column: one level.
  std::vector<int> node_ring;
  int node_position = 0;
  std::shared_ptr<gloo::rendezvous::Context> column;

  // The shared-memory collective's context: the same tag on every rank (from the sequence
  // number), negative so that it never equals a point-to-point tag of the strategies.
  // The ring is the whole group, or (within_machine) the shared-memory level of a hierarchical
  // all-reduce: this machine's ranks (node_ring), named so in errors.
  shm::CollectiveContext shm_context(uint32_t seq, Millis timeout, const std::string& text,
                                     bool within_machine = false) {
    shm::CollectiveContext c;
    c.transport = shm.get();
    c.rank = within_machine ? node_position : rank;
    c.size = within_machine ? static_cast<int>(node_ring.size()) : size;
    if (within_machine) c.ring = node_ring;
    c.tag = -1 - static_cast<int>(seq & 0x3FFFFFFF);
    c.timeout_s = std::chrono::duration<double>(timeout).count();
    c.deadline = std::chrono::steady_clock::now() + timeout;
    c.text = detail::cat(kBackend, ": ", text,
                         within_machine ? " within this machine (shared memory) in group "
                                        : " over shared memory in group ",
                         name);
    if (settings.check_collectives) c.order_text = text;
    return c;
  }

  // Decides, identically on every rank, whether all_reduce runs in two levels, and connects the
  // column mesh if so. Each rank publishes the group ranks it reaches over shm in both
  // directions; the levels apply only when those sets partition the group into >= 2 machines of
  // equal size >= 2 (the segment a rank reduces on its machine must match the segments its
  // column peers reduce on theirs). Otherwise all_reduce stays on Gloo's TCP ring.
  void plan_hierarchy(const std::string& where) {
    const std::string key = prefix + "shm_machine/";
    std::vector<int> local{rank};
    for (int r = 0; r < size; ++r)
      if (r != rank && shm->can_send(r) && shm->can_recv(r)) local.push_back(r);
    std::sort(local.begin(), local.end());
    const std::string mine = join(local);
    store->set(key + std::to_string(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    std::vector<std::string> of(size);
    for (int r = 0; r < size; ++r) {
      const auto v = store->get(key + std::to_string(r));
      of[r].assign(v.begin(), v.end());
    }
    // Machines by their lowest rank: a set is a machine where its lowest member is the rank
    // that published it; every member must have published the same set.
    std::vector<std::vector<int>> machines;
    std::vector<int> machine_of(size, -1);
    for (int r = 0; r < size; ++r) {
      if (machine_of[r] >= 0) continue;
      std::vector<int> members;
      std::istringstream in(of[r]);
      for (std::string t; std::getline(in, t, ',');) members.push_back(std::stoi(t));
      if (members.empty() || members.front() != r) return;  // asymmetric: one level
      for (int q : members) {
        if (q < 0 || q >= size || machine_of[q] >= 0 || of[q] != of[r]) return;
        machine_of[q] = static_cast<int>(machines.size());
      }
      machines.push_back(std::move(members));
    }
    const size_t per = machines.front().size();
    if (machines.size() < 2 || per < 2) return;
    for (const auto& m : machines)
      if (m.size() != per) return;
    const auto& here = machines[machine_of[rank]];
    node_ring = here;
    node_position = static_cast<int>(std::find(here.begin(), here.end(), rank) - here.begin());
    try {
      auto mesh = std::make_shared<gloo::rendezvous::Context>(machine_of[rank],
                                                               static_cast<int>(machines.size()));
      mesh->setTimeout(to_millis(settings.timeout_s));
      GlooStore column_store(store, prefix + "column" + std::to_string(node_position) + "/",
                             to_millis(settings.rendezvous_timeout_s));
      mesh->connectFullMesh(column_store, device);
      column = std::move(mesh);
    } catch (const std::exception& e) {
      TR_FAIL(where, ": rank ", global_ranks[rank], " could not connect Gloo's TCP mesh of the ",
              machines.size(), " ranks at position ", node_position,
              " of their machines (hierarchical all_reduce): ", what_of(e));
    }
  }

  // Declared last: destroyed (drained and joined) first, while everything above still exists.
  SerialQueue reaper;  // waits for point-to-point completions
  SerialQueue worker;  // runs operations in issue order

  std::string peer_name(int r) const {
    if (id.empty()) return "rank " + std::to_string(r);
    return "rank " + std::to_string(r) + " (global " + std::to_string(global_ranks[r]) + ")";
  }

  double resolve_timeout(double t) const { return t > 0 ? t : settings.timeout_s; }

  std::shared_ptr<comm::FutureWork> new_work(uint64_t seq, std::string text, double timeout_s) {
    ++in_flight;
    return std::make_shared<comm::FutureWork>(monitor, seq, std::move(text), timeout_s);
  }
  void complete(comm::FutureWork& work, std::exception_ptr error) {
    --in_flight;
    work.finish(std::move(error));
  }

  void throw_if_poisoned() {
    std::exception_ptr p;
    {
      std::lock_guard<std::mutex> g(state_mu);
      p = poison;
    }
    if (p) std::rethrow_exception(p);
  }

  std::exception_ptr broken_error() {
    std::lock_guard<std::mutex> g(state_mu);
    return broken ? poison : nullptr;
  }

  // Closes every connection of this group's mesh. Gloo has no call that both closes the pairs
  // and wakes this process's own threads blocked on them (Context::closeConnections wakes
  // nobody), but its TCP transport does exactly that when a wait on an unbound buffer times
  // out: it signals every pair of the context, whose pending operations then throw, and closes
  // their sockets, so the peers' operations fail with "connection closed" at once. A 1 ms wait
  // on a buffer with nothing posted is that timeout.
  void abort_transport() {
    // Shared-memory channels first: it wakes this rank's channel threads and tells the peers'.
    if (shm) shm->abort();
    // A Gloo wait that times out closes that context's connections (its peers' waits fail at
    // once); the machines' column mesh too, where a hierarchical all-reduce may wait.
    for (gloo::rendezvous::Context* mesh : {context.get(), column.get()}) {
      if (!mesh) continue;
      char byte = 0;
      try {
        auto buf = mesh->createUnboundBuffer(&byte, 1);
        buf->waitRecv(Millis(1));
      } catch (const std::exception&) {
        // the expected timeout
      }
    }
    std::lock_guard<std::mutex> g(state_mu);
    if (reaping) reaping_send ? reaping->abortWaitSend() : reaping->abortWaitRecv();
  }

  // Records the first failure, breaks the transport, and returns the error every failed
  // operation reports: the first one, whichever thread saw it.
  std::exception_ptr fail(std::exception_ptr error) {
    bool first_break = false;
    {
      std::lock_guard<std::mutex> g(state_mu);
      if (!poison) poison = error;
      if (!broken) broken = first_break = true;
      error = poison;
    }
    if (first_break) abort_transport();
    return error;
  }

  // After an in-band collective failed: the store's order check, which names a peer that
  // issued a different collective over another transport (it then waits in that one, and the
  // in-band check never sees its messages). A mismatch found is recorded in the store, where
  // describe_failure() reads it; a store that cannot be reached changes nothing.
  void check_order_after_failure(uint64_t seq, const comm::OpDesc& desc) {
    try {
      monitor->check_order(seq, desc);
    } catch (const std::exception&) {
    }
  }

  // Issues a collective and queues `body`, which runs on the worker with the operation's Gloo
  // tag and timeout. `inline_if_idle`: run it on the calling thread instead when nothing is
  // queued or running (see kInlineBytes).
  // `order_in_band`: the body runs over shared memory, whose messages carry the collective's
  // description (shm_context), so the order check costs no store round trip; the store check
  // then runs only after a failure, to name a collective that the peers issued over TCP.
  std::shared_ptr<Work> enqueue(const comm::OpDesc& desc, double timeout_s,
                                std::function<void(uint32_t tag, Millis timeout)> body,
                                bool inline_if_idle = false, bool order_in_band = false) {
    throw_if_poisoned();
    std::lock_guard<std::mutex> g(issue_mu);
    // The order check runs on the worker, right before the operation, not here: a caller such
    // as ddp's gradient hook (on the autograd thread) then never waits for a store round trip.
    // The worker runs operations in sequence order, so the checks happen in that order too.
    const uint64_t seq = monitor->begin(desc);
    auto work = new_work(seq, desc.text(), timeout_s);
    const Millis timeout = to_millis(timeout_s);
    auto task = [this, work, seq, desc, timeout, order_in_band, body = std::move(body)] {
      std::exception_ptr error = broken_error();
      if (!error && !order_in_band) {
        try {
          monitor->check_order(seq, desc);
        } catch (const std::exception&) {
          // Every operation issued before this one has run (the peers needed them); closing
          // the mesh now releases the peers blocked in the collective they issued here.
          error = fail(std::current_exception());
        }
      }
      if (!error) {
        try {
          // Sequence numbers are equal on every rank, so consecutive collectives never share
          // Gloo slots, even when one rank is already in the next one.
          body(static_cast<uint32_t>(seq), timeout);
        } catch (const shm::CollectiveMismatch& e) {
          error = fail(std::make_exception_ptr(
              Error(monitor->mismatch(seq, desc, e.peer, e.peer_text))));
        } catch (const shm::CollectiveTimeout&) {
          if (order_in_band) check_order_after_failure(seq, desc);
          // Worded as a Work's own timeout, naming the ranks that have not arrived.
          error = fail(std::make_exception_ptr(Error(monitor->describe_failure(
              seq, "timed out after " + comm::seconds_text(timeout.count() / 1000.0)))));
        } catch (const std::exception& e) {
          if (order_in_band) check_order_after_failure(seq, desc);
          error = fail(std::make_exception_ptr(
              Error(monitor->describe_failure(seq, "failed: " + what_of(e)))));
        }
      }
      monitor->finished(seq);
      complete(*work, error);
    };
    if (inline_if_idle)
      worker.run_or_post(std::move(task));
    else
      worker.post(std::move(task));
    return work;
  }

  // A send, a recv, or (reduce != None) a recv that combines the message into `tensor`.
  std::shared_ptr<Work> point_to_point(bool is_send, const at::Tensor& tensor,
                                       const PointToPointOptions& opts,
                                       std::optional<ReduceOp> reduce = std::nullopt) {
    const char* op = is_send ? "send" : !reduce ? "recv" : "recv_reduce";
    comm::check_tensor(tensor, kBackend, op, "the");
    TR_CHECK(opts.peer >= 0 && opts.peer < size, kBackend, ": ", op, " in group ", name,
             ": peer rank ", opts.peer, " is not a rank of this group (world_size ", size, ")");
    TR_CHECK(opts.peer != rank, kBackend, ": ", op, " in group ", name, ": peer rank ",
             opts.peer, " is this rank itself");
    throw_if_poisoned();
    const double timeout_s = resolve_timeout(opts.timeout_s);
    const int64_t bytes = tensor.numel() * static_cast<int64_t>(tensor.element_size());
    const char* how = !reduce ? "" : reduce == ReduceOp::Min ? "min, "
                                   : reduce == ReduceOp::Max ? "max, "
                                                             : "sum, ";
    const std::string text = detail::cat(
        kBackend, ": ", op, "(", how, comm::dtype_name(tensor.scalar_type()), " x ",
        tensor.numel(), ", ", bytes, " B) ", is_send ? "to " : "from ", peer_name(opts.peer),
        ", tag ", opts.tag, ", in group ", name);
    auto work = new_work(0, text, timeout_s);
    const int peer = opts.peer;
    const int tag = opts.tag;
    const Millis timeout = to_millis(timeout_s);

    if (shm && (is_send ? shm->can_send(peer) : shm->can_recv(peer))) {
      // Same host: the transport copies through shared memory on whichever thread waits (see
      // shm.hpp); its errors poison the communicator as the TCP path's do. Posted in issue
      // order after the collectives issued before it (a send of a tensor that an earlier
      // all_reduce writes sends the reduced values): inline when the worker is idle.
      worker.run_or_post([this, work, tensor, peer, tag, is_send, reduce, timeout, timeout_s, text] {
        if (auto error = broken_error()) return complete(*work, error);
        shm::Op o;
        o.tensor = tensor;
        o.tag = tag;
        o.reduce = reduce;
        o.deadline = std::chrono::steady_clock::now() + timeout;
        o.timeout_s = timeout_s;
        o.text = text;
        o.done = [this, work](std::exception_ptr error) {
          if (error) {
            auto first = broken_error();
            error = first ? first : fail(error);
          }
          complete(*work, error);
        };
        shm->post(is_send, peer, std::move(o));
      });
      return std::make_shared<ShmWork>(work, shm, text);
    }

    const uint64_t slot = point_to_point_slot(opts.tag, tensor.scalar_type(), bytes);
    // Over TCP a reducing recv lands in a staging tensor, combined on completion.
    const at::Tensor target = !reduce ? tensor : at::empty_like(tensor);
    // Posted by the worker so that it follows the collectives issued before it; waited for on
    // the reaper so that the worker can post the matching half of an exchange meanwhile.
    worker.post([this, work, tensor, target, slot, peer, is_send, reduce, timeout, text] {
      if (auto error = broken_error()) return complete(*work, error);
      std::shared_ptr<gloo::transport::UnboundBuffer> buf;
      try {
        buf = context->createUnboundBuffer(target.data_ptr(), target.nbytes());
        if (is_send)
          buf->send(peer, slot);
        else
          buf->recv(peer, slot);
      } catch (const std::exception& e) {
        return complete(*work, fail(std::make_exception_ptr(Error(text + " failed: " + what_of(e)))));
      }
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      reaper.post([this, work, tensor, target, buf, is_send, reduce, deadline, text] {
        std::exception_ptr error;
        {
          std::lock_guard<std::mutex> g(state_mu);
          reaping = buf.get();
          reaping_send = is_send;
          if (broken) error = poison;
        }
        if (!error) {
          try {
            const auto left = std::max(Millis(1), std::chrono::duration_cast<Millis>(
                                                      deadline - std::chrono::steady_clock::now()));
            const bool done = is_send ? buf->waitSend(left) : buf->waitRecv(left);
            if (!done) error = broken_error();  // aborted by fail()
          } catch (const std::exception& e) {
            error = broken_error();
            if (!error) error = fail(std::make_exception_ptr(Error(text + " failed: " + what_of(e))));
          }
        }
        {
          std::lock_guard<std::mutex> g(state_mu);
          reaping = nullptr;
        }
        if (!error && reduce)
          comm::reduce_bytes(tensor.data_ptr(), target.data_ptr(),
                             static_cast<int64_t>(tensor.nbytes()), tensor.scalar_type(), *reduce);
        complete(*work, error);
      });
    });
    return work;
  }
};

GlooCommunicator::GlooCommunicator(std::shared_ptr<c10d::Store> store,
                                   std::shared_ptr<gloo::transport::Device> device,
                                   GlooSettings settings, std::string id, std::string name,
                                   std::vector<int> global_ranks, int rank)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.store = std::move(store);
  m.device = std::move(device);
  m.settings = settings;
  m.id = std::move(id);
  m.name = std::move(name);
  m.prefix = "g" + (m.id.empty() ? std::string("0") : m.id) + "/";
  m.global_ranks = std::move(global_ranks);
  m.rank = rank;
  m.size = static_cast<int>(m.global_ranks.size());
  const std::string where = detail::cat(kBackend, ": group ", m.name);

  // A sub-group's members must have passed the same list; compared after the rendezvous, when
  // every member's list is in the store.
  const std::string members_key = m.prefix + "members/";
  if (!m.id.empty())
    m.store->set(members_key + std::to_string(m.global_ranks[rank]),
                 [&] {
                   const std::string s = join(m.global_ranks);
                   return std::vector<uint8_t>(s.begin(), s.end());
                 }());
  // Before the rendezvous, so that every member's entry is there once it has passed.
  if (m.size > 1) shm::Transport::publish(*m.store, m.prefix, m.rank, m.settings.shm);
  auto peers = comm::rendezvous(*m.store, m.prefix + "rendezvous/", m.rank, m.size,
                                m.settings.rendezvous_timeout_s, where);
  if (!m.id.empty()) {
    const std::string mine = join(m.global_ranks);
    for (int g : m.global_ranks) {
      const auto v = m.store->get(members_key + std::to_string(g));
      const std::string theirs(v.begin(), v.end());
      TR_CHECK(theirs == mine, where, ": global rank ", m.global_ranks[rank],
               " called new_group with global ranks [", mine, "] but rank ", g,
               " called it with [", theirs,
               "] (every rank of the parent group must pass the same list)");
    }
  }

  try {
    m.context = std::make_shared<gloo::rendezvous::Context>(m.rank, m.size);
    // Fixed for the life of the mesh: Gloo's pairs take it when connecting, and its bcube
    // all-reduce waits with it.
    m.context->setTimeout(to_millis(m.settings.timeout_s));
    GlooStore gloo_store(m.store, m.prefix + "gloo/", to_millis(m.settings.rendezvous_timeout_s));
    m.context->connectFullMesh(gloo_store, m.device);
  } catch (const std::exception& e) {
    TR_FAIL(where, ": rank ", m.global_ranks[rank], " could not connect Gloo's TCP mesh of ",
            m.size, " ranks (", m.device->str(), "): ", what_of(e));
  }

  if (m.size > 1 && m.settings.shm) {
    shm::Transport::Config sc;
    sc.backend = kBackend;
    sc.group = m.name;
    sc.prefix = m.prefix;
    sc.rank = m.rank;
    sc.global_ranks = m.global_ranks;
    sc.peer_name = [&m](int r) { return m.peer_name(r); };
    m.shm = std::make_shared<shm::Transport>(m.store, std::move(sc));
    // Each rank knows only its own channels; a group runs its collectives over shared memory
    // only when every member reaches every other, so all of them pick the same algorithm.
    const std::string key = m.prefix + "shm_collectives/";
    const bool mine = m.shm->peers() == m.size - 1;
    m.store->set(key + std::to_string(m.rank), std::vector<uint8_t>{mine ? uint8_t{1} : uint8_t{0}});
    bool all = true;
    for (int r = 0; r < m.size; ++r) all = all && m.store->get(key + std::to_string(r)) == std::vector<uint8_t>{1};
    m.shm_collectives = all;
    if (!all && m.settings.allreduce_algorithm == GlooSettings::Algorithm::Auto)
      m.plan_hierarchy(where);
  }

  comm::Monitor::Config mc;
  mc.backend = kBackend;
  mc.group = m.name;
  mc.prefix = m.prefix;
  mc.rank = m.rank;
  mc.world_size = m.size;
  mc.global_ranks = m.global_ranks;
  mc.stall_warning_s = m.settings.stall_warning_s;
  mc.check_order = m.settings.check_collectives;
  m.monitor = std::make_shared<comm::Monitor>(m.store, mc, std::move(peers));
  m.monitor->timeout_s = m.settings.timeout_s;
}

GlooCommunicator::~GlooCommunicator() {
  auto& m = *impl_;
  // Before the connections close: the peers' failing operations read this rank's progress.
  if (m.monitor && m.size > 1) m.monitor->publish_now();
  // Nobody will wait for what is still queued or running: fail it now rather than block here
  // until it times out, and let the peers' matching operations fail too.
  if (m.in_flight > 0) {
    {
      std::lock_guard<std::mutex> g(m.state_mu);
      if (!m.poison)
        m.poison = std::make_exception_ptr(Error(detail::cat(
            kBackend, ": group ", m.name, ": the communicator was destroyed while operations "
            "were still queued or running")));
    }
    m.fail(nullptr);
  }
  m.worker.stop();
  if (m.shm) m.shm->stop();  // after the worker, which may still post to it
  m.reaper.stop();
}

int GlooCommunicator::rank() const { return impl_->rank; }
int GlooCommunicator::world_size() const { return impl_->size; }
const std::string& GlooCommunicator::group_name() const { return impl_->name; }
int GlooCommunicator::shm_peers() const { return impl_->shm ? impl_->shm->peers() : 0; }
bool GlooCommunicator::shm_collectives() const { return impl_->shm_collectives; }
int GlooCommunicator::hierarchy_machines() const {
  auto& m = *impl_;
  return m.column ? m.size / static_cast<int>(m.node_ring.size()) : 0;
}
int GlooCommunicator::shm_single_copy_peers() const {
  return impl_->shm ? impl_->shm->single_copy_peers() : 0;
}

std::shared_ptr<Work> GlooCommunicator::all_reduce(at::Tensor& tensor,
                                                   const AllReduceOptions& opts) {
  auto& m = *impl_;
  comm::check_tensor(tensor, kBackend, "all_reduce", "the");
  comm::OpDesc desc{"all_reduce", comm::reduce_op_name(opts.op), tensor.scalar_type(),
                    tensor.numel(), static_cast<int64_t>(tensor.nbytes())};
  using Algorithm = GlooSettings::Algorithm;
  const auto algorithm = m.settings.allreduce_algorithm == Algorithm::Bcube
                             ? gloo::AllreduceOptions::Algorithm::BCUBE
                             : gloo::AllreduceOptions::Algorithm::RING;
  const bool over_shm = m.shm_collectives && m.settings.allreduce_algorithm == Algorithm::Auto;
  const bool two_levels = m.column && m.settings.allreduce_algorithm == Algorithm::Auto;
  return m.enqueue(desc, m.resolve_timeout(opts.timeout_s),
                   [&m, tensor, op = opts.op, algorithm, over_shm, two_levels,
                    text = desc.text()](uint32_t tag, Millis timeout) mutable {
                     if (tensor.numel() == 0) return;
                     if (over_shm) {
                       shm::all_reduce(m.shm_context(tag, timeout, text), tensor, op);
                     } else if (two_levels) {
                       // Reduce-scatter within the machine over shared memory, all-reduce of
                       // this rank's segment with its column over TCP, all-gather within the
                       // machine: each byte crosses TCP once per machine, not once per rank.
                       shm::all_reduce(m.shm_context(tag, timeout, text, true), tensor, op,
                                       [&](at::Tensor& segment) {
                                         gloo_all_reduce(m.column, segment, op,
                                                         gloo::AllreduceOptions::Algorithm::RING,
                                                         tag, timeout);
                                       });
                     } else {
                       gloo_all_reduce(m.context, tensor, op, algorithm, tag, timeout);
                     }
                     if (op == ReduceOp::Avg) divide_in_place(tensor, m.size);
                   },
                   over_shm && static_cast<int64_t>(tensor.nbytes()) <= kInlineBytes,
                   over_shm && tensor.numel() > 0);
}

std::shared_ptr<Work> GlooCommunicator::reduce_scatter(const at::Tensor& input,
                                                       at::Tensor& output,
                                                       const ReduceScatterOptions& opts) {
  auto& m = *impl_;
  comm::check_reduce_scatter(input, output, m.size, kBackend);
  comm::OpDesc desc{"reduce_scatter", comm::reduce_op_name(opts.op), input.scalar_type(),
                    input.numel(), static_cast<int64_t>(input.nbytes())};
  return m.enqueue(desc, m.resolve_timeout(opts.timeout_s),
                   [&m, input, output, op = opts.op,
                    text = desc.text()](uint32_t tag, Millis timeout) mutable {
                     if (output.numel() == 0) return;
                     // In place (output = this rank's chunk of the input, as NCCL allows) is
                     // safe for both rings: that chunk is read last, in the step that writes the
                     // output. Any other overlap would overwrite input the ring still has to read.
                     const auto* in = static_cast<const char*>(input.data_ptr());
                     const auto* out = static_cast<const char*>(output.data_ptr());
                     const bool overlap = out < in + input.nbytes() && in < out + output.nbytes();
                     const bool in_place = out == in + m.rank * output.nbytes();
                     const at::Tensor source = overlap && !in_place ? input.clone() : input;
                     if (m.shm_collectives) {
                       shm::reduce_scatter(m.shm_context(tag, timeout, text), source, output, op);
                       if (op == ReduceOp::Avg) divide_in_place(output, m.size);
                       return;
                     }
                     dispatch(input.scalar_type(), [&](auto t) {
                       using T = typename decltype(t)::type;
                       gloo_ring::reduce_scatter<T>(m.context, source.data_ptr<T>(),
                                              output.data_ptr<T>(),
                                              static_cast<size_t>(output.numel()),
                                              comm::reduce_function<T>(op),
                                              gloo::Slot::build(kReduceScatterSlotPrefix, tag),
                                              timeout, m.reduce_scatter_scratch);
                     });
                     if (op == ReduceOp::Avg) divide_in_place(output, m.size);
                   },
                   m.shm_collectives && static_cast<int64_t>(input.nbytes()) <= kInlineBytes,
                   m.shm_collectives && output.numel() > 0);
}

std::shared_ptr<Work> GlooCommunicator::all_gather(const at::Tensor& input, at::Tensor& output,
                                                   const AllGatherOptions& opts) {
  auto& m = *impl_;
  comm::check_all_gather(input, output, m.size, kBackend);
  comm::OpDesc desc{"all_gather", "", input.scalar_type(), input.numel(),
                    static_cast<int64_t>(input.nbytes())};
  return m.enqueue(desc, m.resolve_timeout(opts.timeout_s),
                   [&m, input, output, text = desc.text()](uint32_t tag, Millis timeout) mutable {
                     if (input.numel() == 0) return;
                     if (m.shm_collectives) {
                       shm::all_gather(m.shm_context(tag, timeout, text), input, output);
                       return;
                     }
                     // Plain bytes: a gather does no arithmetic.
                     gloo::AllgatherOptions o(m.context);
                     o.setInput<uint8_t>(static_cast<uint8_t*>(input.data_ptr()), input.nbytes());
                     o.setOutput<uint8_t>(static_cast<uint8_t*>(output.data_ptr()),
                                          output.nbytes());
                     o.setTag(tag);
                     o.setTimeout(timeout);
                     gloo::allgather(o);
                   },
                   m.shm_collectives && static_cast<int64_t>(output.nbytes()) <= kInlineBytes,
                   m.shm_collectives && input.numel() > 0);
}

std::shared_ptr<Work> GlooCommunicator::broadcast(at::Tensor& tensor,
                                                  const BroadcastOptions& opts) {
  auto& m = *impl_;
  comm::check_tensor(tensor, kBackend, "broadcast", "the");
  TR_CHECK(opts.root >= 0 && opts.root < m.size, kBackend, ": broadcast in group ", m.name,
           ": root ", opts.root, " is not a rank of this group (world_size ", m.size, ")");
  comm::OpDesc desc{"broadcast", "root " + std::to_string(opts.root), tensor.scalar_type(),
                    tensor.numel(), static_cast<int64_t>(tensor.nbytes())};
  return m.enqueue(desc, m.resolve_timeout(opts.timeout_s),
                   [&m, tensor, root = opts.root](uint32_t tag, Millis timeout) {
                     if (tensor.numel() == 0) return;
                     gloo::BroadcastOptions o(m.context);
                     o.setOutput<uint8_t>(static_cast<uint8_t*>(tensor.data_ptr()),
                                          tensor.nbytes());
                     o.setRoot(root);
                     o.setTag(tag);
                     o.setTimeout(timeout);
                     gloo::broadcast(o);
                   });
}

std::shared_ptr<Work> GlooCommunicator::barrier(const BarrierOptions& opts) {
  auto& m = *impl_;
  comm::OpDesc desc{"barrier", "", c10::ScalarType::Undefined, 0, 0};
  return m.enqueue(desc, m.resolve_timeout(opts.timeout_s), [&m](uint32_t tag, Millis timeout) {
    gloo::BarrierOptions o(m.context);
    o.setTag(tag);
    o.setTimeout(timeout);
    gloo::barrier(o);
  });
}

std::shared_ptr<Work> GlooCommunicator::send(const at::Tensor& tensor,
                                             const PointToPointOptions& opts) {
  return impl_->point_to_point(true, tensor, opts);
}

std::shared_ptr<Work> GlooCommunicator::recv(at::Tensor& tensor,
                                             const PointToPointOptions& opts) {
  return impl_->point_to_point(false, tensor, opts);
}

std::shared_ptr<Work> GlooCommunicator::recv_reduce(at::Tensor& tensor, ReduceOp op,
                                                    const PointToPointOptions& opts) {
  TR_CHECK(op != ReduceOp::Avg, kBackend, ": recv_reduce in group ", impl_->name,
           ": Avg is not a pairwise reduction (sum, then divide by the number of ranks)");
  return impl_->point_to_point(false, tensor, opts, op);
}

std::shared_ptr<Communicator> GlooCommunicator::new_group(const std::vector<int>& ranks) {
  auto& m = *impl_;
  TR_CHECK(!ranks.empty(), kBackend, ": new_group in group ", m.name, ": the rank list is empty");
  std::vector<int> seen(m.size, 0);
  for (int r : ranks) {
    TR_CHECK(r >= 0 && r < m.size, kBackend, ": new_group in group ", m.name, ": rank ", r,
             " is not a rank of this group (world_size ", m.size, ")");
    TR_CHECK(!seen[r]++, kBackend, ": new_group in group ", m.name, ": rank ", r,
             " is listed twice in [", join(ranks), "]");
  }
  m.throw_if_poisoned();
  int number;
  {
    // Counted on every rank of this group, member or not, so that the n-th new_group call
    // gets the same id (and store prefix) everywhere.
    std::lock_guard<std::mutex> g(m.issue_mu);
    number = ++m.groups_created;
  }
  const auto it = std::find(ranks.begin(), ranks.end(), m.rank);
  if (it == ranks.end()) return nullptr;
  const std::string id = (m.id.empty() ? "" : m.id + ".") + std::to_string(number);
  std::vector<int> global;
  for (int r : ranks) global.push_back(m.global_ranks[r]);
  const std::string name = id + " [" + join(global) + "]";
  return std::make_shared<GlooCommunicator>(m.store, m.device, m.settings, id, name,
                                            std::move(global),
                                            static_cast<int>(it - ranks.begin()));
}

// ---------------------------------------------------------------------------------------------
// The world

namespace {

// Peers on one machine reach each other over loopback; Gloo would otherwise bind to the
// address of the host name, which on Debian resolves to 127.0.1.1 or to an external interface.
bool is_loopback(const std::string& host) {
  if (host == "localhost") return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return false;
  bool all = true;
  for (addrinfo* a = res; a; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      all = all && (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      all = all && IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
    } else {
      all = false;
    }
  }
  freeaddrinfo(res);
  return all;
}

}  // namespace

GlooWorld open_gloo_world(const GlooSettings& s, const RunContext& ctx) {
  TR_CHECK_TYPED(ConfigError, ctx.world_size >= 1 && ctx.rank >= 0 && ctx.rank < ctx.world_size,
                 kBackend, ": rank ", ctx.rank, " is not in [0, world_size ", ctx.world_size, ")");

  const auto address = comm::store_address_from_environment();
  std::shared_ptr<c10d::Store> store;
  gloo::transport::tcp::attr attr;
  if (!address) {
    TR_CHECK_TYPED(ConfigError, ctx.world_size == 1, kBackend, ": world_size ", ctx.world_size,
                   " needs MASTER_ADDR and MASTER_PORT (the rendezvous store); start the ranks "
                   "with the trainrun launcher or torchrun");
    store = std::make_shared<c10d::HashStore>();
    attr.hostname = "127.0.0.1";
  } else {
    store = comm::open_store(*address, ctx.rank, ctx.world_size, s.rendezvous_timeout_s);
    const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
    if (is_loopback(address->host))
      attr.hostname = "127.0.0.1";
    else if (ifname && *ifname)
      attr.iface = ifname;
    else
      attr.hostname = comm::host_name();
  }
  GlooWorld w;
  w.transport = "tcp " + (attr.iface.empty() ? attr.hostname : attr.iface);
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    TR_FAIL(kBackend, ": cannot open a TCP device on ",
            attr.iface.empty() ? "host " + attr.hostname
                               : "interface '" + attr.iface + "' (GLOO_SOCKET_IFNAME)",
            ": ", what_of(e));
  }
  std::vector<int> world(ctx.world_size);
  for (int r = 0; r < ctx.world_size; ++r) world[r] = r;
  w.communicator = std::make_unique<GlooCommunicator>(std::move(store), std::move(device), s, "",
                                                      "world", std::move(world), ctx.rank);
  return w;
}

}  // namespace trainrun::plugins
