// The process's MPI library, as every mpi accelerator and group shares it: initialising and
// finalising it (Runtime), its error texts, the reduction ops it lacks (float16, bfloat16), and
// waiting for the requests of set-up steps.
#include <trainrun/error.hpp>

#include <ATen/Functions.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "mpi_detail.hpp"

namespace trainrun::plugins::mpi_detail {

using namespace trainrun::v1;

namespace {

std::string raw_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return detail::cat("MPI error ", code);
  return std::string(buf, static_cast<size_t>(len));
}

}  // namespace

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
    if (C == Combine::Sum)
      b.add_(a);
    else if (C == Combine::Min)
      at::minimum_out(b, b, a);
    else
      at::maximum_out(b, b, a);
  } catch (...) {
    reduce_16bit_scalar<T, C>(static_cast<const T*>(in), static_cast<T*>(inout), *len);
  }
}

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
  for (MPI_Op* op :
       {&half_ops[0], &half_ops[1], &half_ops[2], &bf16_ops[0], &bf16_ops[1], &bf16_ops[2]})
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

  TR_CHECK(!finalized(),
           "mpi: MPI was already finalized in this process (by an earlier mpi "
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
  TR_CHECK(provided >= MPI_THREAD_SERIALIZED || is_main, "mpi: MPI provides thread level ",
           provided, " (below MPI_THREAD_SERIALIZED = ", MPI_THREAD_SERIALIZED,
           ") and this is not the thread that initialized MPI");
  // Errors must come back as codes, to become trainrun Errors naming the operation, rather than
  // abort the process (MPI's default handler) without saying which collective failed.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);

  rt->library = library_version();
  using H = c10::Half;
  using B = c10::BFloat16;
  MPI_User_function* half_fns[3] = {&reduce_16bit<H, Combine::Sum>, &reduce_16bit<H, Combine::Min>,
                                    &reduce_16bit<H, Combine::Max>};
  MPI_User_function* bf16_fns[3] = {&reduce_16bit<B, Combine::Sum>, &reduce_16bit<B, Combine::Min>,
                                    &reduce_16bit<B, Combine::Max>};
  for (int i = 0; i < 3; ++i) {
    int rc = MPI_Op_create(half_fns[i], /*commute=*/1, &rt->half_ops[i]);
    if (rc == MPI_SUCCESS) rc = MPI_Op_create(bf16_fns[i], 1, &rt->bf16_ops[i]);
    TR_CHECK(rc == MPI_SUCCESS, "mpi: MPI_Op_create failed: ", error_string(rc));
  }
  current_runtime = rt;
  return rt;
}

void wait_request(MPI_Request& request, double timeout_s, const std::string& what, Runtime& rt) {
  const auto deadline = comm::deadline_after(timeout_s);
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

}  // namespace trainrun::plugins::mpi_detail
