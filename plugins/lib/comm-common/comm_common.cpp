// What comm_common.hpp declares apart from the rendezvous (rendezvous.cpp) and the Monitor
// (monitor.cpp): the operations' descriptions and preconditions, and FutureWork.
#include "comm_common.hpp"

#include <sstream>

#include "comm_internal.hpp"

namespace trainrun::comm {

using namespace trainrun::v1;
using namespace internal;

std::string seconds_text(double s) {
  std::ostringstream os;
  os.precision(s < 10 ? 2 : 3);
  os << s << " s";
  return os.str();
}

// ---------------------------------------------------------------------------------------------
// Operations

std::string reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

std::string OpDesc::text() const {
  std::ostringstream os;
  os << op << "(";
  bool first = true;
  if (!detail.empty()) os << detail, first = false;
  if (dtype != c10::ScalarType::Undefined) {
    os << (first ? "" : ", ") << dtype_name(dtype);
    if (numel >= 0) os << " x " << numel << ", " << bytes << " B";
  }
  os << ")";
  return os.str();
}

OpDesc OpDesc::of(std::string op, std::string detail, const at::Tensor& input) {
  return {std::move(op), std::move(detail), input.scalar_type(), input.numel(),
          static_cast<int64_t>(input.nbytes())};
}

OpDesc OpDesc::of_uneven(std::string op, const at::Tensor& input) {
  return {std::move(op), "", input.scalar_type(), -1, -1};
}

void check_tensor(const at::Tensor& t, const std::string& backend, const char* op,
                  const char* role) {
  TR_CHECK(t.defined(), backend, ": ", op, ": ", role, " tensor is undefined");
  TR_CHECK(t.device().is_cpu(), backend, ": ", op, ": ", role, " tensor is on ", t.device(),
           ", expected the accelerator's device cpu");
  TR_CHECK(t.layout() == at::kStrided, backend, ": ", op, ": ", role,
           " tensor must be dense (strided), got layout ", t.layout());
  TR_CHECK(t.is_contiguous(), backend, ": ", op, ": ", role, " tensor must be contiguous (shape ",
           t.sizes(), ", strides ", t.strides(), "); call .contiguous() first");
  TR_CHECK(supported_dtype(t.scalar_type()), backend, ": ", op, ": ", role, " tensor has dtype ",
           dtype_name(t.scalar_type()),
           "; supported: float32, float64, bfloat16, float16, int32, int64, uint8");
}

void check_chunked(const at::Tensor& input, const at::Tensor& output, int world_size,
                   const std::string& backend, const char* op, const at::Tensor& whole,
                   const at::Tensor& chunk, const char* rule,
                   const std::function<void(const at::Tensor&, const char*)>& check_one) {
  check_one(input, "input");
  check_one(output, "output");
  TR_CHECK(input.scalar_type() == output.scalar_type(), backend, ": ", op, ": input dtype ",
           dtype_name(input.scalar_type()), " differs from output dtype ",
           dtype_name(output.scalar_type()));
  TR_CHECK(whole.numel() == world_size * chunk.numel(), backend, ": ", op, ": ", rule,
           " elements (", world_size, " x ", chunk.numel(), " = ", world_size * chunk.numel(),
           "), got ", whole.numel());
}

void check_reduce_scatter(const at::Tensor& input, const at::Tensor& output, int world_size,
                          const std::string& backend) {
  check_chunked(input, output, world_size, backend, "reduce_scatter", input, output,
                "input must hold world_size * output.numel()",
                [&](const at::Tensor& t, const char* role) {
                  check_tensor(t, backend, "reduce_scatter", role);
                });
}

void check_all_gather(const at::Tensor& input, const at::Tensor& output, int world_size,
                      const std::string& backend) {
  check_chunked(
      input, output, world_size, backend, "all_gather", output, input,
      "output must hold world_size * input.numel()",
      [&](const at::Tensor& t, const char* role) { check_tensor(t, backend, "all_gather", role); });
}

// ---------------------------------------------------------------------------------------------
// Work

FutureWork::FutureWork(std::shared_ptr<Monitor> monitor, uint64_t seq, std::string op_text,
                       double timeout_s)
    : monitor_(std::move(monitor)), seq_(seq), op_text_(std::move(op_text)), timeout_s_(timeout_s) {}

void FutureWork::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> g(mu_);
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

void FutureWork::wait(double timeout_s) {
  const double t = timeout_s > 0 ? timeout_s : timeout_s_;
  std::unique_lock<std::mutex> lk(mu_);
  const bool ok = t > 0 ? cv_.wait_for(lk, millis(t), [this] { return done_; })
                        : (cv_.wait(lk, [this] { return done_; }), true);
  if (!ok) {
    lk.unlock();
    const std::string what = "timed out after " + seconds_text(t);
    if (monitor_ && seq_ > 0) TR_FAIL(monitor_->describe_failure(seq_, what));
    TR_FAIL(op_text_, " ", what);
  }
  if (error_) std::rethrow_exception(error_);
}

bool FutureWork::completed() const {
  std::lock_guard<std::mutex> g(mu_);
  return done_;
}

}  // namespace trainrun::comm