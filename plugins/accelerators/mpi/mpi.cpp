// MpiCommunicator: each operation checked, numbered by the group's Monitor and mapped onto its
// nonblocking MPI call (mpi_ops.cpp starts and completes them), and new_group. The process's MPI
// library is mpi_runtime.cpp's, the accelerator mpi_accelerator.cpp's.
#include "mpi.hpp"

#include <trainrun/error.hpp>

#include <ATen/Functions.h>
#include <ATen/MemoryOverlap.h>

#include <algorithm>
#include <climits>
#include <set>

#include "mpi_detail.hpp"
#include "reduce.hpp"

namespace trainrun::plugins {

using namespace trainrun::v1;

namespace mpi_detail {

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

int mpi_count(int64_t numel, const char* op) {
  TR_CHECK(numel <= INT_MAX, "mpi: ", op, ": ", numel,
           " elements per rank; MPI counts are 32-bit (at most ", INT_MAX,
           " elements per operation): split the tensor");
  return static_cast<int>(numel);
}

std::string list_text(const std::vector<int>& v) { return "[" + comm::join_ranks(v) + "]"; }

void attach_monitor(Group& g) {
  auto peers = comm::rendezvous(*g.store, g.prefix + "rdzv/", g.rank, g.size, g.options.timeout_s,
                                detail::cat(kBackend, " ", g.name));
  g.monitor =
      comm::open_monitor(g.store, {kBackend, g.name, g.prefix, g.rank, g.size, g.global_ranks},
                         g.options, std::move(peers));
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

}  // namespace mpi_detail

using namespace mpi_detail;

// --- communicator ----------------------------------------------------------------------------

MpiCommunicator::MpiCommunicator(std::shared_ptr<Group> group) : group_(std::move(group)) {}
MpiCommunicator::~MpiCommunicator() = default;
int MpiCommunicator::rank() const { return group_->rank; }
int MpiCommunicator::world_size() const { return group_->size; }

std::shared_ptr<Work> MpiCommunicator::all_reduce(at::Tensor& tensor,
                                                  const AllReduceOptions& opts) {
  comm::check_tensor(tensor, kBackend, "all_reduce", "the");
  const int count = mpi_count(tensor.numel(), "all_reduce");
  auto& g = group_;
  const MPI_Datatype type = datatype_of(tensor.scalar_type());
  const MPI_Op op = op_of(*g->rt, opts.op, tensor.scalar_type());
  std::function<void(const MPI_Status&)> after;
  if (opts.op == ReduceOp::Avg)
    after = [tensor, n = g->size](const MPI_Status&) mutable { comm::divide_in_place(tensor, n); };
  void* data = tensor.data_ptr();
  return start_collective(
      g, comm::OpDesc::of("all_reduce", comm::reduce_op_name(opts.op), tensor), opts.timeout_s,
      count == 0, "MPI_Iallreduce",
      [&](MPI_Request* r) {
        return MPI_Iallreduce(MPI_IN_PLACE, data, count, type, op, g->comm, r);
      },
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
        if (avg) comm::divide_in_place(output, n);
      };
  const void* send = input.data_ptr();
  void* recv = result.data_ptr();
  return start_collective(
      g, comm::OpDesc::of("reduce_scatter", comm::reduce_op_name(opts.op), input), opts.timeout_s,
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
      g, comm::OpDesc::of("all_gather", "", input), opts.timeout_s, count == 0, "MPI_Iallgather",
      [&](MPI_Request* r) {
        return MPI_Iallgather(send, count, type, recv, count, type, g->comm, r);
      },
      {source, output}, nullptr);
}

std::shared_ptr<Work> MpiCommunicator::all_to_all(const at::Tensor& input, at::Tensor& output,
                                                  const AllToAllOptions& opts) {
  auto& g = group_;
  const AllToAllParts parts = check_all_to_all(input, output, opts, g->size, kBackend);
  // counts and displacements in bytes (send, send at, receive, receive at), alive until the
  // request completes.
  at::Tensor layout = at::empty({4, g->size}, at::kInt);
  auto* v = layout.data_ptr<int>();
  for (int r = 0; r < g->size; ++r) {
    const auto i = static_cast<size_t>(r);
    for (const auto [row, value] : {std::pair<int, int64_t>{0, parts.input_bytes[i]},
                                    {1, parts.input_offsets[i]},
                                    {2, parts.output_bytes[i]},
                                    {3, parts.output_offsets[i]}})
      v[row * g->size + r] = mpi_count(value, "all_to_all (bytes)");
  }
  const comm::OpDesc desc = comm::OpDesc::of_uneven("all_to_all", input);
  const void* send = input.data_ptr();
  void* recv = output.data_ptr();
  return start_collective(
      g, desc, opts.timeout_s, false, "MPI_Ialltoallv",
      [&](MPI_Request* r) {
        return MPI_Ialltoallv(send, v, v + g->size, MPI_BYTE, recv, v + 2 * g->size,
                              v + 3 * g->size, MPI_BYTE, g->comm, r);
      },
      {input, output, layout}, nullptr);
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
      g, comm::OpDesc::of("broadcast", detail::cat("root ", root), tensor), opts.timeout_s,
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
  work->timeout_s = opts.timeout_s > 0 ? opts.timeout_s : g->options.timeout_s;
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
  track_posted(*g, work, rc);
  return std::make_shared<MpiWork>(g, work);
}

// An MPI_Ibarrier issued as the collective `desc`: barrier(), and new_group's agreement.
std::shared_ptr<Work> start_barrier(const std::shared_ptr<Group>& g, const comm::OpDesc& desc,
                                    double timeout_s) {
  return start_collective(
      g, desc, timeout_s, false, "MPI_Ibarrier",
      [&](MPI_Request* r) { return MPI_Ibarrier(g->comm, r); }, {}, nullptr);
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
  return start_barrier(group_, desc, opts.timeout_s);
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
  start_barrier(g, desc, 0)->wait();

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
  child->options = g->options;
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

}  // namespace trainrun::plugins
