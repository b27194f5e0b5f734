// The Monitor (comm_common.hpp): per-group sequence numbers, the cross-rank collective-order
// check through the store, the stall inspector's watchdog, and the failure reports that name
// the ranks not arrived.
#include "comm_common.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <sstream>
#include <thread>

#include "comm_internal.hpp"

namespace trainrun::comm {

using namespace trainrun::v1;
using namespace internal;

namespace {
// The order check keeps one store key per slot, reused every kSlots collectives, so the store
// holds a bounded number of keys however long the run. Ranks never drift apart by that many
// collectives: a collective completes only once every rank has issued it (broadcast's root may
// run a few ahead).
constexpr uint64_t kSlots = 4096;
// Progress is published this long at most after it changes (a store write per rank per
// interval, however many collectives complete in it), and again every kRepublish while nothing
// changes, so that its age tells a live peer from a dead or cut-off one: a record older than
// kSilentAfter is a peer that stopped publishing.
constexpr double kPublishGap = 0.02;
constexpr double kRepublish = 0.9;
constexpr double kSilentAfter = 3.0;
// After a transport failure in which every peer seems to have issued the collective, a peer
// killed a moment ago still looks alive: its last record is fresh. The report looks again
// after kRecheck, when a live peer has republished (at most about a second ago) and a dead
// one's record is older than kRecheckSilent.
constexpr double kRecheck = 2.0;
constexpr double kRecheckSilent = 1.8;
}  // namespace

struct Monitor::Impl {
  std::shared_ptr<c10d::Store> store;
  Config cfg;
  std::vector<PeerIdentity> peers;

  std::mutex mu;
  uint64_t issued = 0;
  struct Pending {
    uint64_t seq;
    std::string text;
    Clock::time_point since;
  };
  std::deque<Pending> pending;
  uint64_t completed_seq = 0;
  std::string completed_text;
  std::vector<std::string> slot_value = std::vector<std::string>(kSlots);
  bool dirty = true;
  uint64_t warned_seq = 0;
  Clock::time_point warned_at;

  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stopping = false;
  bool changed = false;  // under stop_mu: progress changed, the watchdog publishes it
  std::thread watchdog;

  std::string status_key(int r) const { return cfg.prefix + "status/" + std::to_string(r); }

  std::string status_record() {
    std::ostringstream os;
    os << host_name() << kSep << getpid() << kSep << issued << kSep << completed_seq << kSep
       << completed_text << kSep << (pending.empty() ? 0 : pending.front().seq) << kSep
       << (pending.empty() ? "" : pending.front().text) << kSep << unix_ms();
    return os.str();
  }

  void publish() {
    std::string rec;
    {
      std::lock_guard<std::mutex> g(mu);
      rec = status_record();
      dirty = false;
    }
    store->set(status_key(cfg.rank), bytes_of(rec));
  }

  // Wakes the watchdog to publish a change (begin, finished): without it the record waited for
  // the next tick, up to a second, and peers' reports showed progress that old.
  void progress_changed() {
    if (cfg.world_size <= 1 || cfg.stall_warning_s <= 0) return;
    {
      std::lock_guard<std::mutex> g(stop_mu);
      // One wake-up per publication at most: at thousands of collectives a second, a wake-up
      // each (a futex call here, a context switch there) would cost more than the collectives.
      if (changed) return;
      changed = true;
    }
    stop_cv.notify_one();
  }

  // "rank 2 (host h, pid 5): last completed #16 all_reduce(...), pending none, heard 0.4 s ago"
  // for every peer that has not issued `seq` yet ("not arrived") and for every peer that issued
  // it but has published nothing for kSilentAfter (its record would be republished every
  // kRepublish: the peer is dead, or its host unreachable).
  // `failed`: for an operation that failed; otherwise for one still waiting (the stall warning).
  std::string missing_report(uint64_t seq, bool failed, double silent_after = kSilentAfter) const {
    std::string out, silent;
    int missing = 0, silent_count = 0;
    const bool republishing = cfg.stall_warning_s > 0;
    for (int r = 0; r < cfg.world_size; ++r) {
      if (r == cfg.rank) continue;
      const int global = r < static_cast<int>(cfg.global_ranks.size()) ? cfg.global_ranks[r] : r;
      const std::string who =
          "rank " + std::to_string(global) +
          (r < static_cast<int>(peers.size())
               ? " (host " + peers[r].host + ", pid " + std::to_string(peers[r].pid) + ")"
               : "");
      std::vector<std::string> f;
      if (store->check({status_key(r)})) f = split(string_of(store->get(status_key(r))), kSep);
      if (f.size() < 8) {
        out += (missing++ ? "; " : "") + who + ": no progress published yet";
        continue;
      }
      const uint64_t issued_r = std::strtoull(f[2].c_str(), nullptr, 10);
      const double heard = (unix_ms() - std::atoll(f[7].c_str())) / 1000.0;
      const bool gone_quiet = republishing && heard > silent_after;
      if (issued_r >= seq && !gone_quiet) continue;
      const std::string progress = who + ": last completed " +
                                   (f[3] == "0" ? std::string("none") : "#" + f[3] + " " + f[4]) +
                                   ", first pending " +
                                   (f[5] == "0" ? std::string("none") : "#" + f[5] + " " + f[6]) +
                                   ", last heard " + seconds_text(heard) + " ago";
      if (issued_r < seq)
        out += (missing++ ? "; " : "") + progress;
      else
        silent += (silent_count++ ? "; " : "") + progress;
    }
    if (missing == 0 && silent_count == 0)
      return failed ? "every peer has issued it (the transport failed; see the cause above)"
                    : "every peer has issued it: its data is still in transit (a slow or "
                      "congested link between the hosts?)";
    std::string report;
    if (missing > 0) report = "not arrived: " + out;
    if (silent_count > 0)
      report += std::string(missing > 0 ? "; " : "") +
                "issued it, then went silent (dead, or its host unreachable?): " + silent;
    return report;
  }

  void run_watchdog() {
    const double stall = cfg.stall_warning_s;
    // Progress is published at least once a second (so a peer can tell a live rank from a dead
    // one) and at once after it changes; the tick is finer when the warning threshold is short.
    const double tick = std::max(0.02, std::min(kRepublish, stall / 10.0));
    auto last_publish = Clock::now() - std::chrono::hours(1);
    for (;;) {
      {
        // Woken early by a change of progress, but never sooner than kPublishGap after the
        // last write: at thousands of collectives a second, the store sees one write per gap.
        std::unique_lock<std::mutex> lk(stop_mu);
        const auto since = Clock::now() - last_publish;
        if (since < millis(kPublishGap) &&
            stop_cv.wait_for(lk, millis(kPublishGap) - since, [this] { return stopping; }))
          return;
        if (stop_cv.wait_for(lk, millis(tick), [this] { return stopping || changed; }) && stopping)
          return;
        changed = false;
      }
      try {
        bool need;
        {
          std::lock_guard<std::mutex> g(mu);
          need = dirty || Clock::now() - last_publish > millis(kRepublish);
        }
        if (need) publish(), last_publish = Clock::now();
        uint64_t seq = 0;
        std::string text;
        double waited = 0;
        {
          std::lock_guard<std::mutex> g(mu);
          if (!pending.empty()) {
            seq = pending.front().seq;
            text = pending.front().text;
            waited = std::chrono::duration<double>(Clock::now() - pending.front().since).count();
            const bool again = warned_seq == seq && Clock::now() - warned_at < millis(stall);
            if (waited < stall || again)
              seq = 0;
            else
              warned_seq = seq, warned_at = Clock::now();
          }
        }
        if (seq) {
          const int global = cfg.rank < static_cast<int>(cfg.global_ranks.size())
                                 ? cfg.global_ranks[cfg.rank]
                                 : cfg.rank;
          std::ostringstream os;
          os << "trainrun " << cfg.backend << ": warning: rank " << global << ": " << text << " #"
             << seq << " in group " << cfg.group << " has waited " << seconds_text(waited) << "; "
             << missing_report(seq, false) << "\n";
          std::cerr << os.str() << std::flush;
        }
      } catch (const std::exception& e) {
        // The store lives in rank 0 or the launcher; when it is gone the job is ending anyway,
        // and the operation's own error says why. One line, then the inspector stops.
        std::cerr << "trainrun " << cfg.backend << ": stall inspector of group " << cfg.group
                  << " stopped: rendezvous store unreachable (" << what_of(e) << ")\n";
        return;
      }
    }
  }
};

Monitor::Monitor(std::shared_ptr<c10d::Store> store, Config config, std::vector<PeerIdentity> peers)
    : impl_(std::make_unique<Impl>()), config_(std::move(config)) {
  impl_->store = std::move(store);
  impl_->cfg = config_;
  impl_->peers = std::move(peers);
  if (config_.world_size > 1) {
    // Published once before any operation, so a failure in the first second does not report a
    // live peer as silent.
    try {
      impl_->publish();
    } catch (const std::exception&) {
    }
  }
  if (config_.world_size > 1 && config_.stall_warning_s > 0)
    impl_->watchdog = std::thread([this] { impl_->run_watchdog(); });
}

Monitor::~Monitor() {
  {
    std::lock_guard<std::mutex> g(impl_->stop_mu);
    impl_->stopping = true;
  }
  impl_->stop_cv.notify_all();
  if (impl_->watchdog.joinable()) impl_->watchdog.join();
}

uint64_t Monitor::begin(const OpDesc& op) {
  auto& m = *impl_;
  uint64_t seq;
  {
    std::lock_guard<std::mutex> g(m.mu);
    seq = ++m.issued;
    m.pending.push_back({seq, op.text(), Clock::now()});
    m.dirty = true;
  }
  m.progress_changed();
  return seq;
}

uint64_t Monitor::issue(const OpDesc& op) {
  const uint64_t seq = begin(op);
  check_order(seq, op);
  return seq;
}

void Monitor::check_order(uint64_t seq, const OpDesc& op) {
  if (!config_.check_order || config_.world_size <= 1) return;
  auto& m = *impl_;
  const std::string text = op.text();
  std::string expected;
  {
    std::lock_guard<std::mutex> g(m.mu);
    expected = m.slot_value[seq % kSlots];
  }
  // The first rank to reach slot `seq` writes "seq|rank|op" there (compare-and-set against
  // what the slot held kSlots collectives ago); every later rank gets that value back and
  // compares it with its own op. One store round trip per collective, no waiting on peers.
  const std::string desired =
      std::to_string(seq) + kSep + std::to_string(config_.rank) + kSep + text;
  std::string got;
  try {
    got = string_of(m.store->compareSet(config_.prefix + "order/" + std::to_string(seq % kSlots),
                                        bytes_of(expected), bytes_of(desired)));
  } catch (const std::exception& e) {
    TR_FAIL(config_.backend, ": ", text, " #", seq, " in group ", config_.group,
            ": the collective-order check cannot reach the rendezvous store: ", what_of(e));
  }
  const auto f = split(got, kSep);
  if (f.size() >= 3 && std::strtoull(f[0].c_str(), nullptr, 10) == seq && f[2] != text)
    TR_FAIL(mismatch(seq, op, std::atoi(f[1].c_str()), f[2]));
  std::lock_guard<std::mutex> g(m.mu);
  m.slot_value[seq % kSlots] = got;
}

std::string Monitor::mismatch(uint64_t seq, const OpDesc& op, int other,
                              const std::string& other_text) {
  auto global = [&](int r) {
    return r >= 0 && r < static_cast<int>(config_.global_ranks.size()) ? config_.global_ranks[r]
                                                                       : r;
  };
  const std::string msg = detail::cat(
      config_.backend, ": collective mismatch at #", seq, " in group ", config_.group, ": rank ",
      global(config_.rank), " issued ", op.text(), " but rank ", global(other), " issued ",
      other_text, " (every rank must issue the same collectives in the same order)");
  // A rank that cannot see the mismatch itself (it wrote the store slot first, or its own
  // messages matched) learns it from here when its operation fails (describe_failure),
  // instead of a bare transport error.
  try {
    impl_->store->set(config_.prefix + "mismatch", bytes_of(msg));
  } catch (const std::exception&) {
  }
  return msg;
}

void Monitor::finished(uint64_t seq) {
  auto& m = *impl_;
  {
    std::lock_guard<std::mutex> g(m.mu);
    while (!m.pending.empty() && m.pending.front().seq <= seq) {
      m.completed_seq = m.pending.front().seq;
      m.completed_text = m.pending.front().text;
      m.pending.pop_front();
    }
    m.dirty = true;
  }
  m.progress_changed();
}

void Monitor::publish_now() noexcept {
  try {
    impl_->publish();
  } catch (...) {
  }
}

std::string Monitor::describe_failure(uint64_t seq, const std::string& what) const {
  const auto& m = *impl_;
  std::string text;
  {
    std::lock_guard<std::mutex> g(impl_->mu);
    for (const auto& p : m.pending)
      if (p.seq == seq) text = p.text;
    if (text.empty() && seq == m.completed_seq) text = m.completed_text;
  }
  std::string out = config_.backend + ": " + (text.empty() ? "operation" : text) + " #" +
                    std::to_string(seq) + " in group " + config_.group + " " + what;
  if (config_.world_size > 1) {
    try {
      if (config_.check_order && m.store->check({config_.prefix + "mismatch"}))
        return out + "; cause: " + string_of(m.store->get(config_.prefix + "mismatch"));
      std::string report = m.missing_report(seq, true);
      if (report.rfind("every peer has issued it", 0) == 0 && config_.stall_warning_s > 0) {
        std::this_thread::sleep_for(millis(kRecheck));
        report = m.missing_report(seq, true, kRecheckSilent);
      }
      out += "; " + report;
    } catch (const std::exception& e) {
      out += "; peers' progress unavailable (rendezvous store unreachable: " + what_of(e) + ")";
    }
  }
  return out;
}

std::shared_ptr<Monitor> open_monitor(std::shared_ptr<c10d::Store> store, Monitor::Config group,
                                      const BackendOptions& options,
                                      std::vector<PeerIdentity> peers) {
  group.stall_warning_s = options.stall_warning_s;
  group.check_order = options.check_collectives;
  auto monitor = std::make_shared<Monitor>(std::move(store), std::move(group), std::move(peers));
  monitor->timeout_s = options.timeout_s;
  return monitor;
}

}  // namespace trainrun::comm
