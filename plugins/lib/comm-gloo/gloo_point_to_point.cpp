// GlooCommunicator's send, recv and recv_reduce: through the shared-memory transport to a peer
// on this machine (shm.hpp), over Gloo's TCP pairs to the others. Both are posted by the worker,
// after the collectives issued before them, and complete without it.
#include <trainrun/error.hpp>
#include <trainrun/error_text.hpp>

#include <ATen/ATen.h>

#include <gloo/rendezvous/context.h>
#include <gloo/transport/unbound_buffer.h>

#include "gloo_communicator_impl.hpp"
#include "reduce.hpp"

namespace trainrun::plugins {

using namespace trainrun::v1;

namespace {

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
      const auto deadline = timeout_s > 0 ? comm::deadline_after(timeout_s)
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

uint64_t point_to_point_slot(int tag, c10::ScalarType dtype, int64_t bytes) {
  uint64_t h = static_cast<uint64_t>(bytes) * 0x9E3779B97F4A7C15ull ^
               (static_cast<uint64_t>(dtype) + 1) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 29;
  return (kPointToPointSlotPrefix << 56) |
         (static_cast<uint64_t>(static_cast<uint32_t>(tag)) << 24) | (h & 0xFFFFFF);
}

}  // namespace

std::shared_ptr<Work> GlooCommunicator::Impl::point_to_point(bool is_send, const at::Tensor& tensor,
                                                             const PointToPointOptions& opts,
                                                             std::optional<ReduceOp> reduce) {
  const char* op = is_send ? "send" : !reduce ? "recv" : "recv_reduce";
  comm::check_tensor(tensor, kBackend, op, "the");
  TR_CHECK(opts.peer >= 0 && opts.peer < size, kBackend, ": ", op, " in group ", name,
           ": peer rank ", opts.peer, " is not a rank of this group (world_size ", size, ")");
  TR_CHECK(opts.peer != rank, kBackend, ": ", op, " in group ", name, ": peer rank ", opts.peer,
           " is this rank itself");
  throw_if_poisoned();
  Message m;
  m.tensor = tensor;
  m.peer = opts.peer;
  m.tag = opts.tag;
  m.is_send = is_send;
  m.reduce = reduce;
  m.timeout_s = resolve_timeout(opts.timeout_s);
  const int64_t bytes = tensor.numel() * static_cast<int64_t>(tensor.element_size());
  const char* how = !reduce                   ? ""
                    : reduce == ReduceOp::Min ? "min, "
                    : reduce == ReduceOp::Max ? "max, "
                                              : "sum, ";
  m.text = detail::cat(kBackend, ": ", op, "(", how, comm::dtype_name(tensor.scalar_type()), " x ",
                       tensor.numel(), ", ", bytes, " B) ", is_send ? "to " : "from ",
                       peer_name(opts.peer), ", tag ", opts.tag, ", in group ", name);
  m.work = new_work(0, m.text, m.timeout_s);
  auto work = m.work;
  if (shm && (is_send ? shm->can_send(m.peer) : shm->can_recv(m.peer))) {
    auto waited = std::make_shared<ShmWork>(work, shm, m.text);
    post_over_shm(std::move(m));
    return waited;
  }
  post_over_tcp(std::move(m), point_to_point_slot(opts.tag, tensor.scalar_type(), bytes));
  return work;
}

// Same host: the transport copies through shared memory on whichever thread waits (see shm.hpp);
// its errors poison the communicator as the TCP path's do. Posted in issue order after the
// collectives issued before it (a send of a tensor that an earlier all_reduce writes sends the
// reduced values): inline when the worker is idle.
void GlooCommunicator::Impl::post_over_shm(Message m) {
  worker.run_or_post([this, m = std::move(m)] {
    if (auto error = broken_error()) return complete(*m.work, error);
    shm::Op o;
    o.tensor = m.tensor;
    o.tag = m.tag;
    o.reduce = m.reduce;
    o.deadline = std::chrono::steady_clock::now() + to_millis(m.timeout_s);
    o.timeout_s = m.timeout_s;
    o.text = m.text;
    o.done = [this, work = m.work](std::exception_ptr error) {
      if (error) {
        auto first = broken_error();
        error = first ? first : fail(error);
      }
      complete(*work, error);
    };
    shm->post(m.is_send, m.peer, std::move(o));
  });
}

// Posted by the worker so that it follows the collectives issued before it; waited for on the
// reaper so that the worker can post the matching half of an exchange meanwhile.
void GlooCommunicator::Impl::post_over_tcp(Message m, uint64_t slot) {
  // Over TCP a reducing recv lands in a staging tensor, combined on completion.
  const at::Tensor target = !m.reduce ? m.tensor : at::empty_like(m.tensor);
  worker.post([this, m = std::move(m), target, slot] {
    if (auto error = broken_error()) return complete(*m.work, error);
    std::shared_ptr<gloo::transport::UnboundBuffer> buf;
    try {
      buf = context->createUnboundBuffer(target.data_ptr(), target.nbytes());
      if (m.is_send)
        buf->send(m.peer, slot);
      else
        buf->recv(m.peer, slot);
    } catch (const std::exception& e) {
      return complete(*m.work,
                      fail(std::make_exception_ptr(Error(m.text + " failed: " + what_of(e)))));
    }
    const auto deadline = std::chrono::steady_clock::now() + to_millis(m.timeout_s);
    reaper.post([this, m, target, buf, deadline] { reap(m, target, *buf, deadline); });
  });
}

// On the reaper: waits for the posted buffer until `deadline` (or an abort by fail()), then
// combines a recv_reduce's staged message into the caller's tensor.
void GlooCommunicator::Impl::reap(const Message& m, const at::Tensor& target,
                                  gloo::transport::UnboundBuffer& buf,
                                  std::chrono::steady_clock::time_point deadline) {
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> g(state_mu);
    reaping = &buf;
    reaping_send = m.is_send;
    if (broken) error = poison;
  }
  if (!error) {
    try {
      const auto left =
          std::max(Millis(1),
                   std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now()));
      const bool done = m.is_send ? buf.waitSend(left) : buf.waitRecv(left);
      if (!done) error = broken_error();  // aborted by fail()
    } catch (const std::exception& e) {
      error = broken_error();
      if (!error) error = fail(std::make_exception_ptr(Error(m.text + " failed: " + what_of(e))));
    }
  }
  {
    std::lock_guard<std::mutex> g(state_mu);
    reaping = nullptr;
  }
  if (!error && m.reduce)
    comm::reduce_bytes(m.tensor.data_ptr(), target.data_ptr(),
                       static_cast<int64_t>(m.tensor.nbytes()), m.tensor.scalar_type(), *m.reduce);
  complete(*m.work, error);
}

std::shared_ptr<Work> GlooCommunicator::send(const at::Tensor& tensor,
                                             const PointToPointOptions& opts) {
  return impl_->point_to_point(true, tensor, opts);
}

std::shared_ptr<Work> GlooCommunicator::recv(at::Tensor& tensor, const PointToPointOptions& opts) {
  return impl_->point_to_point(false, tensor, opts);
}

std::shared_ptr<Work> GlooCommunicator::recv_reduce(at::Tensor& tensor, ReduceOp op,
                                                    const PointToPointOptions& opts) {
  TR_CHECK(op != ReduceOp::Avg, kBackend, ": recv_reduce in group ", impl_->name,
           ": Avg is not a pairwise reduction (sum, then divide by the number of ranks)");
  return impl_->point_to_point(false, tensor, opts, op);
}

}  // namespace trainrun::plugins
