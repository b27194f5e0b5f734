#include "cpu.hpp"

#include "cpu_threads.hpp"

#include <trainrun/plugin.hpp>

namespace trainrun::plugins {

using namespace trainrun::v1;

namespace {

std::shared_ptr<Work> done() { return std::make_shared<CompletedWork>(); }

// The same preconditions a multi-rank backend has (Gloo and NCCL both need dense contiguous
// buffers on their device), so a world of one does not hide a bug that appears at world 2.
void check_tensor(const at::Tensor& t, const char* op, const char* role) {
  TR_CHECK(t.defined(), "local communicator: ", op, ": ", role, " tensor is undefined");
  TR_CHECK(t.device().is_cpu(), "local communicator: ", op, ": ", role,
           " tensor is on ", t.device(), ", expected the accelerator's device cpu");
  TR_CHECK(t.layout() == at::kStrided, "local communicator: ", op, ": ", role,
           " tensor must be dense (strided), got layout ", t.layout());
  TR_CHECK(t.is_contiguous(), "local communicator: ", op, ": ", role,
           " tensor must be contiguous (shape ", t.sizes(), ", strides ", t.strides(), ")");
  const auto d = t.scalar_type();
  TR_CHECK(d == at::kFloat || d == at::kDouble || d == at::kBFloat16 || d == at::kHalf ||
               d == at::kInt || d == at::kLong || d == at::kByte,
           "local communicator: ", op, ": ", role, " tensor has dtype ", d,
           "; supported: float32, float64, bfloat16, float16, int32, int64, uint8 (as the "
           "multi-process backends)");
}

// input holds world_size * n elements and output n (or the reverse for all_gather); with one
// rank both hold n, and the result is a plain copy.
void copy_world_of_one(const at::Tensor& input, at::Tensor& output, const char* op,
                       const char* layout_rule) {
  check_tensor(input, op, "input");
  check_tensor(output, op, "output");
  TR_CHECK(input.scalar_type() == output.scalar_type(), "local communicator: ", op,
           ": input dtype ", input.scalar_type(), " differs from output dtype ",
           output.scalar_type());
  TR_CHECK(input.numel() == output.numel(), "local communicator: ", op, ": ", layout_rule,
           " with world_size 1, but input has ", input.numel(), " elements and output ",
           output.numel());
  if (input.data_ptr() != output.data_ptr()) output.view(-1).copy_(input.view(-1));
}

}  // namespace

std::shared_ptr<Work> LocalCommunicator::all_reduce(at::Tensor& tensor,
                                                    const AllReduceOptions&) {
  // Sum/Min/Max of one tensor is itself, and Avg divides by world_size = 1.
  check_tensor(tensor, "all_reduce", "the");
  return done();
}

std::shared_ptr<Work> LocalCommunicator::reduce_scatter(const at::Tensor& input,
                                                        at::Tensor& output,
                                                        const ReduceScatterOptions&) {
  copy_world_of_one(input, output, "reduce_scatter",
                    "input must hold world_size * output.numel() elements");
  return done();
}

std::shared_ptr<Work> LocalCommunicator::all_gather(const at::Tensor& input, at::Tensor& output,
                                                    const AllGatherOptions&) {
  copy_world_of_one(input, output, "all_gather",
                    "output must hold world_size * input.numel() elements");
  return done();
}

std::shared_ptr<Work> LocalCommunicator::broadcast(at::Tensor& tensor,
                                                   const BroadcastOptions& opts) {
  check_tensor(tensor, "broadcast", "the");
  TR_CHECK(opts.root == 0, "local communicator: broadcast: root ", opts.root,
           " is not a rank of this group (world_size 1, only rank 0)");
  return done();
}

std::shared_ptr<Work> LocalCommunicator::send(const at::Tensor&,
                                              const PointToPointOptions& opts) {
  TR_FAIL("local communicator: send to rank ", opts.peer,
          ": there is no peer in a world of one process (world_size 1)");
}

std::shared_ptr<Work> LocalCommunicator::recv(at::Tensor&, const PointToPointOptions& opts) {
  TR_FAIL("local communicator: recv from rank ", opts.peer,
          ": there is no peer in a world of one process (world_size 1)");
}

std::shared_ptr<Work> LocalCommunicator::barrier(const BarrierOptions&) { return done(); }

std::shared_ptr<Communicator> LocalCommunicator::new_group(const std::vector<int>& ranks) {
  TR_CHECK(ranks.size() == 1 && ranks[0] == 0, "local communicator: new_group: ranks must be {0}",
           " (world_size 1), got ", ranks.size(), " rank(s)",
           ranks.empty() ? "" : detail::cat(" starting with ", ranks[0]));
  return std::make_shared<LocalCommunicator>(timeout_s_);
}

// --- accelerator -----------------------------------------------------------------------------


void CpuAccelerator::declare_options(OptionSchema& schema) {
  comm::declare_threads_option(schema);
  schema.duration("timeout_s", 600.0, "default timeout of collective operations", 0.0);
}

CpuAccelerator::CpuAccelerator(const Options& options, const RunContext& ctx)
    : comm_(options.get_seconds("timeout_s")) {
  // Each rank would otherwise train alone on its slice of the data and nobody would notice.
  TR_CHECK_TYPED(ConfigError, ctx.world_size == 1, options.context(),
                 ": accelerator 'cpu' connects no processes (its communicator is a world of one), "
                 "but this job has world_size ", ctx.world_size,
                 "; use a collective backend: plugin = \"gloo-cpu\" or \"mpi\"");
  threads_ = comm::apply_threads_option(options, ctx, "cpu");
}

std::string CpuAccelerator::describe() const {
  return detail::cat("cpu, ", v1::cpu::describe(threads_));
}

}  // namespace trainrun::plugins
