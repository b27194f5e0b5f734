// The shared-memory channel's copies: a send fills the next free slot (or, single copy,
// publishes its address), a recv empties (or reduces from) the next full one and checks that
// the message is the one it expects. See shm.hpp for the protocol.
#include "shm_channel.hpp"

#include "reduce.hpp"

#include <trainrun/error.hpp>
#include <trainrun/error_text.hpp>
#include <trainrun/types.hpp>

#include <signal.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace trainrun::plugins::shm {

using v1::Error;
using v1::detail::cat;

namespace {

// FNV-1a, 64 bit: cheap, and two different descriptions colliding needs ~2^32 collectives.
uint64_t order_hash_of(const std::string& text) {
  if (text.empty()) return 0;
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
  return h ? h : 1;
}

// kill(pid, 0) still succeeds on a zombie (a killed rank its launcher has not reaped yet), so
// the process state is read too, every tenth check.
bool process_alive(int64_t pid, bool thorough) {
  if (pid <= 0) return true;
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  if (!thorough) return true;
  const std::string stat = read_line(cat("/proc/", pid, "/stat").c_str());
  const auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return true;
  const char state = stat[close + 2];
  return state != 'Z' && state != 'X';
}

// The header of chunk `index` of `op`'s message, its order text still empty (write_order).
SlotHeader chunk_header(const Op& op, int64_t offset, int64_t len, uint32_t index, uint32_t count,
                        uint64_t remote) {
  SlotHeader h{};
  h.total_bytes = static_cast<int64_t>(op.tensor.nbytes());
  h.offset = offset;
  h.len = len;
  h.tag = op.tag;
  h.dtype = static_cast<int32_t>(op.tensor.scalar_type());
  h.index = index;
  h.count = count;
  h.remote = remote;
  return h;
}

}  // namespace

void Transport::Channel::check(const Op& op, bool thorough) const {
  if (header->aborted.value.load(std::memory_order_acquire))
    throw Error(cat(op.text, " failed: ", peer_name,
                    " aborted its end of the shared-memory channel (its communicator failed)"));
  if (!process_alive(peer_pid, thorough))
    throw Error(cat(op.text, " failed: ", peer_name, " (pid ", peer_pid,
                    ") has exited while this rank waited ", waiting_text));
  if (std::chrono::steady_clock::now() >= op.deadline)
    throw Error(cat(op.text, " timed out after ", op.timeout_s, " s waiting ", waiting_text,
                    " (shared memory)"));
}

void Transport::Channel::write_order(SlotHeader& h, const Op& op) {
  if (op.order_text.empty()) return;
  h.order_hash = order_hash_of(op.order_text);
  const size_t n = std::min(op.order_text.size(), sizeof h.order_text - 1);
  std::memcpy(h.order_text, op.order_text.data(), n);
  h.order_text[n] = 0;
}

int Transport::Channel::step_send(Op& op) {
  const int64_t bytes = static_cast<int64_t>(op.tensor.nbytes());
  if (op.count == 0)
    op.count = bytes == 0 ? 1 : static_cast<uint32_t>((bytes + slot_bytes - 1) / slot_bytes);
  const uint32_t h = position;
  // Full when the receiver has released exactly h - slots.
  if (header->tail.value.load(std::memory_order_acquire) == h - slots) return -1;
  const uint32_t s = h & (slots - 1);
  if (cma && static_cast<uint64_t>(bytes) >= cma_min) {
    slot_headers[s] =
        chunk_header(op, 0, bytes, 0, 1, reinterpret_cast<uint64_t>(op.tensor.data_ptr()));
    write_order(slot_headers[s], op);
    position = h + 1;
    publish(header->head, position);
    op.count = 1;
    op.next = position;  // acked() once tail reaches it
    return 2;
  }
  const uint32_t i = op.next;
  const int64_t off = static_cast<int64_t>(i) * static_cast<int64_t>(slot_bytes);
  const int64_t len = std::min<int64_t>(static_cast<int64_t>(slot_bytes), bytes - off);
  slot_headers[s] = chunk_header(op, off, len, i, op.count, 0);
  if (i == 0) write_order(slot_headers[s], op);
  if (len > 0)
    std::memcpy(data + static_cast<size_t>(s) * slot_bytes,
                static_cast<const char*>(op.tensor.data_ptr()) + off, len);
  position = h + 1;
  publish(header->head, position);
  return ++op.next == op.count ? 1 : 0;
}

int Transport::Channel::step_recv(Op& op) {
  const uint32_t t = position;
  if (header->head.value.load(std::memory_order_acquire) == t) return -1;
  const uint32_t s = t & (slots - 1);
  const SlotHeader h = slot_headers[s];
  if (op.count == 0) {
    const int64_t bytes = static_cast<int64_t>(op.tensor.nbytes());
    const auto dtype = op.tensor.scalar_type();
    TR_CHECK(h.index == 0, op.text, " failed: the shared-memory channel from ", peer_name,
             " is out of step (chunk ", h.index, " of ", h.count, " where a message starts)");
    // Before the tag and size: a collective issued out of order usually differs in those
    // too, and its description says more. Messages of point-to-point ops carry none.
    if (!op.order_text.empty() && h.order_hash != 0 &&
        h.order_hash != order_hash_of(op.order_text)) {
      std::string theirs(h.order_text, strnlen(h.order_text, sizeof h.order_text));
      throw CollectiveMismatch(cat(op.text, " failed: ", peer_name, " sent a message of ", theirs,
                                   " where this rank runs ", op.order_text),
                               peer, std::move(theirs));
    }
    if (h.tag != op.tag || h.total_bytes != bytes || h.dtype != static_cast<int32_t>(dtype)) {
      const auto their = static_cast<c10::ScalarType>(h.dtype);
      const int64_t esize = static_cast<int64_t>(c10::elementSize(their));
      throw Error(cat(op.text, " failed: the next message ", peer_name, " sent to ", self_name,
                      " is ", v1::dtype_name(their), " x ", h.total_bytes / esize, ", ",
                      h.total_bytes, " B, tag ", h.tag, ", where this recv expects ",
                      v1::dtype_name(dtype), " x ", op.tensor.numel(), ", ", bytes, " B, tag ",
                      op.tag,
                      ". Between two ranks of one machine, send/recv go through shared "
                      "memory and are matched in posting order: the n-th recv from a peer must "
                      "match the n-th send of that peer to this rank in tag, dtype and size"));
    }
    op.count = h.count;
  }
  if (h.remote != 0) {
    // Single copy: one piece per step, straight from the sender's memory; the slot is
    // released (the sender's op completes) after the last piece.
    const int64_t done = static_cast<int64_t>(op.piece);
    const int64_t len = std::min<int64_t>(static_cast<int64_t>(cma_piece), h.len - done);
    char* dst = static_cast<char*>(op.tensor.data_ptr()) + done;
    if (!op.reduce) {
      read_remote(op, dst, h.remote + done, len);
    } else {
      if (staging.size() < static_cast<size_t>(len)) staging.resize(len);
      read_remote(op, staging.data(), h.remote + done, len);
      comm::reduce_bytes(dst, staging.data(), len, op.tensor.scalar_type(), *op.reduce);
    }
    op.piece += len;
    if (static_cast<int64_t>(op.piece) < h.len) return 0;
  } else if (h.len > 0) {
    char* dst = static_cast<char*>(op.tensor.data_ptr()) + h.offset;
    const char* src = data + static_cast<size_t>(s) * slot_bytes;
    if (!op.reduce)
      std::memcpy(dst, src, h.len);
    else
      comm::reduce_bytes(dst, src, h.len, op.tensor.scalar_type(), *op.reduce);
  }
  position = t + 1;
  publish(header->tail, position);
  return ++op.next == op.count ? 1 : 0;
}

void Transport::Channel::read_remote(const Op& op, char* dst, uint64_t src, int64_t len) const {
  while (len > 0) {
    iovec local{dst, static_cast<size_t>(len)};
    iovec remote{reinterpret_cast<void*>(src), static_cast<size_t>(len)};
    const ssize_t n = process_vm_readv(static_cast<pid_t>(peer_pid), &local, 1, &remote, 1, 0);
    if (n <= 0)
      throw Error(cat(op.text, " failed: reading ", peer_name, "'s memory (pid ", peer_pid,
                      ", single copy) failed: ", n < 0 ? std::strerror(errno) : "nothing read"));
    dst += n;
    src += static_cast<uint64_t>(n);
    len -= n;
  }
}

}  // namespace trainrun::plugins::shm
