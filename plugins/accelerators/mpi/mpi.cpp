#include "mpi.hpp"

#include <mpi.h>
#include <trainrun/plugin.hpp>

#include <ATen/Functions.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "backend_options.hpp"
#include "comm_common.hpp"
#include "cpu_threads.hpp"

namespace trainrun::plugins {

using namespace trainrun::v1;

namespace mpi_detail {

using Clock = std::chrono::steady_clock;

constexpr const char* kBackend = "mpi";

std::string raw_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return detail::cat("MPI error ", code);
  return std::string(buf, static_cast<size_t>(len));
}

// MPICH's string for an error code is a multi-line stack of its internal functions; users need
// the error class ("Message truncated") and the innermost, most specific line where it says
// more.
std::string error_string(int code) {
  int error_class = code;
  MPI_Error_class(code, &error_class);
  const std::string general = raw_error_string(error_class);
  std::string specific = raw_error_string(code);
  while (!specific.empty() && (specific.back() == '\n' || specific.back() == ' '))
    specific.pop_back();
  specific = specific.substr(specific.rfind('\n') + 1);
  if (auto p = specific.find("): "); p != std::string::npos) specific.erase(0, p + 3);
  if (specific.empty() || specific == general || general.find(specific) != std::string::npos)
    return general;
  return general + " (" + specific + ")";
}

// "600", "2.5": how users wrote the timeout.
std::string seconds_text(double s) { return detail::cat(s); }

// "MPICH 4.0.2" from "MPICH Version:\t4.0.2\nMPICH Release date: ..."; other libraries keep
// their first line up to the first comma ("Open MPI v4.1.4").
std::string library_version() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  if (MPI_Get_library_version(buf, &len) != MPI_SUCCESS) return "unknown MPI";
  std::string line(buf, static_cast<size_t>(len));
  line = line.substr(0, std::min(line.find('\n'), line.find(',')));
  if (auto v = line.find("Version:"); v != std::string::npos) line.erase(v, 8);
  std::string out;
  for (char c : line) {
    const bool space = c == ' ' || c == '\t' || c == '\r';
    if (space && (out.empty() || out.back() == ' ')) continue;
    out += space ? ' ' : c;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out.empty() ? "unknown MPI" : out;
}

// --- float16 / bfloat16 reductions -----------------------------------------------------------
// MPI has no 16-bit floating-point type, so these travel as MPI_UINT16_T and are reduced by
// user-defined ops that widen each pair to float, combine, and round back, as a float16 add
// does. ATen's elementwise kernels do exactly that, faster than a plain loop (summing 2M
// elements, one thread: bfloat16 0.7-0.8 ms vs 0.9 ms, float16 5 ms vs 8-12 ms), and min/max
// propagate NaN as torch.minimum/maximum do. The loop stays as the fallback, since an exception
// must not cross MPI's C frames.

enum class Combine { Sum, Min, Max };

template <class T, Combine C>
void reduce_16bit_scalar(const T* a, T* b, int n) {
  for (int i = 0; i < n; ++i) {
    const float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    b[i] = T(C == Combine::Sum ? x + y : C == Combine::Min ? std::min(x, y) : std::max(x, y));
  }
}

template <class T, Combine C>
void reduce_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
  try {
    const auto options = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
    const at::Tensor a = at::from_blob(in, {*len}, options);
    at::Tensor b = at::from_blob(inout, {*len}, options);
    if (C == Combine::Sum) b.add_(a);
    else if (C == Combine::Min) at::minimum_out(b, b, a);
    else at::maximum_out(b, b, a);
  } catch (...) {
    reduce_16bit_scalar<T, C>(static_cast<const T*>(in), static_cast<T*>(inout), *len);
  }
}

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

bool finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

// One Runtime per process: a second accelerator (tests, an in-process launcher) shares the first
// one's MPI instead of initialising it again, which MPI forbids.
std::mutex runtime_mu;
std::weak_ptr<Runtime> current_runtime;

void Runtime::shutdown() {
  if (shut_down || finalized()) return;
  shut_down = true;
  for (MPI_Op* op : {&half_ops[0], &half_ops[1], &half_ops[2], &bf16_ops[0], &bf16_ops[1],
                     &bf16_ops[2]})
    if (*op != MPI_OP_NULL) MPI_Op_free(op);
  if (!initialized_here) return;
  if (!abandon_reason && pending_ops > 0) abandon_reason = "MPI operations are still in flight";
  if (abandon_reason) {
    std::fprintf(stderr, "trainrun mpi: not calling MPI_Finalize: %s\n", abandon_reason);
    return;
  }
  MPI_Finalize();
}

// A rank that leaves through exit() with the accelerator still alive (no destructor runs) would
// otherwise end the whole job at once, as if it had failed; it finalises here instead.
void shutdown_at_exit() {
  std::lock_guard<std::mutex> lock(runtime_mu);
  if (auto rt = current_runtime.lock()) rt->shutdown();
}

std::shared_ptr<Runtime> Runtime::acquire() {
  std::lock_guard<std::mutex> lock(runtime_mu);
  if (auto rt = current_runtime.lock()) return rt;

  TR_CHECK(!finalized(), "mpi: MPI was already finalized in this process (by an earlier mpi "
           "accelerator or by other code), and MPI cannot be initialized twice; create the mpi "
           "accelerator while the previous one still exists, or once per process");
  auto rt = std::make_shared<Runtime>();
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    TR_CHECK(rc == MPI_SUCCESS, "mpi: MPI_Init_thread failed: ", error_string(rc));
    rt->initialized_here = true;
    static const bool registered = std::atexit(&shutdown_at_exit) == 0;
    (void)registered;
  } else {
    MPI_Query_thread(&provided);
  }
  // Below SERIALIZED, MPI may only be called from the thread that initialised it.
  int is_main = 0;
  MPI_Is_thread_main(&is_main);
  TR_CHECK(provided >= MPI_THREAD_SERIALIZED || is_main,
           "mpi: MPI provides thread level ", provided, " (below MPI_THREAD_SERIALIZED = ",
           MPI_THREAD_SERIALIZED, ") and this is not the thread that initialized MPI");
  // Errors must come back as codes, to become trainrun Errors naming the operation, rather than
  // abort the process (MPI's default handler) without saying which collective failed.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);

  rt->library = library_version();
  using H = c10::Half;
  using B = c10::BFloat16;
  MPI_User_function* half_fns[3] = {&reduce_16bit<H, Combine::Sum>,
                                    &reduce_16bit<H, Combine::Min>,
                                    &reduce_16bit<H, Combine::Max>};
  MPI_User_function* bf16_fns[3] = {&reduce_16bit<B, Combine::Sum>,
                                    &reduce_16bit<B, Combine::Min>,
                                    &reduce_16bit<B, Combine::Max>};
  for (int i = 0; i < 3; ++i) {
    int rc = MPI_Op_create(half_fns[i], /*commute=*/1, &rt->half_ops[i]);
    if (rc == MPI_SUCCESS) rc = MPI_Op_create(bf16_fns[i], 1, &rt->bf16_ops[i]);
    TR_CHECK(rc == MPI_SUCCESS, "mpi: MPI_Op_create failed: ", error_string(rc));
  }
  current_runtime = rt;
  return rt;
}

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

Clock::time_point deadline_after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(seconds));
}

/// Waits for a request that is not a communicator operation (set-up steps), with a timeout so
/// that set-up, too, cannot hang on a rank that never arrives.
void wait_request(MPI_Request& request, double timeout_s, const std::string& what,
                  Runtime& rt) {
  const auto deadline = deadline_after(timeout_s);
  Backoff backoff;
  for (;;) {
    int flag = 0;
    const int rc = MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      rt.fail();
      TR_FAIL("mpi: ", what, " failed: ", error_string(rc));
    }
    if (flag) return;
    if (Clock::now() >= deadline) {
      rt.fail();
      TR_FAIL("mpi: ", what, " timed out after ", seconds_text(timeout_s),
              " s: some rank has not arrived (is every rank running the same job?)");
    }
    backoff.pause();
  }
}

void check_mpi(int rc, const char* call, const std::string& what, Runtime& rt) {
  if (rc == MPI_SUCCESS) return;
  rt.fail();
  TR_FAIL("mpi: ", what, ": ", call, " failed: ", error_string(rc));
}

// --- operations and groups -------------------------------------------------------------------

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
  int tag_ub = 32767;            // the smallest MPI_TAG_UB the standard allows
  std::string number;            // "" for the world, "1", "1.2" for groups of groups
  std::string name;              // "world", "group 1 [0, 2]"
  std::string prefix;            // store keys of this group's Monitor
  std::vector<int> global_ranks;  // by rank in this group
  std::shared_ptr<c10d::Store> store;
  std::shared_ptr<comm::Monitor> monitor;
  double timeout_s = 600;
  double stall_warning_s = 60;
  bool check_order = true;
  int children = 0;  // new_group calls so far: numbers sub-groups identically on every rank

  std::vector<std::shared_ptr<Op>> in_flight;  // posted, completion not yet seen; oldest first
  std::deque<std::shared_ptr<Op>> unreported;  // collectives not yet reported to the Monitor

  ~Group();
};

// What has to happen once per operation, when its completion (or failure) is first seen.
void on_completion(Group& g, Op& op, int rc, const MPI_Status& status) {
  op.done = true;
  if (op.posted) --g.rt->pending_ops, op.posted = false;
  if (rc != MPI_SUCCESS) {
    // A receive into a tensor smaller than the message leaves nothing pending on either side;
    // any other error may leave a peer waiting, and MPI_Finalize would then wait for it.
    int error_class = rc;
    MPI_Error_class(rc, &error_class);
    if (error_class != MPI_ERR_TRUNCATE) g.rt->fail();
    op.error = std::make_exception_ptr(Error(detail::cat(
        kBackend, ": ", op.text, op.seq ? detail::cat(" #", op.seq) : std::string(),
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

// Lets MPI progress the operations already in flight and retires those that finished, so that
// a Work nobody waits on still completes (and its Avg division runs) and the Monitor's progress
// stays current while a strategy issues bucket after bucket.
void progress(Group& g) {
  while (!g.in_flight.empty()) {
    auto oldest = g.in_flight.front();
    if (!test(g, *oldest)) return;
  }
}

void wait_op(Group& g, Op& op, double timeout_s) {
  const double limit = timeout_s > 0 ? timeout_s : op.timeout_s;
  const auto deadline = deadline_after(limit);
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

MPI_Datatype datatype_of(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return MPI_FLOAT;
    case c10::kDouble: return MPI_DOUBLE;
    case c10::kInt: return MPI_INT32_T;
    case c10::kLong: return MPI_INT64_T;
    case c10::kByte: return MPI_UINT8_T;
    case c10::kHalf:
    case c10::kBFloat16: return MPI_UINT16_T;
    default: break;
  }
  TR_FAIL("mpi: dtype ", comm::dtype_name(t), " has no MPI datatype");
}

MPI_Op op_of(const Runtime& rt, ReduceOp op, c10::ScalarType t) {
  const int i = op == ReduceOp::Min ? 1 : op == ReduceOp::Max ? 2 : 0;  // Avg = Sum, then /n
  if (t == c10::kHalf) return rt.half_ops[i];
  if (t == c10::kBFloat16) return rt.bf16_ops[i];
  return i == 1 ? MPI_MIN : i == 2 ? MPI_MAX : MPI_SUM;
}

// Integer averages truncate toward zero, as NCCL's ncclAvg does.
void divide(at::Tensor& t, int n) {
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/false))
    t.div_(n, "trunc");
  else
    t.div_(n);
}

int mpi_count(int64_t numel, const char* op) {
  TR_CHECK(numel <= INT_MAX, "mpi: ", op, ": ", numel,
           " elements per rank; MPI counts are 32-bit (at most ", INT_MAX,
           " elements per operation): split the tensor");
  return static_cast<int>(numel);
}

std::string list_text(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The new group's Monitor, after every member has announced itself in the group's own store
// prefix (rendezvous also proves every member reached this point).
void attach_monitor(Group& g) {
  auto peers = comm::rendezvous(*g.store, g.prefix + "rdzv/", g.rank, g.size, g.timeout_s,
                                detail::cat(kBackend, " ", g.name));
  comm::Monitor::Config config;
  config.backend = kBackend;
  config.group = g.name;
  config.prefix = g.prefix;
  config.rank = g.rank;
  config.world_size = g.size;
  config.global_ranks = g.global_ranks;
  config.stall_warning_s = g.stall_warning_s;
  config.check_order = g.check_order;
  g.monitor = std::make_shared<comm::Monitor>(g.store, config, std::move(peers));
  g.monitor->timeout_s = g.timeout_s;
}

void set_comm(Group& g, MPI_Comm comm, const std::string& what) {
  g.comm = comm;
  check_mpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", what,
            *g.rt);
  check_mpi(MPI_Comm_rank(comm, &g.rank), "MPI_Comm_rank", what, *g.rt);
  check_mpi(MPI_Comm_size(comm, &g.size), "MPI_Comm_size", what, *g.rt);
  void* ub = nullptr;
  int found = 0;
  // MPI_TAG_UB is an attribute of MPI_COMM_WORLD only; sub-communicators share it.
  if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found) == MPI_SUCCESS && found)
    g.tag_ub = *static_cast<int*>(ub);
}

/// Starts one collective: the order check, then the MPI call (skipped for empty tensors, where
/// MPI has nothing to move but the sequence number and the check must still advance).
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
  op->timeout_s = timeout_s > 0 ? timeout_s : g->timeout_s;
  op->on_success = std::move(on_success);
  g->unreported.push_back(op);
  MPI_Status status;
  std::memset(&status, 0, sizeof status);
  if (empty) {
    on_completion(*g, *op, MPI_SUCCESS, status);
  } else {
    op->keep_alive = std::move(keep_alive);
    const int rc = post(&op->request);
    if (rc != MPI_SUCCESS) {
      on_completion(*g, *op, rc, status);
      std::rethrow_exception(op->error);
    }
    op->posted = true;
    ++g->rt->pending_ops;
    g->in_flight.push_back(op);
  }
  return std::make_shared<MpiWork>(g, op);
}

}  // namespace mpi_detail

using namespace mpi_detail;

// --- Work ------------------------------------------------------------------------------------

MpiWork::MpiWork(std::shared_ptr<Group> group, std::shared_ptr<Op> op)
    : group_(std::move(group)), op_(std::move(op)) {}

void MpiWork::wait(double timeout_s) { wait_op(*group_, *op_, timeout_s); }

bool MpiWork::completed() const { return test(*group_, *op_); }

// --- communicator ----------------------------------------------------------------------------

MpiCommunicator::MpiCommunicator(std::shared_ptr<Group> group) : group_(std::move(group)) {}
MpiCommunicator::~MpiCommunicator() = default;
int MpiCommunicator::rank() const { return group_->rank; }
int MpiCommunicator::world_size() const { return group_->size; }

namespace {

comm::OpDesc describe_op(const char* op, std::string detail, const at::Tensor& input) {
  comm::OpDesc d;
  d.op = op;
  d.detail = std::move(detail);
  d.dtype = input.scalar_type();
  d.numel = input.numel();
  d.bytes = static_cast<int64_t>(input.nbytes());
  return d;
}

}  // namespace

std::shared_ptr<Work> MpiCommunicator::all_reduce(at::Tensor& tensor,
                                                  const AllReduceOptions& opts) {
  comm::check_tensor(tensor, kBackend, "all_reduce", "the");
  const int count = mpi_count(tensor.numel(), "all_reduce");
  auto& g = group_;
  const MPI_Datatype type = datatype_of(tensor.scalar_type());
  const MPI_Op op = op_of(*g->rt, opts.op, tensor.scalar_type());
  std::function<void(const MPI_Status&)> after;
  if (opts.op == ReduceOp::Avg)
    after = [tensor, n = g->size](const MPI_Status&) mutable { divide(tensor, n); };
  void* data = tensor.data_ptr();
  return start_collective(
      g, describe_op("all_reduce", comm::reduce_op_name(opts.op), tensor), opts.timeout_s,
      count == 0, "MPI_Iallreduce",
      [&](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, data, count, type, op, g->comm, r); },
      {tensor}, std::move(after));
}

std::shared_ptr<Work> MpiCommunicator::reduce_scatter(const at::Tensor& input, at::Tensor& output,
                                                      const ReduceScatterOptions& opts) {
  auto& g = group_;
  comm::check_reduce_scatter(input, output, g->size, kBackend);
  const int count = mpi_count(output.numel(), "reduce_scatter");
  const MPI_Datatype type = datatype_of(input.scalar_type());
  const MPI_Op op = op_of(*g->rt, opts.op, input.scalar_type());
  // MPI forbids a receive buffer that overlaps the send buffer (e.g. output = this rank's chunk
  // of input, as a ZeRO flat buffer is laid out), so such a result goes through a temporary.
  const bool overlap = count > 0 && at::get_overlap_status(input, output) != at::MemOverlapStatus::No;
  at::Tensor result = overlap ? at::empty_like(output) : output;
  std::function<void(const MPI_Status&)> after =
      [output, result, overlap, avg = opts.op == ReduceOp::Avg, n = g->size](
          const MPI_Status&) mutable {
        if (overlap) output.copy_(result);
        if (avg) divide(output, n);
      };
  const void* send = input.data_ptr();
  void* recv = result.data_ptr();
  return start_collective(
      g, describe_op("reduce_scatter", comm::reduce_op_name(opts.op), input), opts.timeout_s,
      count == 0, "MPI_Ireduce_scatter_block",
      [&](MPI_Request* r) {
        return MPI_Ireduce_scatter_block(send, recv, count, type, op, g->comm, r);
      },
      {input, output, result}, std::move(after));
}

std::shared_ptr<Work> MpiCommunicator::all_gather(const at::Tensor& input, at::Tensor& output,
                                                  const AllGatherOptions& opts) {
  auto& g = group_;
  comm::check_all_gather(input, output, g->size, kBackend);
  const int count = mpi_count(input.numel(), "all_gather");
  const MPI_Datatype type = datatype_of(input.scalar_type());
  // An input that is exactly this rank's slot of the output (ZeRO's parameter all-gather) is
  // MPI_IN_PLACE; any other overlap is copied out first, since MPI forbids aliased buffers.
  at::Tensor source = input;
  const void* send = input.data_ptr();
  if (count > 0 && at::get_overlap_status(input, output) != at::MemOverlapStatus::No) {
    const auto* slot = static_cast<const char*>(output.data_ptr()) +
                       static_cast<int64_t>(g->rank) * input.nbytes();
    if (send == slot) {
      send = MPI_IN_PLACE;
    } else {
      source = input.clone();
      send = source.data_ptr();
    }
  }
  void* recv = output.data_ptr();
  return start_collective(
      g, describe_op("all_gather", "", input), opts.timeout_s, count == 0, "MPI_Iallgather",
      [&](MPI_Request* r) {
        return MPI_Iallgather(send, count, type, recv, count, type, g->comm, r);
      },
      {source, output}, nullptr);
}

std::shared_ptr<Work> MpiCommunicator::broadcast(at::Tensor& tensor,
                                                 const BroadcastOptions& opts) {
  comm::check_tensor(tensor, kBackend, "broadcast", "the");
  auto& g = group_;
  TR_CHECK(opts.root >= 0 && opts.root < g->size, "mpi: broadcast: root ", opts.root,
           " is not a rank of group ", g->name, " (world_size ", g->size, ")");
  const int count = mpi_count(tensor.numel(), "broadcast");
  const MPI_Datatype type = datatype_of(tensor.scalar_type());
  void* data = tensor.data_ptr();
  const int root = opts.root;
  return start_collective(
      g, describe_op("broadcast", detail::cat("root ", root), tensor), opts.timeout_s,
      count == 0, "MPI_Ibcast",
      [&](MPI_Request* r) { return MPI_Ibcast(data, count, type, root, g->comm, r); }, {tensor},
      nullptr);
}

namespace {

std::shared_ptr<Work> point_to_point(const std::shared_ptr<Group>& g, bool is_send,
                                     const at::Tensor& tensor, const PointToPointOptions& opts) {
  const char* op = is_send ? "send" : "recv";
  comm::check_tensor(tensor, kBackend, op, "the");
  TR_CHECK(opts.peer >= 0 && opts.peer < g->size, "mpi: ", op, ": peer ", opts.peer,
           " is not a rank of group ", g->name, " (world_size ", g->size, ")");
  TR_CHECK(opts.tag >= 0 && opts.tag <= g->tag_ub, "mpi: ", op, ": tag ", opts.tag,
           " is outside MPI's range 0..", g->tag_ub);
  const int count = mpi_count(tensor.numel(), op);
  const MPI_Datatype type = datatype_of(tensor.scalar_type());
  progress(*g);
  auto work = std::make_shared<Op>();
  work->text = detail::cat(op, "(", comm::dtype_name(tensor.scalar_type()), " x ",
                           tensor.numel(), ", ", tensor.nbytes(), " B) ",
                           is_send ? "to" : "from", " rank ", opts.peer, " tag ", opts.tag);
  work->call = is_send ? "MPI_Isend" : "MPI_Irecv";
  work->timeout_s = opts.timeout_s > 0 ? opts.timeout_s : g->timeout_s;
  work->keep_alive = {tensor};
  if (!is_send) {
    // A shorter message than the tensor is not an MPI error, but it would leave the tail of the
    // tensor stale; a longer one is (MPI_ERR_TRUNCATE).
    work->on_success = [type, count, text = work->text, group = g->name](
                           const MPI_Status& status) {
      int received = 0;
      MPI_Get_count(&status, type, &received);
      TR_CHECK(received == count, "mpi: ", text, " in group ", group, ": received ", received,
               " elements, expected ", count, " (the sender's tensor is smaller)");
    };
  }
  const int rc = is_send ? MPI_Isend(tensor.data_ptr(), count, type, opts.peer, opts.tag,
                                     g->comm, &work->request)
                         : MPI_Irecv(tensor.data_ptr(), count, type, opts.peer, opts.tag,
                                     g->comm, &work->request);
  if (rc != MPI_SUCCESS) {
    MPI_Status status;
    on_completion(*g, *work, rc, status);
    std::rethrow_exception(work->error);
  }
  work->posted = true;
  ++g->rt->pending_ops;
  g->in_flight.push_back(work);
  return std::make_shared<MpiWork>(g, work);
}

}  // namespace

std::shared_ptr<Work> MpiCommunicator::send(const at::Tensor& tensor,
                                            const PointToPointOptions& opts) {
  return point_to_point(group_, true, tensor, opts);
}

std::shared_ptr<Work> MpiCommunicator::recv(at::Tensor& tensor, const PointToPointOptions& opts) {
  return point_to_point(group_, false, tensor, opts);
}

std::shared_ptr<Work> MpiCommunicator::barrier(const BarrierOptions& opts) {
  comm::OpDesc desc;
  desc.op = "barrier";
  auto& g = group_;
  return start_collective(
      g, desc, opts.timeout_s, false, "MPI_Ibarrier",
      [&](MPI_Request* r) { return MPI_Ibarrier(g->comm, r); }, {}, nullptr);
}

std::shared_ptr<Communicator> MpiCommunicator::new_group(const std::vector<int>& ranks) {
  auto& g = group_;
  const int index = ++g->children;
  TR_CHECK(!ranks.empty(), "mpi: new_group: the list of ranks is empty");
  std::set<int> seen;
  for (int r : ranks) {
    TR_CHECK(r >= 0 && r < g->size, "mpi: new_group ", list_text(ranks), ": rank ", r,
             " is not a rank of group ", g->name, " (world_size ", g->size, ")");
    TR_CHECK(seen.insert(r).second, "mpi: new_group ", list_text(ranks), ": rank ", r,
             " is listed twice");
  }
  // MPI_Comm_split blocks until every rank of this group calls it and has no timeout. Issued as
  // a collective first, the order check catches ranks that pass different lists, and the
  // barrier's timeout catches a rank that never calls new_group; after the barrier every rank is
  // known to be on its way into the split, which then cannot hang.
  comm::OpDesc desc;
  desc.op = "new_group";
  desc.detail = list_text(ranks);
  start_collective(g, desc, 0, false, "MPI_Ibarrier",
                   [&](MPI_Request* r) { return MPI_Ibarrier(g->comm, r); }, {}, nullptr)
      ->wait();

  const auto pos = std::find(ranks.begin(), ranks.end(), g->rank);
  const bool member = pos != ranks.end();
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(g->comm, member ? 0 : MPI_UNDEFINED,
                           member ? static_cast<int>(pos - ranks.begin()) : 0, &comm),
            "MPI_Comm_split", detail::cat("new_group ", list_text(ranks)), *g->rt);
  if (!member) return nullptr;

  auto child = std::make_shared<Group>();
  child->rt = g->rt;
  child->store = g->store;
  child->timeout_s = g->timeout_s;
  child->stall_warning_s = g->stall_warning_s;
  child->check_order = g->check_order;
  child->number = g->number.empty() ? std::to_string(index) : g->number + "." + std::to_string(index);
  for (int r : ranks) child->global_ranks.push_back(g->global_ranks[r]);
  child->name = "group " + child->number + " " + list_text(child->global_ranks);
  child->prefix = g->prefix + std::to_string(index) + "/";
  set_comm(*child, comm, "new_group " + list_text(ranks));
  TR_CHECK(child->rank == pos - ranks.begin() && child->size == static_cast<int>(ranks.size()),
           "mpi: new_group ", list_text(ranks), ": MPI_Comm_split gave rank ", child->rank,
           " of ", child->size, ", expected ", pos - ranks.begin(), " of ", ranks.size());
  attach_monitor(*child);
  return std::make_shared<MpiCommunicator>(child);
}

// --- accelerator -----------------------------------------------------------------------------

namespace {

// The store the Monitors share. Under trainrun's launcher (or with MASTER_ADDR/MASTER_PORT set by
// the user) it is the job's store; under a bare mpiexec nobody serves one, so rank 0 starts one
// on a free port and tells the others over MPI where it is.
std::shared_ptr<c10d::Store> open_job_store(Group& g) {
  if (g.size == 1) return std::make_shared<c10d::HashStore>();
  if (auto address = comm::store_address_from_environment()) {
    auto store = comm::open_store(*address, g.rank, g.size, g.timeout_s);
    if (g.rank == 0 && !address->agent_serves) g.rt->served_store = store;
    return store;
  }

  // Loopback when every rank runs on this host: always reachable, whatever the host name
  // resolves to; otherwise the host name, which the other hosts must be able to resolve.
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  check_mpi(MPI_Get_processor_name(name, &len), "MPI_Get_processor_name", "store set-up", *g.rt);
  std::vector<char> names(static_cast<size_t>(g.size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(),
                           MPI_MAX_PROCESSOR_NAME, MPI_CHAR, g.comm, &request),
            "MPI_Iallgather", "store set-up (processor names)", *g.rt);
  wait_request(request, g.timeout_s, "store set-up (processor names)", *g.rt);
  bool one_host = true;
  for (int r = 1; r < g.size; ++r)
    one_host = one_host && std::strncmp(&names[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME],
                                        names.data(), MPI_MAX_PROCESSOR_NAME) == 0;

  // Rank 0 sends "host:port", or "!" and why it could not serve, so no rank waits in vain.
  std::shared_ptr<c10d::Store> store;
  std::vector<char> message(1024, '\0');
  if (g.rank == 0) {
    std::string text;
    try {
      int port = 0;
      store = comm::serve_store(0, g.size, g.timeout_s, &port);
      text = detail::cat(one_host ? std::string("127.0.0.1") : comm::host_name(), ":", port);
    } catch (const std::exception& e) {
      text = std::string("!") + e.what();
    }
    std::strncpy(message.data(), text.c_str(), message.size() - 1);
  }
  check_mpi(MPI_Ibcast(message.data(), static_cast<int>(message.size()), MPI_CHAR, 0, g.comm,
                       &request),
            "MPI_Ibcast", "store set-up (address)", *g.rt);
  wait_request(request, g.timeout_s, "store set-up (address)", *g.rt);
  const std::string text(message.data());
  TR_CHECK(text.empty() || text[0] != '!', "mpi: rank 0 could not start the job's store: ",
           text.substr(1));
  if (g.rank == 0) {
    g.rt->served_store = store;
    return store;
  }
  const auto colon = text.rfind(':');
  TR_CHECK(colon != std::string::npos, "mpi: malformed store address '", text, "' from rank 0");
  comm::StoreAddress address;
  address.host = text.substr(0, colon);
  address.port = std::stoi(text.substr(colon + 1));
  address.agent_serves = true;  // rank 0 serves it: everyone else only connects
  return comm::open_store(address, g.rank, g.size, g.timeout_s);
}

}  // namespace

void MpiAccelerator::declare_options(OptionSchema& schema) {
  comm::declare_threads_option(schema);
  comm::declare_backend_options(schema);
}

MpiAccelerator::MpiAccelerator(const Options& options, const RunContext& ctx) {
  const comm::BackendOptions backend = comm::backend_options(options);
  const double timeout_s = backend.timeout_s;
  const double stall_s = backend.stall_warning_s;
  threads_ = comm::apply_threads_option(options, ctx, "mpi");

  // Where the job has a store (trainrun's launcher, or MASTER_ADDR/MASTER_PORT), the ranks meet
  // there before MPI_Init: a rank that dies or never starts before MPI_Init leaves its peers
  // blocked inside MPI_Init (hydra stops them only once every rank has initialised), whereas
  // this rendezvous names it within the rendezvous timeout.
  std::shared_ptr<c10d::Store> store;
  bool serves_store = false;
  if (ctx.world_size > 1) {
    if (auto address = comm::store_address_from_environment()) {
      const double rdzv_s = comm::rendezvous_timeout_from_environment();
      store = comm::open_store(*address, ctx.rank, ctx.world_size, rdzv_s);
      serves_store = ctx.rank == 0 && !address->agent_serves;
      comm::rendezvous(*store, "mpi/init/", ctx.rank, ctx.world_size, rdzv_s,
                       "mpi: before MPI_Init");
      store->setTimeout(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    }
  }

  runtime_ = Runtime::acquire();
  if (serves_store) runtime_->served_store = store;
  int world_rank = 0, world_size = 0;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "MPI_Comm_rank", "start-up", *runtime_);
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &world_size), "MPI_Comm_size", "start-up", *runtime_);
  TR_CHECK(world_size == ctx.world_size,
           "mpi: MPI_COMM_WORLD has ", world_size, " rank(s) but the job has world_size ",
           ctx.world_size, world_size == 1
               ? ": this process was not started by mpiexec (run `mpiexec -n N trainrun ...`, "
                 "or let trainrun's launcher start the ranks through mpiexec)"
               : ": the ranks were started by different launchers");
  TR_CHECK(world_rank == ctx.rank, "mpi: this process is rank ", world_rank,
           " of MPI_COMM_WORLD but rank ", ctx.rank, " of the job (RANK/PMI_RANK disagree)");

  auto g = std::make_shared<Group>();
  g->rt = runtime_;
  g->name = "world";
  g->prefix = detail::cat("mpi/", ++runtime_->accelerators, "/");
  g->timeout_s = timeout_s;
  g->stall_warning_s = stall_s;
  g->check_order = backend.check_collectives;
  for (int r = 0; r < world_size; ++r) g->global_ranks.push_back(r);
  // A duplicate keeps trainrun's messages and collectives apart from anything else in the
  // process that uses MPI_COMM_WORLD (MPI matches by communicator).
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Comm_idup(MPI_COMM_WORLD, &dup, &request), "MPI_Comm_idup", "start-up",
            *runtime_);
  wait_request(request, timeout_s, "start-up (MPI_Comm_idup of MPI_COMM_WORLD)", *runtime_);
  set_comm(*g, dup, "start-up");
  g->store = store ? store : open_job_store(*g);
  attach_monitor(*g);
  world_ = std::make_unique<MpiCommunicator>(std::move(g));
}

// Groups (and, through them, MPI) may outlive the accelerator; MPI is finalised by whichever
// holder of the Runtime goes last.
MpiAccelerator::~MpiAccelerator() {
  // Destroyed by an exception, this rank is failing: finalising would keep the job alive until
  // every peer's collective timeout (up to timeout_s), while leaving without it makes mpiexec end
  // all ranks now, with this rank's exit code (see Runtime).
  if (std::uncaught_exceptions() > 0)
    runtime_->fail("the rank is failing (the accelerator was destroyed by an exception); "
                   "mpiexec ends the other ranks");
}

std::string MpiAccelerator::describe() const {
  return detail::cat("mpi (", runtime_->library, "), rank ", world_->rank(), " of ",
                     world_->world_size(), ", ", v1::cpu::describe(threads_));
}

}  // namespace trainrun::plugins
