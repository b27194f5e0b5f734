#include "nccl.hpp"

#include "comm_common.hpp"
#include "pending.hpp"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <trainrun/error.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace trainrun::plugins::cuda {

using namespace trainrun::v1;

namespace {

constexpr const char* kBackend = "nccl";
// How long a poisoned communicator waits for the host to pick its error up before the watchdog
// ends the process (the host may be blocked in a stream synchronisation elsewhere).
constexpr double kExitGraceS = 30.0;

std::string cuda_text(cudaError_t e) {
  return detail::cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

// An event recorded on a stream; done() is cudaEventQuery.
class CudaEvent final : public CompletionProbe {
 public:
  explicit CudaEvent(int device) : device_(device) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    const cudaError_t e = cudaEventCreateWithFlags(&event_, cudaEventDisableTiming);
    TR_CHECK(e == cudaSuccess, kBackend, ": cudaEventCreateWithFlags: ", cuda_text(e));
  }
  ~CudaEvent() override {
    if (event_) cudaEventDestroy(event_);
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  void record(cudaStream_t stream) {
    const cudaError_t e = cudaEventRecord(event_, stream);
    TR_CHECK(e == cudaSuccess, kBackend, ": cudaEventRecord: ", cuda_text(e));
  }
  // `stream` waits on the device for the work before this event; the host does not wait.
  void block(cudaStream_t stream) {
    const cudaError_t e = cudaStreamWaitEvent(stream, event_, 0);
    TR_CHECK(e == cudaSuccess, kBackend, ": cudaStreamWaitEvent: ", cuda_text(e));
  }
  bool done() override {
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) return false;
    TR_FAIL(kBackend, ": cudaEventQuery: ", cuda_text(e));
  }
  int device() const { return device_; }

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
};

std::string nccl_text(ncclResult_t r, ncclComm_t comm) {
  std::string s = ncclGetErrorString(r);
  if (comm) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) s += std::string(" (") + last + ")";
  }
  return s;
}

void check_tensor(const at::Tensor& t, int device, const char* op, const char* role) {
  TR_CHECK(t.defined(), kBackend, ": ", op, ": ", role, " tensor is undefined");
  TR_CHECK(t.device().is_cuda() && t.device().index() == device, kBackend, ": ", op, ": ", role,
           " tensor is on ", t.device(), ", expected the accelerator's device cuda:", device);
  TR_CHECK(t.layout() == at::kStrided, kBackend, ": ", op, ": ", role,
           " tensor must be dense (strided), got layout ", t.layout());
  TR_CHECK(t.is_contiguous(), kBackend, ": ", op, ": ", role, " tensor must be contiguous (shape ",
           t.sizes(), ", strides ", t.strides(), "); call .contiguous() first");
  (void)nccl_dtype(t.scalar_type());
}

// reduce_scatter's and all_gather's preconditions, comm-common's with the tensors on `device`.
void check_chunked(const at::Tensor& input, const at::Tensor& output, int size, int device,
                   const char* op, const at::Tensor& whole, const at::Tensor& chunk,
                   const char* rule) {
  comm::check_chunked(
      input, output, size, kBackend, op, whole, chunk, rule,
      [&](const at::Tensor& t, const char* role) { check_tensor(t, device, op, role); });
}

}  // namespace

int nccl_dtype(c10::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    case at::kBool: return ncclUint8;  // one byte each; Sum/Max of 0/1 bytes is an "or" up to 255 ranks
    default: break;
  }
  TR_FAIL(kBackend, ": tensor dtype ", comm::dtype_name(t),
          " has no NCCL type; supported: float32, float64, float16, bfloat16, int32, int64, "
          "uint8, int8, bool");
}

int nccl_reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
  }
  TR_FAIL(kBackend, ": unknown reduce op");
}

std::string NcclCommunicator::nccl_version() {
  int v = 0;
  ncclGetVersion(&v);
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return detail::cat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

// --- the communicator ------------------------------------------------------------------------

struct NcclCommunicator::Impl : std::enable_shared_from_this<NcclCommunicator::Impl> {
  std::shared_ptr<c10d::Store> store;
  NcclSettings settings;
  std::string id, name, prefix;
  std::vector<int> global_ranks;
  int rank = 0, size = 1, device = 0;
  int groups_made = 0;  // new_group calls so far (ids of sub-groups)
  std::shared_ptr<comm::Monitor> monitor;
  ncclComm_t comm = nullptr;
  c10::cuda::CUDAStream stream = c10::cuda::getDefaultCUDAStream();
  PendingOps pending;

  // Poisoning: the first failure, thrown by every later call.
  mutable std::mutex error_mu;
  std::string error;
  std::atomic<bool> poisoned{false};
  std::atomic<bool> error_seen{false};
  std::chrono::steady_clock::time_point poisoned_at;

  std::atomic<bool> stop{false};
  std::atomic<bool> aborted{false};
  std::thread watchdog;

  ~Impl() {
    stop = true;
    if (watchdog.joinable()) watchdog.join();
    if (!comm || aborted) return;
    // With operations still in flight only an abort returns for sure.
    if (pending.size() > 0)
      ncclCommAbort(comm);
    else
      ncclCommDestroy(comm);
  }

  [[noreturn]] void throw_error() const {
    std::string e;
    {
      std::lock_guard<std::mutex> lock(error_mu);
      e = error;
    }
    const_cast<Impl*>(this)->error_seen = true;
    throw Error(e);
  }
  void throw_if_poisoned() const {
    if (poisoned) throw_error();
  }
  // Records the first failure and aborts the NCCL communicator, which ends its kernels.
  void poison(const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(error_mu);
      if (poisoned) return;
      error = what;
      poisoned_at = std::chrono::steady_clock::now();
      poisoned = true;
    }
    // The handle stays set (a launch racing with this abort fails in NCCL rather than reading
    // a null communicator); `aborted` keeps the destructor from freeing it twice.
    if (comm && !aborted.exchange(true)) ncclCommAbort(comm);
    pending.clear();
  }

  double timeout_of(double op_timeout_s) const {
    return op_timeout_s > 0 ? op_timeout_s : settings.timeout_s;
  }

  void watch() {
    while (!stop) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (poisoned) {
        const double since = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                           poisoned_at).count();
        if (!error_seen && since > kExitGraceS) {
          std::string e;
          {
            std::lock_guard<std::mutex> lock(error_mu);
            e = error;
          }
          std::fprintf(stderr, "error: rank %d: %s (nobody waited on the failed operation for %.0f s;"
                       " ending the process)\n", global_ranks[rank], e.c_str(), kExitGraceS);
          std::fflush(stderr);
          std::_Exit(1);
        }
        continue;
      }
      PollResult r;
      try {
        r = pending.poll(std::chrono::steady_clock::now());
      } catch (const std::exception& e) {
        poison(detail::cat(kBackend, ": group ", name, ": ", e.what()));
        continue;
      }
      for (uint64_t seq : r.finished) monitor->finished(seq);
      if (r.expired) {
        const PendingOp& op = *r.expired;
        const std::string what = detail::cat("timed out after ", timeout_of(0), " s");
        poison(op.seq ? monitor->describe_failure(op.seq, what)
                      : detail::cat(kBackend, ": ", op.text, " in group ", name, " ", what));
        continue;
      }
      if (comm && !aborted) {
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress)
          poison(detail::cat(kBackend, ": group ", name, ": asynchronous NCCL error: ",
                             nccl_text(async, comm)));
      }
    }
  }

  // Runs `launch` on the communication stream after the caller's current stream's work, and
  // returns the Work that waits for it. `seq` 0 = not sequence-numbered (send/recv).
  template <class Launch>
  std::shared_ptr<Work> enqueue(uint64_t seq, std::string text, double timeout_s,
                                std::vector<at::Tensor> tensors, bool host_wait, Launch launch);
};

namespace {

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclCommunicator::Impl> impl, std::shared_ptr<CudaEvent> end,
           std::string text, double timeout_s, bool host_wait)
      : impl_(std::move(impl)), end_(std::move(end)), text_(std::move(text)),
        timeout_s_(timeout_s), host_wait_(host_wait) {}

  void wait(double timeout_s) override {
    impl_->throw_if_poisoned();
    const double limit = timeout_s > 0 ? timeout_s : timeout_s_;
    if (host_wait_ || impl_->settings.blocking_wait) {
      const auto deadline = comm::deadline_after(limit);
      while (!end_->done()) {
        impl_->throw_if_poisoned();
        if (std::chrono::steady_clock::now() > deadline) {
          impl_->poison(detail::cat(kBackend, ": ", text_, " in group ", impl_->name,
                                    " timed out after ", limit, " s (wait)"));
          impl_->throw_error();
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    // The caller's stream goes on only after the operation (the host does not wait).
    end_->block(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(end_->device())));
  }
  bool completed() const override { return end_->done(); }

 private:
  std::shared_ptr<NcclCommunicator::Impl> impl_;
  std::shared_ptr<CudaEvent> end_;
  std::string text_;
  double timeout_s_;
  bool host_wait_;
};

}  // namespace

template <class Launch>
std::shared_ptr<Work> NcclCommunicator::Impl::enqueue(uint64_t seq, std::string text,
                                                      double timeout_s,
                                                      std::vector<at::Tensor> tensors,
                                                      bool host_wait, Launch launch) {
  const auto dev = static_cast<c10::DeviceIndex>(device);
  c10::cuda::CUDAGuard guard(dev);
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(dev);
  CudaEvent ready(device);
  ready.record(current.stream());
  ready.block(stream.stream());
  // Freed on the compute stream while NCCL still reads or writes them, these blocks must not
  // be reused before the communication stream is past this op.
  for (const auto& t : tensors)
    c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream);
  const ncclResult_t r = launch(comm, stream.stream());
  if (r != ncclSuccess && r != ncclInProgress) {
    const std::string what = detail::cat("failed: ", nccl_text(r, comm));
    poison(seq ? monitor->describe_failure(seq, what)
               : detail::cat(kBackend, ": ", text, " in group ", name, " ", what));
    throw_error();
  }
  auto end = std::make_shared<CudaEvent>(device);
  end->record(stream.stream());
  const double limit = timeout_of(timeout_s);
  PendingOp op;
  op.seq = seq;
  op.text = text;
  op.deadline = comm::deadline_after(limit);
  op.end = end;
  op.keep_alive = std::make_shared<std::vector<at::Tensor>>(std::move(tensors));
  pending.add(std::move(op));
  return std::make_shared<NcclWork>(shared_from_this(), std::move(end), std::move(text), limit,
                                    host_wait);
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<c10d::Store> store, NcclSettings settings,
                                   std::string id, std::string name,
                                   std::vector<int> global_ranks, int rank, int device)
    : impl_(std::make_shared<Impl>()) {
  Impl& m = *impl_;
  m.store = std::move(store);
  m.settings = settings;
  m.id = std::move(id);
  m.name = std::move(name);
  m.prefix = m.id.empty() ? "nccl/g0/" : "nccl/g" + m.id + "/";
  m.global_ranks = std::move(global_ranks);
  m.rank = rank;
  m.size = static_cast<int>(m.global_ranks.size());
  m.device = device;
  TR_CHECK(m.rank >= 0 && m.rank < m.size, kBackend, ": rank ", rank, " is not in [0, ",
           m.size, ")");

  auto peers = comm::rendezvous(*m.store, m.prefix + "rendezvous/", m.rank, m.size,
                                settings.rendezvous_timeout_s,
                                detail::cat(kBackend, " group ", m.name));
  // Rank 0 of the group makes the unique id; the others read it from the store.
  ncclUniqueId uid;
  const std::string key = m.prefix + "unique_id";
  if (m.rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&uid);
    TR_CHECK(r == ncclSuccess, kBackend, ": ncclGetUniqueId: ", nccl_text(r, nullptr));
    const auto* b = reinterpret_cast<const uint8_t*>(&uid);
    m.store->set(key, std::vector<uint8_t>(b, b + sizeof(uid)));
  } else {
    const std::vector<uint8_t> b = m.store->get(key);
    TR_CHECK(b.size() == sizeof(uid), kBackend, ": the NCCL unique id in the store has ",
             b.size(), " bytes, expected ", sizeof(uid), " (ranks built against different NCCLs?)");
    std::memcpy(&uid, b.data(), sizeof(uid));
  }
  {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    const ncclResult_t r = ncclCommInitRank(&m.comm, m.size, uid, m.rank);
    TR_CHECK(r == ncclSuccess, kBackend, ": ncclCommInitRank (group ", m.name, ", rank ", m.rank,
             " of ", m.size, ", cuda:", device, "): ", nccl_text(r, nullptr));
    m.stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/true,
                                            static_cast<c10::DeviceIndex>(device));
  }

  m.monitor = comm::open_monitor(
      m.store, {kBackend, m.name, m.prefix + "monitor/", m.rank, m.size, m.global_ranks}, settings,
      std::move(peers));
  m.watchdog = std::thread([impl = impl_.get()] { impl->watch(); });
}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::world_size() const { return impl_->size; }

std::shared_ptr<Work> NcclCommunicator::all_reduce(at::Tensor& tensor,
                                                   const AllReduceOptions& opts) {
  Impl& m = *impl_;
  m.throw_if_poisoned();
  check_tensor(tensor, m.device, "all_reduce", "the");
  const auto d = comm::OpDesc::of("all_reduce", comm::reduce_op_name(opts.op), tensor);
  const uint64_t seq = m.monitor->issue(d);
  const auto type = static_cast<ncclDataType_t>(nccl_dtype(tensor.scalar_type()));
  const auto op = static_cast<ncclRedOp_t>(nccl_reduce_op(opts.op));
  void* p = tensor.data_ptr();
  const size_t n = static_cast<size_t>(tensor.numel());
  return m.enqueue(seq, d.text(), opts.timeout_s, {tensor}, false,
                   [=](ncclComm_t c, cudaStream_t s) { return ncclAllReduce(p, p, n, type, op, c, s); });
}

std::shared_ptr<Work> NcclCommunicator::reduce_scatter(const at::Tensor& input, at::Tensor& output,
                                                       const ReduceScatterOptions& opts) {
  Impl& m = *impl_;
  m.throw_if_poisoned();
  check_chunked(input, output, m.size, m.device, "reduce_scatter", input, output,
                "input must hold world_size x output");
  const auto d = comm::OpDesc::of("reduce_scatter", comm::reduce_op_name(opts.op), input);
  const uint64_t seq = m.monitor->issue(d);
  const auto type = static_cast<ncclDataType_t>(nccl_dtype(input.scalar_type()));
  const auto op = static_cast<ncclRedOp_t>(nccl_reduce_op(opts.op));
  const void* in = input.data_ptr();
  void* out = output.data_ptr();
  const size_t n = static_cast<size_t>(output.numel());
  return m.enqueue(seq, d.text(), opts.timeout_s, {input, output}, false,
                   [=](ncclComm_t c, cudaStream_t s) {
                     return ncclReduceScatter(in, out, n, type, op, c, s);
                   });
}

std::shared_ptr<Work> NcclCommunicator::all_gather(const at::Tensor& input, at::Tensor& output,
                                                   const AllGatherOptions& opts) {
  Impl& m = *impl_;
  m.throw_if_poisoned();
  check_chunked(input, output, m.size, m.device, "all_gather", output, input,
                "output must hold world_size x input");
  const auto d = comm::OpDesc::of("all_gather", "", input);
  const uint64_t seq = m.monitor->issue(d);
  const auto type = static_cast<ncclDataType_t>(nccl_dtype(input.scalar_type()));
  const void* in = input.data_ptr();
  void* out = output.data_ptr();
  const size_t n = static_cast<size_t>(input.numel());
  return m.enqueue(seq, d.text(), opts.timeout_s, {input, output}, false,
                   [=](ncclComm_t c, cudaStream_t s) { return ncclAllGather(in, out, n, type, c, s); });
}

std::shared_ptr<Work> NcclCommunicator::broadcast(at::Tensor& tensor, const BroadcastOptions& opts) {
  Impl& m = *impl_;
  m.throw_if_poisoned();
  check_tensor(tensor, m.device, "broadcast", "the");
  TR_CHECK(opts.root >= 0 && opts.root < m.size, kBackend, ": broadcast: root ", opts.root,
           " is not a rank of group ", m.name, " (world_size ", m.size, ")");
  const auto d = comm::OpDesc::of("broadcast", detail::cat("root ", opts.root), tensor);
  const uint64_t seq = m.monitor->issue(d);
  const auto type = static_cast<ncclDataType_t>(nccl_dtype(tensor.scalar_type()));
  void* p = tensor.data_ptr();
  const size_t n = static_cast<size_t>(tensor.numel());
  const int root = opts.root;
  return m.enqueue(seq, d.text(), opts.timeout_s, {tensor}, false,
                   [=](ncclComm_t c, cudaStream_t s) { return ncclBroadcast(p, p, n, type, root, c, s); });
}

std::shared_ptr<Work> NcclCommunicator::send(const at::Tensor& tensor,
                                             const PointToPointOptions& opts) {
  Impl& m = *impl_;
  m.throw_if_poisoned();
  check_tensor(tensor, m.device, "send", "the");
  TR_CHECK(opts.peer >= 0 && opts.peer < m.size && opts.peer != m.rank, kBackend, ": send to rank ",
           opts.peer, ": not another rank of group ", m.name, " (world_size ", m.size, ")");
  TR_CHECK(opts.tag >= 0, kBackend, ": send: tag must be >= 0, got ", opts.tag);
  const auto type = static_cast<ncclDataType_t>(nccl_dtype(tensor.scalar_type()));
  const void* p = tensor.data_ptr();
  const size_t n = static_cast<size_t>(tensor.numel());
  const int peer = opts.peer;
  return m.enqueue(0, detail::cat("send to rank ", peer, " (", tensor.numel(), " x ",
                                  comm::dtype_name(tensor.scalar_type()), ")"),
                   opts.timeout_s, {tensor}, false,
                   [=](ncclComm_t c, cudaStream_t s) { return ncclSend(p, n, type, peer, c, s); });
}

std::shared_ptr<Work> NcclCommunicator::recv(at::Tensor& tensor, const PointToPointOptions& opts) {
  Impl& m = *impl_;
  m.throw_if_poisoned();
  check_tensor(tensor, m.device, "recv", "the");
  TR_CHECK(opts.peer >= 0 && opts.peer < m.size && opts.peer != m.rank, kBackend,
           ": recv from rank ", opts.peer, ": not another rank of group ", m.name, " (world_size ",
           m.size, ")");
  TR_CHECK(opts.tag >= 0, kBackend, ": recv: tag must be >= 0, got ", opts.tag);
  const auto type = static_cast<ncclDataType_t>(nccl_dtype(tensor.scalar_type()));
  void* p = tensor.data_ptr();
  const size_t n = static_cast<size_t>(tensor.numel());
  const int peer = opts.peer;
  return m.enqueue(0, detail::cat("recv from rank ", peer, " (", tensor.numel(), " x ",
                                  comm::dtype_name(tensor.scalar_type()), ")"),
                   opts.timeout_s, {tensor}, false,
                   [=](ncclComm_t c, cudaStream_t s) { return ncclRecv(p, n, type, peer, c, s); });
}

std::shared_ptr<Work> NcclCommunicator::barrier(const BarrierOptions& opts) {
  Impl& m = *impl_;
  m.throw_if_poisoned();
  const comm::OpDesc d{"barrier", "", c10::ScalarType::Undefined, 0, 0};
  const uint64_t seq = m.monitor->issue(d);
  at::Tensor one = at::ones({1}, at::TensorOptions().dtype(at::kInt).device(
                                     at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(m.device))));
  void* p = one.data_ptr();
  return m.enqueue(seq, d.text(), opts.timeout_s, {one}, /*host_wait=*/true,
                   [=](ncclComm_t c, cudaStream_t s) {
                     return ncclAllReduce(p, p, 1, ncclInt32, ncclSum, c, s);
                   });
}

std::shared_ptr<Communicator> NcclCommunicator::new_group(const std::vector<int>& ranks) {
  Impl& m = *impl_;
  m.throw_if_poisoned();
  const std::string sub = m.id.empty() ? std::to_string(++m.groups_made)
                                       : detail::cat(m.id, ".", ++m.groups_made);
  std::vector<int> global;
  int mine = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    TR_CHECK(r >= 0 && r < m.size, kBackend, ": new_group: rank ", r, " is not in group ",
             m.name, " (world_size ", m.size, ")");
    global.push_back(m.global_ranks[r]);
    if (r == m.rank) mine = static_cast<int>(i);
  }
  if (mine < 0) return nullptr;
  const std::string label = "[" + comm::join_ranks(global) + "]";
  return std::make_shared<NcclCommunicator>(m.store, m.settings, sub, sub + " " + label,
                                            std::move(global), mine, m.device);
}

}  // namespace trainrun::plugins::cuda
