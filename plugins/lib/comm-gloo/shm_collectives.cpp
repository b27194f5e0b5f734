#include "shm_collectives.hpp"

#include <ATen/ATen.h>
#include <trainrun/collectives/ring_all_gather.hpp>
#include <trainrun/error.hpp>

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>

#include "shm.hpp"

namespace trainrun::plugins::shm {
namespace {

using v1::Error;
using v1::ReduceOp;
using v1::detail::cat;

int mod(int x, int n) { return ((x % n) + n) % n; }

// The ops of one step; shared with their done callbacks, which may run on another thread
// after a failed step has returned (the communicator is aborted then, which ends them).
struct StepState {
  std::atomic<int> remaining{0};
  std::mutex mu;
  std::exception_ptr error;
};

// One ring step: sends `send` to the right neighbour and receives `recv` from the left one
// (combining it into `recv` with `reduce` when set), driving the transport on this thread
// until both are done. An undefined or empty tensor skips that half: both ends compute the
// same segment bounds, so they skip the same messages.
void step(const CollectiveContext& c, const at::Tensor& send, const at::Tensor& recv,
          std::optional<ReduceOp> reduce, const char* phase, int s) {
  const int right_pos = (c.rank + 1) % c.size, left_pos = (c.rank + c.size - 1) % c.size;
  const int right = c.ring.empty() ? right_pos : c.ring[right_pos];
  const int left = c.ring.empty() ? left_pos : c.ring[left_pos];
  auto state = std::make_shared<StepState>();
  auto make = [&](const at::Tensor& t, bool is_send) {
    Op o;
    o.tensor = t;
    o.tag = c.tag;
    o.order_text = c.order_text;
    if (!is_send) o.reduce = reduce;
    o.deadline = c.deadline + std::chrono::seconds(1);
    o.timeout_s = c.timeout_s;
    o.text = cat(c.text, ": ", phase, " step ", s, ", ", is_send ? "send to" : "recv from",
                 " group rank ", is_send ? right : left);
    o.done = [state](std::exception_ptr e) {
      if (e) {
        std::lock_guard<std::mutex> g(state->mu);
        if (!state->error) state->error = e;
      }
      state->remaining.fetch_sub(1, std::memory_order_acq_rel);
    };
    return o;
  };
  const bool has_recv = recv.defined() && recv.numel() > 0;
  const bool has_send = send.defined() && send.numel() > 0;
  state->remaining = static_cast<int>(has_recv) + static_cast<int>(has_send);
  if (state->remaining == 0) return;
  // The receive first: the left neighbour's send may already be waiting for it.
  if (has_recv) c.transport->post(false, left, make(recv, false));
  if (has_send) c.transport->post(true, right, make(send, true));
  c.transport->wait_until([&] { return state->remaining.load(std::memory_order_acquire) == 0; },
                          c.deadline);
  // The ops stay posted; the caller's failure handling aborts the transport, which ends them.
  if (state->remaining.load(std::memory_order_acquire) != 0)
    throw CollectiveTimeout(cat(c.text, ": ", phase, " step ", s, " timed out after ",
                                c.timeout_s, " s"));
  std::lock_guard<std::mutex> g(state->mu);
  if (state->error) std::rethrow_exception(state->error);
}

}  // namespace

void all_reduce(const CollectiveContext& c, at::Tensor& tensor, ReduceOp op,
                const std::function<void(at::Tensor&)>& between) {
  const int N = c.size, r = c.rank;
  if (tensor.numel() == 0) return;
  at::Tensor flat = tensor.view(-1);
  if (N == 1) {
    if (between) between(flat);
    return;
  }
  const int64_t n = flat.numel();
  auto seg = [&](int j) {
    auto [b, e] = v1::ring::segment(n, N, mod(j, N));
    return flat.slice(0, b, e);
  };
  // Reduce-scatter: after N - 1 steps rank r holds the reduced segment r + 1.
  for (int s = 0; s < N - 1; ++s) step(c, seg(r - s), seg(r - s - 1), op, "reduce-scatter", s);
  if (between) {
    at::Tensor mine = seg(r + 1);
    if (mine.numel() > 0) between(mine);
  }
  // All-gather of the reduced segments.
  for (int s = 0; s < N - 1; ++s) step(c, seg(r + 1 - s), seg(r - s), std::nullopt, "all-gather", s);
}

void reduce_scatter(const CollectiveContext& c, const at::Tensor& input, at::Tensor& output,
                    ReduceOp op) {
  const int N = c.size, r = c.rank;
  const int64_t k = output.numel();
  if (k == 0) return;
  at::Tensor out = output.view(-1);
  const at::Tensor source = input.view(-1);
  const bool in_place = output.data_ptr() ==
                        static_cast<const char*>(input.data_ptr()) + r * output.nbytes();
  auto chunk = [&](int j) { return source.slice(0, mod(j, N) * k, (mod(j, N) + 1) * k); };
  if (N == 1) {
    if (!in_place) out.copy_(chunk(r));
    return;
  }
  // Step s receives the partial sum of chunk r - s - 2 from the left, adds this rank's own
  // contribution to it, and passes it on at step s + 1; the last step's chunk is r itself,
  // accumulated straight into the output. Each input chunk is copied once, as Gloo's ring does.
  at::Tensor buffers[2];
  if (N > 2)
    for (auto& b : buffers) b = at::empty({k}, out.options());
  at::Tensor sending = chunk(r - 1);
  for (int s = 0; s < N - 1; ++s) {
    const int j = mod(r - s - 2, N);
    at::Tensor target = j == r ? out : buffers[s % 2];
    if (!(j == r && in_place)) target.copy_(chunk(j));
    step(c, sending, target, op, "reduce-scatter", s);
    sending = target;
  }
}

void all_gather(const CollectiveContext& c, const at::Tensor& input, at::Tensor& output) {
  const int N = c.size, r = c.rank;
  const int64_t k = input.numel();
  if (k == 0) return;
  at::Tensor out = output.view(-1);
  auto chunk = [&](int j) { return out.slice(0, mod(j, N) * k, (mod(j, N) + 1) * k); };
  at::Tensor mine = chunk(r);
  if (mine.data_ptr() != input.data_ptr()) mine.copy_(input.view(-1));
  for (int s = 0; s < N - 1; ++s) step(c, chunk(r - s), chunk(r - s - 1), std::nullopt, "all-gather", s);
}

}  // namespace trainrun::plugins::shm
