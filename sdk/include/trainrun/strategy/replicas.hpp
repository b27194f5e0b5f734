#pragma once
// Setting up replicas of one model on every rank (what ddp, ring and any replicating strategy do
// first, as PyTorch's DistributedDataParallel does in its constructor): check that every rank
// built the same model, then make rank 0's values everyone's.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "trainrun/error.hpp"
#include "trainrun/interfaces.hpp"
#include "trainrun/strategy/strategy_helpers.hpp"

namespace trainrun::v1 {

namespace detail_replicas {
// Bytes per rank for one entry's description in the shape-check exchange.
constexpr int64_t kDescribeBytes = 1024;

// One entry of the shape check: what must be equal on every rank.
struct Entry {
  std::string kind;  // "parameter" | "buffer"
  std::string name;
  std::string details;  // "[64, 784] float32" (+ " frozen")
};

inline std::string shape_string(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

inline int64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  int64_t v;
  std::memcpy(&v, &h, sizeof v);
  return v == -1 ? 0 : v;  // -1 marks "no entry at this index"
}
}  // namespace detail_replicas

/// Checks that every rank of `comm` holds the same parameters (name, shape, dtype, trainable)
/// and buffers (name, shape, dtype), in the same order, with three small all-gathers (counts,
/// one 64-bit fingerprint per entry, then the first differing entry's description). Throws
/// ConfigError on every rank alike, naming `strategy` (e.g. "strategy 'ddp'"), the first
/// differing tensor, its index and what each side holds. `device`: where the communicator's
/// tensors live.
inline void check_same_model_on_all_ranks(Communicator& comm, c10::Device device,
                                          const std::string& strategy,
                                          const std::vector<NamedTensor>& params,
                                          const std::vector<NamedTensor>& buffers) {
  using detail_replicas::Entry;
  using detail_replicas::fnv1a;
  using detail_replicas::kDescribeBytes;
  using detail_replicas::shape_string;
  const int world_size = comm.world_size();
  std::vector<Entry> entries;
  for (const auto& p : params)
    entries.push_back({"parameter", p.name,
                       shape_string(p.tensor) + " " + dtype_name(p.tensor.scalar_type()) +
                           (p.tensor.requires_grad() ? "" : " (frozen)")});
  for (const auto& b : buffers)
    entries.push_back({"buffer", b.name,
                       shape_string(b.tensor) + " " + dtype_name(b.tensor.scalar_type())});
  const auto cpu_long = at::TensorOptions().dtype(at::kLong).device(device);

  // 1. How many entries each rank has (the fingerprint exchange needs one length).
  at::Tensor count = at::full({1}, static_cast<int64_t>(entries.size()), cpu_long);
  at::Tensor counts = at::empty({world_size}, cpu_long);
  comm.all_gather(count, counts)->wait();
  const at::Tensor counts_cpu = counts.cpu();
  const int64_t* c = counts_cpu.data_ptr<int64_t>();
  const int64_t longest = *std::max_element(c, c + world_size);

  // 2. One fingerprint per entry (name, kind, shape, dtype, trainable), -1 past the end.
  std::vector<int64_t> mine(static_cast<size_t>(longest), -1);
  for (size_t i = 0; i < entries.size(); ++i)
    mine[i] = fnv1a(entries[i].kind + "|" + entries[i].name + "|" + entries[i].details);
  at::Tensor fp = at::from_blob(mine.data(), {longest}, at::kLong).to(device).clone();
  at::Tensor all = at::empty({world_size * longest}, cpu_long);
  comm.all_gather(fp, all)->wait();
  const at::Tensor all_cpu = all.cpu().view({world_size, longest});
  const auto a = all_cpu.accessor<int64_t, 2>();
  int64_t first = -1;
  int other = -1;
  for (int64_t i = 0; i < longest && first < 0; ++i)
    for (int r = 1; r < world_size; ++r)
      if (a[r][i] != a[0][i]) {
        first = i, other = r;
        break;
      }
  if (first < 0) return;

  // 3. Every rank found the same index: exchange what each holds there, so the message
  //    (raised on every rank alike) shows both sides.
  std::string text;
  if (first < static_cast<int64_t>(entries.size())) {
    const Entry& e = entries[static_cast<size_t>(first)];
    text = e.kind + "\t" + e.name + "\t" + e.details;
  }
  text.resize(static_cast<size_t>(kDescribeBytes), '\0');
  at::Tensor desc = at::from_blob(text.data(), {kDescribeBytes}, at::kByte).to(device).clone();
  at::Tensor descs = at::empty({world_size * kDescribeBytes},
                               at::TensorOptions().dtype(at::kByte).device(device));
  comm.all_gather(desc, descs)->wait();
  const at::Tensor descs_cpu = descs.cpu();
  auto read = [&](int r) -> Entry {
    const char* p = reinterpret_cast<const char*>(descs_cpu.data_ptr<uint8_t>()) + r * kDescribeBytes;
    std::string s(p, strnlen(p, static_cast<size_t>(kDescribeBytes)));
    Entry e;
    if (s.empty()) return e;
    const size_t t1 = s.find('\t'), t2 = s.find('\t', t1 + 1);
    e.kind = s.substr(0, t1);
    e.name = s.substr(t1 + 1, t2 - t1 - 1);
    e.details = s.substr(t2 + 1);
    return e;
  };
  const Entry e0 = read(0), er = read(other);
  // Which kind and index: entries are parameters first, then buffers.
  const Entry& named = e0.kind.empty() ? er : e0;
  const int64_t n_params0 = static_cast<int64_t>(params.size());  // equal up to `first`
  const bool is_buffer = named.kind == "buffer";
  const int64_t index = is_buffer ? first - n_params0 : first;
  auto holds = [&](int r, const Entry& e) {
    if (e.kind.empty())
      return detail::cat("rank ", r, " has nothing at that position (", c[r],
                         " parameters and buffers in all, rank 0 has ", c[0], ")");
    if (e.kind != named.kind || e.name != named.name)
      return detail::cat("rank ", r, " has ", e.kind, " '", e.name, "' ", e.details);
    return detail::cat("rank ", r, " has ", e.details);
  };
  std::string others;
  int n_differ = 0;
  for (int r = 1; r < world_size; ++r) n_differ += a[r][first] != a[0][first];
  if (n_differ > 1) others = detail::cat(" (", n_differ - 1, " more rank(s) differ there too)");
  TR_CHECK_TYPED(ConfigError, false, strategy, ": ", named.kind, " '", named.name, "' (index ", index,
                 ") differs across ranks: ", holds(0, e0), ", ", holds(other, er), others,
                 ". Every rank must build the same model (same options, no rank-dependent "
                 "shapes)");
}

/// Copies rank `root`'s values of `tensors` into every other rank's, coalesced per dtype into
/// flat chunks of at most `chunk_bytes` (one broadcast per chunk instead of per tensor; dtypes
/// the communicators do not carry travel as bytes). Collective: every rank calls it with tensors
/// of the same shapes and dtypes in the same order (check_same_model_on_all_ranks first).
inline void broadcast_from(Communicator& comm, const std::vector<at::Tensor>& tensors, int root,
                           int64_t chunk_bytes = 64 << 20) {
  at::NoGradGuard no_grad;
  // Coalesced per dtype into flat chunks: one collective per chunk instead of per tensor.
  std::map<c10::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& t : tensors)
    if (t.numel() > 0) by_dtype[t.scalar_type()].push_back(t);
  for (auto& [dtype, list] : by_dtype) {
    size_t begin = 0;
    while (begin < list.size()) {
      size_t end = begin;
      int64_t bytes = 0;
      do {
        bytes += static_cast<int64_t>(list[end].nbytes());
        ++end;
      } while (end < list.size() && bytes + static_cast<int64_t>(list[end].nbytes()) <=
                                        chunk_bytes);
      std::vector<at::Tensor> flat_parts;
      for (size_t i = begin; i < end; ++i) flat_parts.push_back(list[i].detach().reshape({-1}));
      at::Tensor flat = at::cat(flat_parts);
      // A dtype the communicators do not carry (bool, int8, ...) travels as its bytes: a
      // broadcast does no arithmetic.
      at::Tensor wire = communicator_dtype(dtype) ? flat : flat.view(at::kByte);
      BroadcastOptions from;
      from.root = root;
      comm.broadcast(wire, from)->wait();
      if (comm.rank() != root) {
        int64_t off = 0;
        for (size_t i = begin; i < end; ++i) {
          const int64_t n = list[i].numel();
          list[i].copy_(flat.narrow(0, off, n).view(list[i].sizes()));
          off += n;
        }
      }
      begin = end;
    }
  }
}

/// broadcast_from with root 0.
inline void broadcast_from_rank0(Communicator& comm, const std::vector<at::Tensor>& tensors,
                                 int64_t chunk_bytes = 64 << 20) {
  broadcast_from(comm, tensors, 0, chunk_bytes);
}

/// What a replicating strategy does first at setup, on more than one rank:
/// check_same_model_on_all_ranks, then broadcast_from_rank0 of every parameter and buffer.
/// Nothing at world size 1. Throws as those two do.
inline void replicate_from_rank0(Communicator& comm, c10::Device device, const std::string& strategy,
                                 const std::vector<NamedTensor>& params,
                                 const std::vector<NamedTensor>& buffers) {
  if (comm.world_size() == 1) return;
  check_same_model_on_all_ranks(comm, device, strategy, params, buffers);
  std::vector<at::Tensor> state;
  for (const auto& p : params) state.push_back(p.tensor);
  for (const auto& b : buffers) state.push_back(b.tensor);
  broadcast_from_rank0(comm, state);
}

}  // namespace trainrun::v1
