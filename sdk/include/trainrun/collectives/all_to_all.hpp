#pragma once
// All-to-all of uneven parts (ABI 1.13, interfaces.hpp's AllToAllCommunicator): the checks every
// backend shares, and v1::all_to_all(), which calls the communicator's own all_to_all where it
// has one (gloo-cpu: Gloo's alltoallv; mpi: MPI_Ialltoallv) and otherwise exchanges the parts
// over send/recv (every send and receive posted before any is waited on, so no order of
// arrival can deadlock).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "trainrun/error.hpp"
#include "trainrun/interfaces.hpp"

namespace trainrun::v1 {

/// The parts of one all_to_all in rows and in bytes, checked (check_all_to_all).
struct AllToAllParts {
  std::vector<int64_t> input_rows, output_rows;  ///< per rank
  int64_t row_bytes = 0;                         ///< bytes of one row (product of dims 1..)
  /// Byte offsets and counts per rank, for the backends that move bytes.
  std::vector<int64_t> input_offsets, input_bytes, output_offsets, output_bytes;
};

namespace detail {

inline std::vector<int64_t> all_to_all_splits(const std::vector<int64_t>& given, int64_t rows,
                                              int world_size, const std::string& backend,
                                              const char* which) {
  if (given.empty()) {
    TR_CHECK(rows % world_size == 0, backend, ": all_to_all: ", rows, " ", which,
             " rows do not split into ", world_size, " equal parts; give ", which, "_split_sizes");
    return std::vector<int64_t>(static_cast<size_t>(world_size), rows / world_size);
  }
  TR_CHECK(static_cast<int64_t>(given.size()) == world_size, backend, ": all_to_all: ", which,
           "_split_sizes has ", given.size(), " entries for ", world_size, " ranks");
  for (int64_t s : given)
    TR_CHECK(s >= 0, backend, ": all_to_all: ", which, "_split_sizes holds ", s, " (< 0)");
  const int64_t sum = std::accumulate(given.begin(), given.end(), int64_t{0});
  TR_CHECK(sum == rows, backend, ": all_to_all: ", which, "_split_sizes add up to ", sum,
           " rows, the ", which, " tensor has ", rows);
  return given;
}

}  // namespace detail

/// The preconditions of an all_to_all, identical on every rank's side: `input` and `output`
/// defined, contiguous, of one dtype, equal in every dimension but the first (at least 1-D),
/// not overlapping; the split sizes (AllToAllOptions) of world_size entries, >= 0, adding up to
/// the rows. Throws Error "<backend>: all_to_all: ..." naming the sizes. Whether rank p's
/// input_split_sizes[r] equals rank r's output_split_sizes[p] only the exchange can tell: a
/// backend reports a mismatch as its transport does (a size error or a timeout).
inline AllToAllParts check_all_to_all(const at::Tensor& input, const at::Tensor& output,
                                      const AllToAllOptions& opts, int world_size,
                                      const std::string& backend) {
  TR_CHECK(input.defined() && output.defined(), backend, ": all_to_all: undefined tensor");
  TR_CHECK(input.dim() >= 1 && output.dim() >= 1, backend,
           ": all_to_all: input and output must be at least 1-D, got ", input.sizes(), " and ",
           output.sizes());
  TR_CHECK(input.is_contiguous() && output.is_contiguous(), backend,
           ": all_to_all: input and output must be contiguous");
  TR_CHECK(input.scalar_type() == output.scalar_type(), backend, ": all_to_all: input is ",
           input.scalar_type(), ", output ", output.scalar_type());
  TR_CHECK(input.sizes().slice(1) == output.sizes().slice(1), backend, ": all_to_all: input ",
           input.sizes(), " and output ", output.sizes(), " differ in a dimension after the first");
  const auto* ib = static_cast<const char*>(input.data_ptr());
  const auto* ob = static_cast<const char*>(output.data_ptr());
  TR_CHECK(input.nbytes() == 0 || output.nbytes() == 0 ||
               !(ob < ib + input.nbytes() && ib < ob + output.nbytes()),
           backend, ": all_to_all: output overlaps input");
  AllToAllParts p;
  p.input_rows = detail::all_to_all_splits(opts.input_split_sizes, input.size(0), world_size,
                                           backend, "input");
  p.output_rows = detail::all_to_all_splits(opts.output_split_sizes, output.size(0), world_size,
                                            backend, "output");
  int64_t row = static_cast<int64_t>(input.element_size());
  for (int64_t d = 1; d < input.dim(); ++d) row *= input.size(d);
  p.row_bytes = row;
  int64_t in_at = 0, out_at = 0;
  for (int r = 0; r < world_size; ++r) {
    p.input_offsets.push_back(in_at);
    p.input_bytes.push_back(p.input_rows[static_cast<size_t>(r)] * row);
    p.output_offsets.push_back(out_at);
    p.output_bytes.push_back(p.output_rows[static_cast<size_t>(r)] * row);
    in_at += p.input_bytes.back();
    out_at += p.output_bytes.back();
  }
  return p;
}

/// The exchange of check_all_to_all's `parts` over `comm`'s send/recv with `tag`: every receive
/// and send posted before any is waited on, this rank's own part copied locally, empty parts
/// not sent. Blocks until done; throws what send/recv throw.
inline void all_to_all_point_to_point(Communicator& comm, const at::Tensor& input,
                                      at::Tensor& output, const AllToAllParts& p, int tag,
                                      double timeout_s) {
  const int n = comm.world_size(), me = comm.rank();
  std::vector<int64_t> in_at(1, 0), out_at(1, 0);
  for (int r = 0; r < n; ++r) {
    in_at.push_back(in_at.back() + p.input_rows[static_cast<size_t>(r)]);
    out_at.push_back(out_at.back() + p.output_rows[static_cast<size_t>(r)]);
  }
  const auto u = [](int r) { return static_cast<size_t>(r); };
  TR_CHECK(p.input_rows[u(me)] == p.output_rows[u(me)], comm.backend(), ": all_to_all: rank ", me,
           " sends itself ", p.input_rows[u(me)], " rows but expects ", p.output_rows[u(me)]);
  std::vector<std::shared_ptr<Work>> pending;
  std::vector<at::Tensor> received;  // the views recv writes into, alive until waited on
  for (int s = 1; s < n; ++s) {
    const int to = (me + s) % n, from = (me - s + n) % n;
    if (const int64_t c = p.output_rows[u(from)]; c > 0) {
      received.push_back(output.narrow(0, out_at[u(from)], c));
      pending.push_back(comm.recv(received.back(), PointToPointOptions{from, tag, timeout_s}));
    }
    if (const int64_t c = p.input_rows[u(to)]; c > 0)
      pending.push_back(
          comm.send(input.narrow(0, in_at[u(to)], c), PointToPointOptions{to, tag, timeout_s}));
  }
  if (p.input_rows[u(me)] > 0)
    output.narrow(0, out_at[u(me)], p.output_rows[u(me)])
        .copy_(input.narrow(0, in_at[u(me)], p.input_rows[u(me)]));
  for (auto& w : pending) w->wait();
}

/// all_to_all on any Communicator: its AllToAllCommunicator::all_to_all when it has one, else
/// all_to_all_point_to_point with `tag`. Blocks until done. Semantics and errors as
/// AllToAllCommunicator::all_to_all.
inline void all_to_all(Communicator& comm, const at::Tensor& input, at::Tensor& output,
                       const AllToAllOptions& opts = {}, int tag = 0x2a2a) {
  if (auto* a = dynamic_cast<AllToAllCommunicator*>(&comm)) {
    a->all_to_all(input, output, opts)->wait();
    return;
  }
  const AllToAllParts p = check_all_to_all(input, output, opts, comm.world_size(), comm.backend());
  all_to_all_point_to_point(comm, input, output, p, tag, opts.timeout_s);
}

}  // namespace trainrun::v1
