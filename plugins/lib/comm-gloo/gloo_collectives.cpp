// GlooCommunicator's collectives, each mapped onto an algorithm: the shared-memory rings
// (shm_collectives.hpp) when every rank of the group shares this machine, the two-level
// all-reduce when the group spans machines evenly, else Gloo's own over TCP.
#include <trainrun/collectives/all_to_all.hpp>
#include <trainrun/collectives/ring_reduce_scatter.hpp>
#include <trainrun/error.hpp>

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/types.h>

#include "gloo_communicator_impl.hpp"
#include "reduce.hpp"

namespace trainrun::plugins {

using namespace trainrun::v1;

namespace {

// ---------------------------------------------------------------------------------------------
// Element types and reductions

template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with the C++ type that has the tensor's dtype's layout. float16 and
// bfloat16 travel as c10's 16-bit types: Gloo's own float16 reductions are not exported from
// libgloo, and it has no bfloat16 at all, so both are reduced here, through float.
template <class F>
void dispatch(c10::ScalarType t, F&& f) {
  switch (t) {
    case c10::ScalarType::Float:
      return f(TypeTag<float>{});
    case c10::ScalarType::Double:
      return f(TypeTag<double>{});
    case c10::ScalarType::Half:
      return f(TypeTag<c10::Half>{});
    case c10::ScalarType::BFloat16:
      return f(TypeTag<c10::BFloat16>{});
    case c10::ScalarType::Int:
      return f(TypeTag<int32_t>{});
    case c10::ScalarType::Long:
      return f(TypeTag<int64_t>{});
    case c10::ScalarType::Byte:
      return f(TypeTag<uint8_t>{});
    default:
      TR_FAIL(kBackend, ": dtype ", comm::dtype_name(t), " is not supported");
  }
}

// Gloo's all-reduce of the contiguous CPU tensor `t` over `context` (Avg reduces as Sum; the
// caller divides).
void gloo_all_reduce(const std::shared_ptr<gloo::rendezvous::Context>& context, at::Tensor& t,
                     ReduceOp op, gloo::AllreduceOptions::Algorithm algorithm, uint32_t tag,
                     Millis timeout) {
  dispatch(t.scalar_type(), [&](auto type) {
    using T = typename decltype(type)::type;
    gloo::AllreduceOptions o(context);
    o.setOutput<T>(t.data_ptr<T>(), t.numel());
    o.setReduceFunction(comm::reduce_function<T>(op));
    o.setAlgorithm(algorithm);
    o.setTag(tag);
    o.setTimeout(timeout);
    gloo::allreduce(o);
  });
}

constexpr uint8_t kReduceScatterSlotPrefix = 0x71;  // unused by Gloo's collectives (0x01-0x08)

// Shared-memory collectives of at most this many bytes run on the calling thread when the worker
// is idle. Below about 1 MiB the two thread hand-offs of a queued operation (to the worker and
// back) cost as much as moving the data, and callers of small collectives (a loss, a norm, a
// flag) wait for them at once; larger ones stay on the worker so that they overlap the
// caller's work (ddp's buckets during backward).
constexpr int64_t kInlineBytes = 1 << 20;

}  // namespace

shm::CollectiveContext GlooCommunicator::Impl::shm_context(uint32_t seq, Millis timeout,
                                                           const std::string& text,
                                                           bool within_machine) {
  shm::CollectiveContext c;
  c.transport = shm.get();
  c.rank = within_machine ? node_position : rank;
  c.size = within_machine ? static_cast<int>(node_ring.size()) : size;
  if (within_machine) c.ring = node_ring;
  c.tag = -1 - static_cast<int>(seq & 0x3FFFFFFF);
  c.timeout_s = std::chrono::duration<double>(timeout).count();
  c.deadline = std::chrono::steady_clock::now() + timeout;
  c.text = detail::cat(kBackend, ": ", text,
                       within_machine ? " within this machine (shared memory) in group "
                                      : " over shared memory in group ",
                       name);
  if (settings.check_collectives) c.order_text = text;
  return c;
}

std::shared_ptr<Work> GlooCommunicator::all_reduce(at::Tensor& tensor,
                                                   const AllReduceOptions& opts) {
  auto& m = *impl_;
  comm::check_tensor(tensor, kBackend, "all_reduce", "the");
  const auto desc = comm::OpDesc::of("all_reduce", comm::reduce_op_name(opts.op), tensor);
  using Algorithm = GlooSettings::Algorithm;
  const auto algorithm = m.settings.allreduce_algorithm == Algorithm::Bcube
                             ? gloo::AllreduceOptions::Algorithm::BCUBE
                             : gloo::AllreduceOptions::Algorithm::RING;
  const bool over_shm = m.shm_collectives && m.settings.allreduce_algorithm == Algorithm::Auto;
  const bool two_levels = m.column && m.settings.allreduce_algorithm == Algorithm::Auto;
  return m.enqueue(
      desc, m.resolve_timeout(opts.timeout_s),
      [&m, tensor, op = opts.op, algorithm, over_shm, two_levels, text = desc.text()](
          uint32_t tag, Millis timeout) mutable {
        if (tensor.numel() == 0) return;
        if (over_shm) {
          shm::all_reduce(m.shm_context(tag, timeout, text), tensor, op);
        } else if (two_levels) {
          // Reduce-scatter within the machine over shared memory, all-reduce of
          // this rank's segment with its column over TCP, all-gather within the
          // machine: each byte crosses TCP once per machine, not once per rank.
          shm::all_reduce(m.shm_context(tag, timeout, text, true), tensor, op,
                          [&](at::Tensor& segment) {
                            gloo_all_reduce(m.column, segment, op,
                                            gloo::AllreduceOptions::Algorithm::RING, tag, timeout);
                          });
        } else {
          gloo_all_reduce(m.context, tensor, op, algorithm, tag, timeout);
        }
        if (op == ReduceOp::Avg) comm::divide_in_place(tensor, m.size);
      },
      over_shm && static_cast<int64_t>(tensor.nbytes()) <= kInlineBytes,
      over_shm && tensor.numel() > 0);
}

std::shared_ptr<Work> GlooCommunicator::reduce_scatter(const at::Tensor& input, at::Tensor& output,
                                                       const ReduceScatterOptions& opts) {
  auto& m = *impl_;
  comm::check_reduce_scatter(input, output, m.size, kBackend);
  const auto desc = comm::OpDesc::of("reduce_scatter", comm::reduce_op_name(opts.op), input);
  return m.enqueue(
      desc, m.resolve_timeout(opts.timeout_s),
      [&m, input, output, op = opts.op, text = desc.text()](uint32_t tag, Millis timeout) mutable {
        if (output.numel() == 0) return;
        // In place (output = this rank's chunk of the input, as NCCL allows) is
        // safe for both rings: that chunk is read last, in the step that writes the
        // output. Any other overlap would overwrite input the ring still has to read.
        const auto* in = static_cast<const char*>(input.data_ptr());
        const auto* out = static_cast<const char*>(output.data_ptr());
        const bool overlap = out < in + input.nbytes() && in < out + output.nbytes();
        const bool in_place = out == in + m.rank * output.nbytes();
        const at::Tensor source = overlap && !in_place ? input.clone() : input;
        if (m.shm_collectives) {
          shm::reduce_scatter(m.shm_context(tag, timeout, text), source, output, op);
          if (op == ReduceOp::Avg) comm::divide_in_place(output, m.size);
          return;
        }
        dispatch(input.scalar_type(), [&](auto t) {
          using T = typename decltype(t)::type;
          gloo_ring::reduce_scatter<T>(
              m.context, source.data_ptr<T>(), output.data_ptr<T>(),
              static_cast<size_t>(output.numel()), comm::reduce_function<T>(op),
              gloo::Slot::build(kReduceScatterSlotPrefix, tag), timeout, m.reduce_scatter_scratch);
        });
        if (op == ReduceOp::Avg) comm::divide_in_place(output, m.size);
      },
      m.shm_collectives && static_cast<int64_t>(input.nbytes()) <= kInlineBytes,
      m.shm_collectives && output.numel() > 0);
}

std::shared_ptr<Work> GlooCommunicator::all_gather(const at::Tensor& input, at::Tensor& output,
                                                   const AllGatherOptions& opts) {
  auto& m = *impl_;
  comm::check_all_gather(input, output, m.size, kBackend);
  const auto desc = comm::OpDesc::of("all_gather", "", input);
  return m.enqueue(
      desc, m.resolve_timeout(opts.timeout_s),
      [&m, input, output, text = desc.text()](uint32_t tag, Millis timeout) mutable {
        if (input.numel() == 0) return;
        if (m.shm_collectives) {
          shm::all_gather(m.shm_context(tag, timeout, text), input, output);
          return;
        }
        // Plain bytes: a gather does no arithmetic.
        gloo::AllgatherOptions o(m.context);
        o.setInput<uint8_t>(static_cast<uint8_t*>(input.data_ptr()), input.nbytes());
        o.setOutput<uint8_t>(static_cast<uint8_t*>(output.data_ptr()), output.nbytes());
        o.setTag(tag);
        o.setTimeout(timeout);
        gloo::allgather(o);
      },
      m.shm_collectives && static_cast<int64_t>(output.nbytes()) <= kInlineBytes,
      m.shm_collectives && input.numel() > 0);
}

std::shared_ptr<Work> GlooCommunicator::all_to_all(const at::Tensor& input, at::Tensor& output,
                                                   const v1::AllToAllOptions& opts) {
  auto& m = *impl_;
  const v1::AllToAllParts parts = v1::check_all_to_all(input, output, opts, m.size, kBackend);
  // Every peer on this machine: the parts through the shared-memory send/recv channels, 1.1 to
  // 4.7 times the busbw of Gloo's alltoallv over loopback TCP below 4 MiB at 2 ranks (and
  // 0.6-0.9 times MPICH's MPI_Alltoallv above it). Point-to-point messages are matched per pair
  // in posting order, so this needs no slot in the collective-order check.
  if (m.size > 1 && shm_peers() == m.size - 1) {
    v1::all_to_all_point_to_point(*this, input, output, parts, 0x2a2a, opts.timeout_s);
    return std::make_shared<v1::CompletedWork>();
  }
  const comm::OpDesc desc = comm::OpDesc::of_uneven("all_to_all", input);
  return m.enqueue(
      desc, m.resolve_timeout(opts.timeout_s),
      [&m, input, output, parts](uint32_t tag, Millis timeout) mutable {
        if (m.size == 1) {
          if (input.numel() > 0) output.copy_(input);
          return;
        }
        // Gloo wants a buffer even where this rank sends or receives nothing.
        static uint8_t empty[1];
        auto* in = input.nbytes() > 0 ? static_cast<uint8_t*>(input.data_ptr()) : empty;
        auto* out = output.nbytes() > 0 ? static_cast<uint8_t*>(output.data_ptr()) : empty;
        gloo::AlltoallvOptions o(m.context);
        o.setInput<uint8_t>(in, parts.input_bytes);
        o.setOutput<uint8_t>(out, parts.output_bytes);
        o.setTag(tag);
        o.setTimeout(timeout);
        gloo::alltoallv(o);
      });
}

std::shared_ptr<Work> GlooCommunicator::broadcast(at::Tensor& tensor,
                                                  const BroadcastOptions& opts) {
  auto& m = *impl_;
  comm::check_tensor(tensor, kBackend, "broadcast", "the");
  TR_CHECK(opts.root >= 0 && opts.root < m.size, kBackend, ": broadcast in group ", m.name,
           ": root ", opts.root, " is not a rank of this group (world_size ", m.size, ")");
  const auto desc = comm::OpDesc::of("broadcast", "root " + std::to_string(opts.root), tensor);
  return m.enqueue(desc, m.resolve_timeout(opts.timeout_s),
                   [&m, tensor, root = opts.root](uint32_t tag, Millis timeout) {
                     if (tensor.numel() == 0) return;
                     gloo::BroadcastOptions o(m.context);
                     o.setOutput<uint8_t>(static_cast<uint8_t*>(tensor.data_ptr()),
                                          tensor.nbytes());
                     o.setRoot(root);
                     o.setTag(tag);
                     o.setTimeout(timeout);
                     gloo::broadcast(o);
                   });
}

std::shared_ptr<Work> GlooCommunicator::barrier(const BarrierOptions& opts) {
  auto& m = *impl_;
  comm::OpDesc desc{"barrier", "", c10::ScalarType::Undefined, 0, 0};
  return m.enqueue(desc, m.resolve_timeout(opts.timeout_s), [&m](uint32_t tag, Millis timeout) {
    gloo::BarrierOptions o(m.context);
    o.setTag(tag);
    o.setTimeout(timeout);
    gloo::barrier(o);
  });
}

}  // namespace trainrun::plugins
