// The mpi plugin's operations in flight: a collective issued to the Monitor and posted to MPI,
// its completion seen once (by whichever call first tests it), waiting with a timeout that names
// the ranks not arrived, and what a group leaves to MPI when it goes before its operations.
#include <trainrun/error.hpp>

#include <algorithm>
#include <cstring>

#include "mpi_detail.hpp"

namespace trainrun::plugins::mpi_detail {

using namespace trainrun::v1;

void on_completion(Group& g, Op& op, int rc, const MPI_Status& status) {
  op.done = true;
  if (op.posted) --g.rt->pending_ops, op.posted = false;
  if (rc != MPI_SUCCESS) {
    // A receive into a tensor smaller than the message leaves nothing pending on either side;
    // any other error may leave a peer waiting, and MPI_Finalize would then wait for it.
    int error_class = rc;
    MPI_Error_class(rc, &error_class);
    if (error_class != MPI_ERR_TRUNCATE) g.rt->fail();
    op.error = std::make_exception_ptr(Error(
        detail::cat(kBackend, ": ", op.text, op.seq ? detail::cat(" #", op.seq) : std::string(),
                    " in group ", g.name, ": ", op.call, " failed: ", error_string(rc))));
  } else if (op.on_success) {
    try {
      op.on_success(status);
    } catch (...) {
      op.error = std::current_exception();
    }
  }
  op.on_success = nullptr;
  op.keep_alive.clear();
  auto it = std::find_if(g.in_flight.begin(), g.in_flight.end(),
                         [&](const std::shared_ptr<Op>& p) { return p.get() == &op; });
  if (it != g.in_flight.end()) g.in_flight.erase(it);
  // The Monitor's progress is "last completed #N": operations can complete out of order (a
  // strategy may wait on a later bucket first), so they are reported in issue order.
  while (!g.unreported.empty() && g.unreported.front()->done) {
    g.monitor->finished(g.unreported.front()->seq);
    g.unreported.pop_front();
  }
}

bool test(Group& g, Op& op) {
  if (op.done) return true;
  int flag = 0;
  MPI_Status status;
  std::memset(&status, 0, sizeof status);
  const int rc = MPI_Test(&op.request, &flag, &status);
  if (rc != MPI_SUCCESS || flag) {
    on_completion(g, op, rc, status);
    return true;
  }
  return false;
}

void progress(Group& g) {
  while (!g.in_flight.empty()) {
    auto oldest = g.in_flight.front();
    if (!test(g, *oldest)) return;
  }
}

void wait_op(Group& g, Op& op, double timeout_s) {
  const double limit = timeout_s > 0 ? timeout_s : op.timeout_s;
  const auto deadline = comm::deadline_after(limit);
  Backoff backoff;
  while (!test(g, op)) {
    if (Clock::now() >= deadline) {
      g.rt->fail();
      const std::string what = detail::cat("timed out after ", seconds_text(limit), " s");
      if (op.seq == 0) TR_FAIL(kBackend, ": ", op.text, " in group ", g.name, " ", what);
      std::string message;
      try {
        message = g.monitor->describe_failure(op.seq, what);
      } catch (const std::exception& e) {
        message = detail::cat(kBackend, ": ", op.text, " #", op.seq, " in group ", g.name, " ",
                              what, " (the peers' progress is unknown: ", e.what(), ")");
      }
      throw Error(message);
    }
    backoff.pause();
  }
  if (op.error) std::rethrow_exception(op.error);
}

Group::~Group() {
  // A Work dropped before completion leaves its operation here. Waiting for it could take until
  // its timeout (a teardown usually follows an error), so whatever is still running is left to
  // MPI: its tensors are kept forever, as MPI may still write them, and MPI is not finalised.
  if (!finalized()) {
    try {
      progress(*this);
    } catch (...) {
    }
  }
  if (!in_flight.empty()) {
    rt->fail("an operation was still in flight when its communicator was destroyed");
    static auto* abandoned = new std::vector<std::shared_ptr<Op>>();
    abandoned->insert(abandoned->end(), in_flight.begin(), in_flight.end());
    return;
  }
  monitor.reset();
  if (comm != MPI_COMM_NULL && !finalized()) MPI_Comm_free(&comm);
}

void track_posted(Group& g, const std::shared_ptr<Op>& op, int rc) {
  if (rc != MPI_SUCCESS) {
    MPI_Status status;
    std::memset(&status, 0, sizeof status);
    on_completion(g, *op, rc, status);
    std::rethrow_exception(op->error);
  }
  op->posted = true;
  ++g.rt->pending_ops;
  g.in_flight.push_back(op);
}

std::shared_ptr<Work> start_collective(const std::shared_ptr<Group>& g, const comm::OpDesc& desc,
                                       double timeout_s, bool empty, const char* call,
                                       const std::function<int(MPI_Request*)>& post,
                                       std::vector<at::Tensor> keep_alive,
                                       std::function<void(const MPI_Status&)> on_success) {
  progress(*g);
  uint64_t seq = 0;
  try {
    seq = g->monitor->issue(desc);
  } catch (const Error&) {
    // The peers may already be inside this collective, or a different one; they cannot finish.
    g->rt->fail();
    throw;
  } catch (const std::exception& e) {
    // The store's own errors ("Broken pipe") do not say which operation needed it.
    g->rt->fail();
    TR_FAIL(kBackend, ": ", desc.text(), " in group ", g->name,
            ": the cross-rank check through the store failed: ", e.what());
  }
  auto op = std::make_shared<Op>();
  op->seq = seq;
  op->text = desc.text();
  op->call = call;
  op->timeout_s = timeout_s > 0 ? timeout_s : g->options.timeout_s;
  op->on_success = std::move(on_success);
  g->unreported.push_back(op);
  if (empty) {
    MPI_Status status;
    std::memset(&status, 0, sizeof status);
    on_completion(*g, *op, MPI_SUCCESS, status);
  } else {
    op->keep_alive = std::move(keep_alive);
    track_posted(*g, op, post(&op->request));
  }
  return std::make_shared<MpiWork>(g, op);
}

}  // namespace trainrun::plugins::mpi_detail

namespace trainrun::plugins {

using namespace mpi_detail;

MpiWork::MpiWork(std::shared_ptr<Group> group, std::shared_ptr<Op> op)
    : group_(std::move(group)), op_(std::move(op)) {}

void MpiWork::wait(double timeout_s) { wait_op(*group_, *op_, timeout_s); }

bool MpiWork::completed() const { return test(*group_, *op_); }

}  // namespace trainrun::plugins
