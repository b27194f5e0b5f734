// How GlooCommunicator issues an operation (sequence number, order check, the worker's queue)
// and how a failure poisons it: the first error is kept and rethrown by every later call, and
// the group's connections are closed so that the peers' operations fail at once too.
#include <trainrun/error.hpp>
#include <trainrun/error_text.hpp>

#include <gloo/rendezvous/context.h>
#include <gloo/transport/unbound_buffer.h>

#include "gloo_communicator_impl.hpp"

namespace trainrun::plugins {

using namespace trainrun::v1;

void GlooCommunicator::Impl::throw_if_poisoned() {
  std::exception_ptr p;
  {
    std::lock_guard<std::mutex> g(state_mu);
    p = poison;
  }
  if (p) std::rethrow_exception(p);
}

std::exception_ptr GlooCommunicator::Impl::broken_error() {
  std::lock_guard<std::mutex> g(state_mu);
  return broken ? poison : nullptr;
}

// Closes every connection of this group's mesh. Gloo has no call that both closes the pairs
// and wakes this process's own threads blocked on them (Context::closeConnections wakes
// nobody), but its TCP transport does exactly that when a wait on an unbound buffer times
// out: it signals every pair of the context, whose pending operations then throw, and closes
// their sockets, so the peers' operations fail with "connection closed" at once. A 1 ms wait
// on a buffer with nothing posted is that timeout.
void GlooCommunicator::Impl::abort_transport() {
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

std::exception_ptr GlooCommunicator::Impl::fail(std::exception_ptr error) {
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
void GlooCommunicator::Impl::check_order_after_failure(uint64_t seq, const comm::OpDesc& desc) {
  try {
    monitor->check_order(seq, desc);
  } catch (const std::exception&) {
  }
}

std::shared_ptr<Work> GlooCommunicator::Impl::enqueue(
    const comm::OpDesc& desc, double timeout_s,
    std::function<void(uint32_t tag, Millis timeout)> body, bool inline_if_idle,
    bool order_in_band) {
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
        error =
            fail(std::make_exception_ptr(Error(monitor->mismatch(seq, desc, e.peer, e.peer_text))));
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

}  // namespace trainrun::plugins
