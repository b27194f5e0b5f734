#include "cuda.hpp"

#include "backend_options.hpp"
#include "comm_common.hpp"
#include "cpu_threads.hpp"
#include "gloo_communicator.hpp"
#include "nccl.hpp"
#include "pending.hpp"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <trainrun/error.hpp>

#include <map>
#include <set>

namespace trainrun::plugins::cuda {

using namespace trainrun::v1;

namespace {

constexpr const char* kName = "cuda";

std::shared_ptr<Work> done() { return std::make_shared<CompletedWork>(); }

// A host copy of `t` (itself when already on the CPU). The copy waits for the current stream.
at::Tensor to_host(const at::Tensor& t) { return t.is_cpu() ? t : t.to(at::kCPU); }
void from_host(at::Tensor& t, const at::Tensor& host) {
  if (!t.is_cpu()) t.copy_(host);
}

// The staged operations that write a result end alike: the inner operation runs to completion,
// then the result goes back to the device tensor `t`.
std::shared_ptr<Work> finish(const std::shared_ptr<Work>& inner, double timeout_s, at::Tensor& t,
                             const at::Tensor& host) {
  inner->wait(timeout_s);
  from_host(t, host);
  return done();
}

}  // namespace

// --- host staging ----------------------------------------------------------------------------

HostStagingCommunicator::HostStagingCommunicator(std::shared_ptr<void> owner, Communicator& inner)
    : owner_(std::move(owner)), inner_(inner) {}

int HostStagingCommunicator::rank() const { return inner_.rank(); }
int HostStagingCommunicator::world_size() const { return inner_.world_size(); }

std::shared_ptr<Work> HostStagingCommunicator::all_reduce(at::Tensor& tensor,
                                                          const AllReduceOptions& opts) {
  at::Tensor h = to_host(tensor);
  return finish(inner_.all_reduce(h, opts), opts.timeout_s, tensor, h);
}

std::shared_ptr<Work> HostStagingCommunicator::reduce_scatter(const at::Tensor& input,
                                                              at::Tensor& output,
                                                              const ReduceScatterOptions& opts) {
  at::Tensor hi = to_host(input), ho = to_host(output);
  return finish(inner_.reduce_scatter(hi, ho, opts), opts.timeout_s, output, ho);
}

std::shared_ptr<Work> HostStagingCommunicator::all_gather(const at::Tensor& input,
                                                          at::Tensor& output,
                                                          const AllGatherOptions& opts) {
  at::Tensor hi = to_host(input), ho = to_host(output);
  return finish(inner_.all_gather(hi, ho, opts), opts.timeout_s, output, ho);
}

std::shared_ptr<Work> HostStagingCommunicator::broadcast(at::Tensor& tensor,
                                                         const BroadcastOptions& opts) {
  at::Tensor h = to_host(tensor);
  return finish(inner_.broadcast(h, opts), opts.timeout_s, tensor, h);
}

std::shared_ptr<Work> HostStagingCommunicator::send(const at::Tensor& tensor,
                                                    const PointToPointOptions& opts) {
  at::Tensor h = to_host(tensor);
  inner_.send(h, opts)->wait(opts.timeout_s);
  return done();
}

std::shared_ptr<Work> HostStagingCommunicator::recv(at::Tensor& tensor,
                                                    const PointToPointOptions& opts) {
  at::Tensor h = to_host(tensor);
  return finish(inner_.recv(h, opts), opts.timeout_s, tensor, h);
}

std::shared_ptr<Work> HostStagingCommunicator::barrier(const BarrierOptions& opts) {
  inner_.barrier(opts)->wait(opts.timeout_s);
  return done();
}

std::shared_ptr<Communicator> HostStagingCommunicator::new_group(const std::vector<int>& ranks) {
  std::shared_ptr<Communicator> inner = inner_.new_group(ranks);
  if (!inner) return nullptr;
  Communicator& ref = *inner;
  return std::make_shared<HostStagingCommunicator>(
      std::shared_ptr<void>(std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<Communicator>>>(
          owner_, std::move(inner))),
      ref);
}

// --- device selection ------------------------------------------------------------------------

int visible_devices(const std::string& context) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    // cudaGetDeviceCount's error stays sticky in this thread otherwise.
    (void)cudaGetLastError();
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw ConfigError(detail::cat(
        context, ": accelerator 'cuda': no CUDA device visible (cudaGetDeviceCount: ",
        e == cudaSuccess ? std::string("0 devices") : detail::cat(cudaGetErrorName(e), ": ",
                                                                  cudaGetErrorString(e)),
        visible ? detail::cat("; CUDA_VISIBLE_DEVICES=", visible) : std::string(),
        "); use plugin = \"cpu\", \"gloo-cpu\" or \"mpi\" on a machine without a GPU"));
  }
  return n;
}

std::string shared_device(const std::vector<int64_t>& device_ids, int local_world_size) {
  std::map<int64_t, int> first;
  const int n = std::min<int>(local_world_size, static_cast<int>(device_ids.size()));
  for (int r = 0; r < n; ++r) {
    auto [it, fresh] = first.emplace(device_ids[r], r);
    if (!fresh)
      return detail::cat("device ", device_ids[r], " for local ranks ", it->second, " and ", r);
  }
  return "";
}

// --- accelerator -----------------------------------------------------------------------------

void CudaAccelerator::declare_options(OptionSchema& schema) {
  comm::declare_threads_option(schema);
  schema.int_list("device_ids", {},
                  "CUDA device of each local rank (index = local rank); empty = the local rank");
  schema.choice("collectives", "nccl", {"nccl", "gloo"},
                "nccl: NCCL on the devices (one device per rank); gloo: Gloo's TCP collectives "
                "through host memory (how ranks share one GPU, which NCCL refuses)");
  comm::declare_backend_options(schema);
  schema.boolean("blocking_wait", false,
                 "nccl: Work.wait() also blocks the host until the operation is done (else only "
                 "the compute stream waits; the watchdog enforces timeout_s either way)");
}

CudaAccelerator::CudaAccelerator(const Options& options, const RunContext& ctx) {
  const std::string& where = options.context();
  collectives_ = options.get_string("collectives");
  const comm::BackendOptions backend = comm::backend_options(options);
  const std::vector<int64_t>& ids = options.get_int_list("device_ids");
  if (collectives_ == "nccl") {
    const std::string dup = shared_device(ids, ctx.local_world_size);
    TR_CHECK_TYPED(ConfigError, dup.empty(), where, ": device_ids gives ", dup,
                   ", but NCCL refuses two ranks on one GPU; use collectives = \"gloo\" to share "
                   "a device");
  }
  const int count = visible_devices(where);
  device_ = select_device(ids, ctx.local_rank, ctx.local_world_size, count,
                          [&](const std::string& m) { throw ConfigError(where + ": " + m); });
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_));
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device_) == cudaSuccess)
    device_text_ = detail::cat(prop.name, ", ", prop.totalGlobalMem >> 30, " GiB, sm_", prop.major,
                               prop.minor);
  threads_ = comm::apply_threads_option(options, ctx, kName);

  const double rendezvous_timeout_s = comm::rendezvous_timeout_from_environment();
  if (collectives_ == "gloo") {
    // comm-gloo's communicator with this accelerator's collective settings (shared memory and
    // the all-reduce algorithm as gloo-cpu's defaults); the threads were set above.
    GlooSettings gs{backend};
    gs.rendezvous_timeout_s = rendezvous_timeout_s;
    std::shared_ptr<GlooCommunicator> gloo = open_gloo_world(gs, ctx).communicator;
    Communicator& inner = *gloo;
    gloo_ = gloo;
    comm_ = std::make_shared<HostStagingCommunicator>(gloo_, inner);
    return;
  }
  NcclSettings s{backend};
  s.blocking_wait = options.get_bool("blocking_wait");
  s.rendezvous_timeout_s = rendezvous_timeout_s;
  const auto address = comm::store_address_from_environment();
  std::shared_ptr<c10d::Store> store;
  if (!address) {
    TR_CHECK_TYPED(ConfigError, ctx.world_size == 1, where, ": world_size ", ctx.world_size,
                   " needs MASTER_ADDR and MASTER_PORT (the rendezvous store); start the ranks "
                   "with the trainrun launcher or torchrun");
    store = std::make_shared<c10d::HashStore>();
  } else {
    store = comm::open_store(*address, ctx.rank, ctx.world_size, rendezvous_timeout_s);
  }
  std::vector<int> world(ctx.world_size);
  for (int r = 0; r < ctx.world_size; ++r) world[r] = r;
  comm_ = std::make_shared<NcclCommunicator>(std::move(store), s, "", "world", std::move(world),
                                             ctx.rank, device_);
}

CudaAccelerator::~CudaAccelerator() {
  // The communicator (its watchdog, its NCCL communicator) goes before the Gloo communicator.
  comm_.reset();
  gloo_.reset();
}

c10::Device CudaAccelerator::device() const {
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_));
}

MemoryStats CudaAccelerator::memory_stats() const {
  MemoryStats m;
  const auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device_));
  const auto& a = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  m.current_bytes = a.current;
  m.peak_bytes = a.peak;
  size_t free = 0, total = 0;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  if (cudaMemGetInfo(&free, &total) == cudaSuccess) m.total_bytes = static_cast<int64_t>(total);
  return m;
}

std::string CudaAccelerator::describe() const {
  const std::string via = collectives_ == "nccl"
                              ? detail::cat("nccl ", NcclCommunicator::nccl_version())
                              : std::string("gloo via host memory");
  return detail::cat("cuda:", device_, " (", device_text_, "), ", via, ", rank ", comm_->rank(),
                     " of ", comm_->world_size(), ", ", v1::cpu::describe(threads_));
}

}  // namespace trainrun::plugins::cuda
