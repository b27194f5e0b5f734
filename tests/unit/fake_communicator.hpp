#pragma once
// The one fake communicator (and accelerator) of the unit tests: collectives answered in one
// process, so a strategy or a precision component runs its multi-rank code paths without peers.
//
// FakeCommunicator(size, rank) is a world of `size` identical replicas seen from rank `rank`:
// every other rank contributes exactly what this one does, so
//   all_reduce      Sum multiplies the tensor by size; Avg, Min and Max leave it;
//   reduce_scatter  output = this rank's chunk of the input (times size for Sum);
//   all_gather      output = the input repeated size times;
//   broadcast       keeps the tensor (every rank already holds the root's);
//   barrier         returns at once.
// send, recv and new_group keep the interface's NotSupportedError.
// Set `peer` to make the other ranks differ: all_reduce then combines this rank's tensor with
// peer(tensor), the tensor each of the other size-1 ranks holds (Sum adds them, Avg averages,
// Min/Max take the elementwise extreme), e.g. to test that one rank's overflow is agreed.
// Every call is appended to `log` ("all_reduce <op> <dtype> <numel>", "reduce_scatter <op>",
// "all_gather", "broadcast", "barrier"); count(op) counts the calls of one operation.
#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <trainrun/error.hpp>
#include <trainrun/interfaces.hpp>

namespace trainrun::test {

class FakeCommunicator final : public v1::Communicator {
 public:
  explicit FakeCommunicator(int size = 1, int rank = 0) : size_(size), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  std::string backend() const override { return "fake"; }

  std::shared_ptr<v1::Work> all_reduce(at::Tensor& t, const v1::AllReduceOptions& o) override {
    log.push_back(v1::detail::cat("all_reduce ", op_name(o.op), " ", c10::toString(t.scalar_type()),
                                  " ", t.numel()));
    if (peer) {
      const at::Tensor other = peer(t);
      switch (o.op) {
        case v1::ReduceOp::Min: t.copy_(at::minimum(t, other)); break;
        case v1::ReduceOp::Max: t.copy_(at::maximum(t, other)); break;
        case v1::ReduceOp::Sum: t.add_(other * (size_ - 1)); break;
        case v1::ReduceOp::Avg: t.add_(other * (size_ - 1)).div_(size_); break;
      }
    } else if (o.op == v1::ReduceOp::Sum && size_ != 1) {  // a world of one: a no-op on any dtype
      t.mul_(size_);
    }
    return done();
  }
  std::shared_ptr<v1::Work> reduce_scatter(const at::Tensor& in, at::Tensor& out,
                                           const v1::ReduceScatterOptions& o) override {
    log.push_back(v1::detail::cat("reduce_scatter ", op_name(o.op)));
    out.copy_(in.reshape({size_, -1}).select(0, rank_).reshape(out.sizes()));
    if (o.op == v1::ReduceOp::Sum && size_ != 1) out.mul_(size_);
    return done();
  }
  std::shared_ptr<v1::Work> all_gather(const at::Tensor& in, at::Tensor& out,
                                       const v1::AllGatherOptions&) override {
    log.push_back("all_gather");
    out.copy_(in.reshape({-1}).repeat({size_}).reshape(out.sizes()));
    return done();
  }
  std::shared_ptr<v1::Work> broadcast(at::Tensor&, const v1::BroadcastOptions&) override {
    log.push_back("broadcast");
    return done();
  }
  std::shared_ptr<v1::Work> barrier(const v1::BarrierOptions&) override {
    log.push_back("barrier");
    return done();
  }

  /// Calls of one operation ("all_reduce", "reduce_scatter", ...) since `log` was last cleared.
  size_t count(const std::string& op) const {
    size_t n = 0;
    for (const auto& l : log)
      n += l.compare(0, op.size(), op) == 0 && (l.size() == op.size() || l[op.size()] == ' ');
    return n;
  }

  std::vector<std::string> log;
  std::function<at::Tensor(const at::Tensor& mine)> peer;

 private:
  static const char* op_name(v1::ReduceOp op) {
    switch (op) {
      case v1::ReduceOp::Sum: return "sum";
      case v1::ReduceOp::Avg: return "avg";
      case v1::ReduceOp::Min: return "min";
      case v1::ReduceOp::Max: return "max";
    }
    return "?";
  }
  static std::shared_ptr<v1::Work> done() { return std::make_shared<v1::CompletedWork>(); }

  int size_;
  int rank_;
};

/// A CPU device whose communicator is a FakeCommunicator (public, for the test to inspect).
class FakeAccelerator final : public v1::Accelerator {
 public:
  explicit FakeAccelerator(int size = 1, int rank = 0) : comm(size, rank) {}
  c10::Device device() const override { return c10::kCPU; }
  v1::Communicator& communicator() override { return comm; }
  std::string describe() const override { return "fake"; }
  FakeCommunicator comm;
};

}  // namespace trainrun::test
