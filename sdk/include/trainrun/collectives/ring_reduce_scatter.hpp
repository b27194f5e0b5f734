#pragma once
// Ring reduce-scatter on Gloo's unbound buffers, used by the Gloo communicator
// (plugins/lib/comm-gloo/, for gloo-cpu and cuda's collectives = "gloo"). One algorithm, one
// file, as Gloo lays out its own; the transport only moves bytes, and the reduction kernel is the
// caller's (comm-common's). It lives with the SDK's other ring algorithms (ring.hpp,
// ring_all_gather.hpp) but, unlike them, is written against Gloo's context rather than a
// Communicator: including it needs Gloo's headers, so trainrun/trainrun.hpp does not.
#include <gloo/allreduce.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace trainrun::v1::gloo_ring {

// Not Gloo's ReduceScatterHalvingDoubling: its run() copies this rank's result to the start of
// its buffer while a send it issued from that same region may still be queued in the I/O thread
// (nothing orders the two), so the peer reduces overwritten values. Seen here at 2 ranks with
// 1000003 float64 per rank (rank 0's last ~9000 elements wrong) and at 7 ranks with 1025 per
// rank (every run); it also returns without waiting for its sends, so a freed buffer can be
// read afterwards. The ring below runs on Gloo's unbound buffers, as its all-reduce does.
//
// Ring reduce-scatter of input = [size][len] into output = [len], this rank's chunk. In step s
// rank r sends the partial sum of chunk (r - s - 1) to rank r + 1 and receives that of chunk
// (r - s - 2) from rank r - 1, adds its own input chunk to it, and forwards the result in the
// next step; the last chunk it receives is chunk r, summed over every rank, and goes straight
// to the output. Each rank sends size - 1 chunks, (size - 1) / size of its input, the least a
// reduce-scatter can (this is the first half of Gloo's ring all-reduce). As there, a chunk
// travels in segments of at most 1 MiB with two in flight, so adding one segment overlaps
// receiving the next. The input is only read;
// the scratch (kept by the caller between calls, so its pages are not faulted in every time)
// holds two incoming segments and, from 3 ranks on, two partial-sum chunks: one being sent
// while the next is computed. Every send is complete before its step ends, so nothing is
// written or freed while Gloo's I/O thread may still read it.
constexpr size_t kSegmentBytes = size_t(1) << 20;

template <class T>
void reduce_scatter(const std::shared_ptr<gloo::Context>& context, const T* input, T* output,
                    size_t len, gloo::AllreduceOptions::Func reduce, uint64_t slot,
                    std::chrono::milliseconds timeout, std::vector<unsigned char>& scratch) {
  const int size = context->size;
  const int rank = context->rank;
  if (size == 1) {
    if (output != input) std::memcpy(output, input, len * sizeof(T));
    return;
  }
  const size_t seg = std::max<size_t>(1, std::min(len, kSegmentBytes / sizeof(T)));
  const size_t segments = (len + seg - 1) / seg;
  auto seg_len = [&](size_t j) { return std::min(seg, len - j * seg); };
  const size_t partial_len = size > 2 ? 2 * len : 0;
  scratch.resize(std::max(scratch.size(), (2 * seg + partial_len) * sizeof(T)));
  T* incoming = reinterpret_cast<T*>(scratch.data());
  T* partial = incoming + 2 * seg;

  auto input_buf = context->createUnboundBuffer(const_cast<T*>(input), size * len * sizeof(T));
  auto incoming_buf = context->createUnboundBuffer(incoming, 2 * seg * sizeof(T));
  std::unique_ptr<gloo::transport::UnboundBuffer> partial_buf;
  if (partial_len) partial_buf = context->createUnboundBuffer(partial, partial_len * sizeof(T));
  auto chunk = [size](int c) { return static_cast<size_t>(((c % size) + size) % size); };
  const int next = (rank + 1) % size;
  const int prev = (rank + size - 1) % size;
  auto post_recv = [&](size_t j) {
    incoming_buf->recv(prev, slot, (j % 2) * seg * sizeof(T), seg_len(j) * sizeof(T));
  };

  for (int step = 0; step < size - 1; ++step) {
    // Step 0 forwards this rank's own chunk; later steps the partial sum of the step before.
    gloo::transport::UnboundBuffer* from = step == 0 ? input_buf.get() : partial_buf.get();
    const size_t from_elem = step == 0 ? chunk(rank - 1) * len : ((step - 1) % 2) * len;
    for (size_t j = 0; j < segments; ++j)
      from->send(next, slot, (from_elem + j * seg) * sizeof(T), seg_len(j) * sizeof(T));
    T* sum = step == size - 2 ? output : partial + (step % 2) * len;
    const T* own = input + chunk(rank - step - 2) * len;
    post_recv(0);
    if (segments > 1) post_recv(1);
    for (size_t j = 0; j < segments; ++j) {
      incoming_buf->waitRecv(timeout);
      reduce(sum + j * seg, own + j * seg, incoming + (j % 2) * seg, seg_len(j));
      if (j + 2 < segments) post_recv(j + 2);
    }
    for (size_t j = 0; j < segments; ++j) from->waitSend(timeout);
  }
}

}  // namespace trainrun::v1::gloo_ring
