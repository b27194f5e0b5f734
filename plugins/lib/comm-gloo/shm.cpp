// The shared-memory transport's progress engine (shm.hpp, "Progress"): posting ops, driving every
// channel from whichever thread waits, sleeping on a blocked channel's counter, the background
// thread for ops nobody waits for, and abort. The copies are in shm_channel.cpp, the set-up in
// shm_setup.cpp.
#include "shm.hpp"

#include <trainrun/error.hpp>
#include <trainrun/error_text.hpp>

#include <sched.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "shm_channel.hpp"

namespace trainrun::plugins::shm {

using v1::Error;
using v1::what_of;

namespace {

// A waiting thread polls with pause instructions for this long, then with sched_yield() between
// polls (which lets another rank on the same core run when ranks outnumber cores, and costs
// nothing when they do not) until kYieldNs, and only then sleeps on the futex. A sleep costs a
// wake-up of 50-100 us on this VM: a single-copy send waits for its receiver for as long as the
// copy takes (300 us for 4 MiB), and sleeping through that made the all-reduce bimodal (3.4 to
// 6.8 GB/s from run to run at 16 MiB, 2 ranks); polling for 2 ms made it 7.0-7.5.
// TRAINRUN_SHM_SPIN_US / TRAINRUN_SHM_YIELD_US override them (for measuring).
constexpr int64_t kDefaultSpinNs = 50'000;
constexpr int64_t kDefaultYieldNs = 2'000'000;
// Each sleep on the futex is this long at most, so that timeouts, a peer's death and this
// rank's own abort are noticed within a few milliseconds even without a wake.
constexpr long kSleepNs = 5'000'000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Progress

bool Transport::pass(std::vector<Finished>& finished, bool check_liveness, int round) {
  bool moved = false;
  for (Channel* c : channels_) {
    if (!c->inflight.empty()) {
      Op& f = c->inflight.front();
      std::exception_ptr error;
      bool acked = false;
      try {
        if (aborted_.load(std::memory_order_relaxed))
          throw Error(f.text + " failed: the communicator was aborted");
        acked = c->acked(f);
        if (!acked && check_liveness) c->check(f, round % 10 == 0);
      } catch (const std::exception& e) {
        error = std::make_exception_ptr(Error(what_of(e)));
      }
      if (acked || error) {
        moved = true;
        finished.push_back({std::move(f), error});
        c->inflight.pop_front();
      }
    }
    Op* op = c->front();
    if (!op) continue;
    int r = -1;
    std::exception_ptr error;
    try {
      if (aborted_.load(std::memory_order_relaxed))
        throw Error(op->text + " failed: the communicator was aborted");
      r = c->step(*op);
      if (r < 0 && check_liveness) c->check(*op, round % 10 == 0);
    } catch (const CollectiveMismatch&) {
      error = std::current_exception();
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(Error(what_of(e)));
    }
    if (r < 0 && !error) continue;
    moved = true;
    if (r == 1 || error) finished.push_back({c->pop(), error});
    else if (r == 2) c->inflight.push_back(c->pop());
  }
  return moved;
}

bool Transport::progress(bool check_liveness, int round) {
  std::unique_lock<std::mutex> lk(progress_mu_, std::try_to_lock);
  if (!lk.owns_lock()) return false;
  std::vector<Finished> finished;
  bool moved = false;
  // Passes until nothing moves or an op ends (its waiter may want to act on it at once).
  while (pass(finished, check_liveness, round)) {
    moved = true;
    check_liveness = false;
    if (!finished.empty()) break;
  }
  lk.unlock();
  for (auto& f : finished) {
    pending_.fetch_sub(1, std::memory_order_acq_rel);
    auto done = std::move(f.op.done);
    f.op.tensor.reset();  // the caller may free the buffer once done() has run
    done(f.error);
  }
  return moved;
}

// Sleeps until the counter the channel of the oldest queued op waits on changes, or `ns` pass
// (500 us at most when several channels have ops: the oldest op is what a waiter usually waits
// for, but not always).
void Transport::sleep_on_blocked(long ns) {
  Channel* pick = nullptr;
  uint32_t expected = 0;
  int busy = 0;
  {
    std::unique_lock<std::mutex> lk(progress_mu_, std::try_to_lock);
    if (lk.owns_lock()) {
      uint64_t oldest = UINT64_MAX;
      for (Channel* c : channels_) {
        const Op* op = !c->inflight.empty() ? &c->inflight.front() : c->front();
        if (!op) continue;
        ++busy;
        if (op->seq < oldest) {
          oldest = op->seq;
          pick = c;
          expected = c->blocking_value();
        }
      }
    }
  }
  if (!pick) {
    // Nothing queued here (the op is still with gloo-cpu's worker) or another thread is
    // copying: wait for the next post instead.
    posted_sleepers_.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t p = posted_.load(std::memory_order_seq_cst);
    futex_wait(&posted_, p, std::min<long>(ns, 200'000));
    posted_sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    return;
  }
  if (busy > 1) ns = std::min<long>(ns, 500'000);
  Counter& c = pick->blocking_counter();
  // Dekker with publish(): either this sees the new value, or publish() sees sleepers > 0.
  c.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (c.value.load(std::memory_order_seq_cst) == expected && !aborted_)
    futex_wait(&c.value, expected, ns);
  c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

void Transport::wait_until(const std::function<bool()>& done,
                           std::chrono::steady_clock::time_point deadline) {
  static const int64_t spin_ns =
      static_cast<int64_t>(env_u64("TRAINRUN_SHM_SPIN_US", kDefaultSpinNs / 1000)) * 1000;
  static const int64_t yield_ns =
      static_cast<int64_t>(env_u64("TRAINRUN_SHM_YIELD_US", kDefaultYieldNs / 1000)) * 1000;
  waiting_.fetch_add(1, std::memory_order_acq_rel);
  int64_t idle_since = 0;  // 0: the last poll moved something
  int64_t idle = 0;        // ns since then, read every 16 polls
  int polls = 0, round = 0;
  while (!done()) {
    // Liveness (deadlines, a dead or aborted peer) is checked once polling is over.
    if (idle_since != 0 && (++polls & 15) == 0) idle = now_ns() - idle_since;
    const bool sleepy = idle >= yield_ns;
    if (progress(sleepy, round)) {
      idle_since = idle = 0;
      continue;
    }
    if (idle_since == 0) {
      idle_since = now_ns();
      polls = 0;
    }
    if (!sleepy) {
      if (idle < spin_ns) cpu_relax();
      else sched_yield();
      continue;
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    sleep_on_blocked(kSleepNs);
    ++round;
  }
  last_wait_ns_.store(now_ns(), std::memory_order_release);
  waiting_.fetch_sub(1, std::memory_order_acq_rel);
}

void Transport::background() {
  // Idle (nothing pending for 100 ticks): sleeps until post() wakes it. Otherwise ticks every
  // millisecond without being woken, so that a busy communicator pays no wake-up per post; on
  // each tick it drives the ops if no thread has been waiting on them for a millisecond.
  int quiet_ticks = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(bg_mu_);
      if (pending_.load() == 0 && (quiet_ticks >= 100 || bg_stopping_)) {
        if (bg_stopping_) return;
        bg_idle_.store(true);
        bg_cv_.wait(lk, [&] { return bg_stopping_ || pending_.load() > 0; });
        bg_idle_.store(false);
        quiet_ticks = 0;
        continue;
      }
      bg_cv_.wait_for(lk, std::chrono::milliseconds(1));
      if (pending_.load() == 0) {
        ++quiet_ticks;
        continue;
      }
      quiet_ticks = 0;
      if (!(bg_stopping_ && aborted_) &&
          (waiting_.load() > 0 ||
           now_ns() - last_wait_ns_.load(std::memory_order_acquire) < 1'000'000))
        continue;
    }
    // Drive until nothing is pending or a waiter takes over.
    int round = 0;
    while (pending_.load() > 0 && waiting_.load() == 0) {
      if (progress(true, round++)) continue;
      sleep_on_blocked(1'000'000);
    }
  }
}

void Transport::post(bool is_send, int peer, Op op) {
  Channel& c = is_send ? *out_.at(peer) : *in_.at(peer);
  op.seq = next_seq_.fetch_add(1, std::memory_order_relaxed);
  c.push(std::move(op));
  pending_.fetch_add(1, std::memory_order_acq_rel);
  if (!bg_started_.load(std::memory_order_acquire) || bg_idle_.load()) {
    std::lock_guard<std::mutex> g(bg_mu_);
    if (!bg_.joinable() && !bg_stopping_) {
      bg_ = std::thread([this] { background(); });
      bg_started_.store(true, std::memory_order_release);
    }
    bg_cv_.notify_one();
  }
  posted_.fetch_add(1, std::memory_order_seq_cst);
  if (posted_sleepers_.load(std::memory_order_seq_cst)) futex_wake(&posted_);
}

void Transport::abort() {
  aborted_ = true;
  for (Channel* c : channels_) {
    // The peer's thread may sleep on either word of this channel, as may this rank's own
    // waiters: all wake and see the flag.
    c->header->aborted.value.store(1, std::memory_order_seq_cst);
    futex_wake(&c->header->head.value);
    futex_wake(&c->header->tail.value);
  }
  posted_.fetch_add(1, std::memory_order_release);
  futex_wake(&posted_);
  std::lock_guard<std::mutex> g(bg_mu_);
  bg_cv_.notify_all();
}

void Transport::stop() {
  {
    std::lock_guard<std::mutex> g(bg_mu_);
    bg_stopping_ = true;
  }
  bg_cv_.notify_all();
  if (bg_.joinable()) bg_.join();
}

}  // namespace trainrun::plugins::shm