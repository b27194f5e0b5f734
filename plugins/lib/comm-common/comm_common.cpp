#include "comm_common.hpp"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <c10/util/Exception.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <sstream>

namespace trainrun::comm {

using namespace trainrun::v1;

namespace {

using Clock = std::chrono::steady_clock;

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string string_of(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// Fields of a status record are separated by the ASCII unit separator: op texts contain spaces,
// commas and parentheses, never this.
constexpr char kSep = '\x1f';

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) out.push_back(cur), cur.clear();
    else cur.push_back(c);
  }
  out.push_back(cur);
  return out;
}

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string seconds_text(double s) {
  std::ostringstream os;
  os.precision(s < 10 ? 2 : 3);
  os << s << " s";
  return os.str();
}

// ---------------------------------------------------------------------------------------------
// Rendezvous

// The first host of a SLURM host list: "node[03-05,9],gpu1" -> "node03"; each bracket group
// stands for its first entry (zero padding kept), as `scontrol show hostnames` would list first.
std::string slurm_first_host(const std::string& list) {
  std::string out;
  int depth = 0;
  bool skipping = false;
  for (char c : list) {
    if (c == ',' && depth == 0) break;
    if (c == '[') { ++depth; skipping = false; continue; }
    if (c == ']') { --depth; skipping = false; continue; }
    if (depth > 0) {
      if (c == ',' || c == '-') skipping = true;
      if (!skipping) out += c;
      continue;
    }
    out += c;
  }
  return out;
}

// Under srun (SLURM_PROCID) without MASTER_ADDR/MASTER_PORT: rank 0 serves the store on the
// step's first node (where srun's block distribution puts task 0), on a port derived from the
// job and step ids so that concurrent jobs and steps on one node differ.
std::optional<StoreAddress> store_address_from_slurm() {
  const char* procid = std::getenv("SLURM_PROCID");
  if (!procid || !*procid) return std::nullopt;
  const char* nodes = std::getenv("SLURM_STEP_NODELIST");
  if (!nodes || !*nodes) nodes = std::getenv("SLURM_JOB_NODELIST");
  if (!nodes || !*nodes) nodes = std::getenv("SLURM_NODELIST");
  const char* job = std::getenv("SLURM_JOB_ID");
  if (!job || !*job) job = std::getenv("SLURM_JOBID");
  TR_CHECK_TYPED(ConfigError, nodes && *nodes && job && *job,
                 "SLURM_PROCID is set but SLURM_STEP_NODELIST / SLURM_JOB_ID are not, and neither "
                 "is MASTER_ADDR / MASTER_PORT: set MASTER_ADDR and MASTER_PORT (the rendezvous "
                 "store) in the job script");
  const char* step = std::getenv("SLURM_STEP_ID");
  const long long job_id = std::atoll(job);
  const long long step_id = step ? std::atoll(step) : 0;
  StoreAddress a;
  a.host = slurm_first_host(nodes);
  a.port = 20000 + static_cast<int>((job_id * 16 + (step_id & 15)) % 40000);
  a.from = "SLURM (first node of " + std::string(nodes) + ", port from job " + job + " step " +
           std::to_string(step_id) + "; set MASTER_ADDR and MASTER_PORT to choose)";
  return a;
}

std::optional<StoreAddress> store_address_from_environment() {
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  if (!addr && !port) return store_address_from_slurm();
  TR_CHECK_TYPED(ConfigError, addr && *addr, "MASTER_PORT is set but MASTER_ADDR is not: set both "
                 "(the address and port of the rendezvous store)");
  TR_CHECK_TYPED(ConfigError, port && *port, "MASTER_ADDR is set but MASTER_PORT is not: set both "
                 "(the address and port of the rendezvous store)");
  char* end = nullptr;
  const long p = std::strtol(port, &end, 10);
  TR_CHECK_TYPED(ConfigError, end && *end == '\0' && p >= 1 && p <= 65535,
                 "MASTER_PORT='", port, "' is not a port number in [1, 65535]");
  StoreAddress a;
  a.host = addr;
  a.port = static_cast<int>(p);
  const char* agent = std::getenv("TRAINRUN_AGENT_STORE");
  a.agent_serves = agent && std::string(agent) == "1";
  return a;
}

std::shared_ptr<c10d::Store> open_store(const StoreAddress& address, int rank, int world_size,
                                        double timeout_s) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(address.port);
  opts.isServer = rank == 0 && !address.agent_serves;
  opts.waitWorkers = false;
  opts.numWorkers = c10::nullopt;
  opts.timeout = millis(timeout_s);
  const std::string where = address.host + ":" + std::to_string(address.port) +
                            (address.from.empty() ? "" : " (from " + address.from + ")");
  try {
    return std::make_shared<c10d::TCPStore>(address.host, opts);
  } catch (const std::exception& e) {
    const std::string msg = what_of(e);
    if (opts.isServer)
      TR_FAIL("rank 0 cannot serve the rendezvous store on ", where,
              msg.find("in use") != std::string::npos ||
                      msg.find("EADDRINUSE") != std::string::npos
                  ? " (the port is in use: choose another [launch] master_port / MASTER_PORT)"
                  : "",
              ": ", msg);
    TR_FAIL("rank ", rank, " of ", world_size, " cannot reach the rendezvous store at ", where,
            address.agent_serves ? " (served by the trainrun launcher)" : " (served by rank 0)",
            " within ", seconds_text(timeout_s), ": ", msg);
  }
}

std::shared_ptr<c10d::Store> serve_store(int port, int world_size, double timeout_s,
                                         int* bound_port) {
  (void)world_size;
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(port);
  opts.isServer = true;
  opts.waitWorkers = false;
  opts.timeout = millis(timeout_s);
  try {
    auto store = std::make_shared<c10d::TCPStore>("127.0.0.1", opts);
    if (bound_port) *bound_port = store->getPort();
    return store;
  } catch (const std::exception& e) {
    TR_FAIL("cannot serve a rendezvous store on port ", port, ": ", what_of(e));
  }
}

double rendezvous_timeout_from_environment() {
  const char* v = std::getenv("TRAINRUN_RENDEZVOUS_TIMEOUT_S");
  if (!v || !*v) return 300.0;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  TR_CHECK_TYPED(ConfigError, end && *end == '\0' && std::isfinite(s) && s > 0,
                 "TRAINRUN_RENDEZVOUS_TIMEOUT_S='", v, "' is not a positive number of seconds");
  return s;
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

std::vector<PeerIdentity> rendezvous(c10d::Store& store, const std::string& prefix, int rank,
                                     int world_size, double timeout_s, const std::string& where) {
  const std::string me = host_name() + kSep + std::to_string(getpid());
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(prefix + "arrived/" + std::to_string(r));
  try {
    store.set(keys[rank], bytes_of(me));
  } catch (const std::exception& e) {
    TR_FAIL(where, ": rank ", rank, " cannot announce itself to the rendezvous store: ", what_of(e));
  }
  // Polled rather than store.wait(keys): on a timeout, wait() says only that it timed out, and
  // the user needs to know which ranks never came.
  const auto deadline = Clock::now() + millis(timeout_s);
  std::vector<bool> here(world_size, false);
  here[rank] = true;
  auto sleep = std::chrono::milliseconds(2);
  for (;;) {
    bool all = true;
    for (int r = 0; r < world_size; ++r) {
      if (here[r]) continue;
      try {
        here[r] = store.check({keys[r]});
      } catch (const std::exception& e) {
        TR_FAIL(where, ": rank ", rank, " lost the rendezvous store while waiting for rank ", r,
                ": ", what_of(e));
      }
      all = all && here[r];
    }
    if (all) break;
    if (Clock::now() >= deadline) {
      std::string missing, arrived;
      for (int r = 0; r < world_size; ++r) {
        if (!here[r]) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        } else {
          std::string who;
          try {
            auto f = split(string_of(store.get(keys[r])), kSep);
            who = f.size() >= 2 ? " on " + f[0] + " pid " + f[1] : "";
          } catch (const std::exception&) {
          }
          arrived += (arrived.empty() ? "" : ", ") + std::to_string(r) + who;
        }
      }
      TR_FAIL(where, ": rendezvous of ", world_size, " ranks: rank(s) ", missing,
              " did not arrive within ", seconds_text(timeout_s), " (arrived: ", arrived, ")");
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::milliseconds(100));
  }
  std::vector<PeerIdentity> peers(world_size);
  for (int r = 0; r < world_size; ++r) {
    auto f = split(string_of(store.get(keys[r])), kSep);
    peers[r].rank = r;
    peers[r].host = f.empty() ? "?" : f[0];
    peers[r].pid = f.size() >= 2 ? std::atoll(f[1].c_str()) : 0;
  }
  return peers;
}

// ---------------------------------------------------------------------------------------------
// Operations

std::string reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

std::string OpDesc::text() const {
  std::ostringstream os;
  os << op << "(";
  bool first = true;
  if (!detail.empty()) os << detail, first = false;
  if (dtype != c10::ScalarType::Undefined)
    os << (first ? "" : ", ") << dtype_name(dtype) << " x " << numel << ", " << bytes << " B";
  os << ")";
  return os.str();
}

void check_tensor(const at::Tensor& t, const std::string& backend, const char* op,
                  const char* role) {
  TR_CHECK(t.defined(), backend, ": ", op, ": ", role, " tensor is undefined");
  TR_CHECK(t.device().is_cpu(), backend, ": ", op, ": ", role, " tensor is on ", t.device(),
           ", expected the accelerator's device cpu");
  TR_CHECK(t.layout() == at::kStrided, backend, ": ", op, ": ", role,
           " tensor must be dense (strided), got layout ", t.layout());
  TR_CHECK(t.is_contiguous(), backend, ": ", op, ": ", role, " tensor must be contiguous (shape ",
           t.sizes(), ", strides ", t.strides(), "); call .contiguous() first");
  TR_CHECK(supported_dtype(t.scalar_type()), backend, ": ", op, ": ", role, " tensor has dtype ",
           dtype_name(t.scalar_type()),
           "; supported: float32, float64, bfloat16, float16, int32, int64, uint8");
}

namespace {
// input and output of a collective that splits or joins world_size chunks.
void check_chunked(const at::Tensor& input, const at::Tensor& output, int world_size,
                   const std::string& backend, const char* op, const at::Tensor& whole,
                   const at::Tensor& chunk, const char* rule) {
  check_tensor(input, backend, op, "input");
  check_tensor(output, backend, op, "output");
  TR_CHECK(input.scalar_type() == output.scalar_type(), backend, ": ", op, ": input dtype ",
           dtype_name(input.scalar_type()), " differs from output dtype ",
           dtype_name(output.scalar_type()));
  TR_CHECK(whole.numel() == world_size * chunk.numel(), backend, ": ", op, ": ", rule,
           " elements (", world_size, " x ", chunk.numel(), " = ", world_size * chunk.numel(),
           "), got ", whole.numel());
}
}  // namespace

void check_reduce_scatter(const at::Tensor& input, const at::Tensor& output, int world_size,
                          const std::string& backend) {
  check_chunked(input, output, world_size, backend, "reduce_scatter", input, output,
                "input must hold world_size * output.numel()");
}

void check_all_gather(const at::Tensor& input, const at::Tensor& output, int world_size,
                      const std::string& backend) {
  check_chunked(input, output, world_size, backend, "all_gather", output, input,
                "output must hold world_size * input.numel()");
}

// ---------------------------------------------------------------------------------------------
// Monitor

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
      const std::string progress =
          who + ": last completed " + (f[3] == "0" ? std::string("none") : "#" + f[3] + " " + f[4]) +
          ", first pending " + (f[5] == "0" ? std::string("none") : "#" + f[5] + " " + f[6]) +
          ", last heard " + seconds_text(heard) + " ago";
      if (issued_r < seq) out += (missing++ ? "; " : "") + progress;
      else silent += (silent_count++ ? "; " : "") + progress;
    }
    if (missing == 0 && silent_count == 0)
      return failed ? "every peer has issued it (the transport failed; see the cause above)"
                    : "every peer has issued it: its data is still in transit (a slow or "
                      "congested link between the hosts?)";
    std::string report;
    if (missing > 0) report = "not arrived: " + out;
    if (silent_count > 0)
      report += std::string(missing > 0 ? "; " : "") + "issued it, then went silent (dead, or its host unreachable?): " + silent;
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
        if (stop_cv.wait_for(lk, millis(tick), [this] { return stopping || changed; }) && stopping) return;
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
            if (waited < stall || again) seq = 0;
            else warned_seq = seq, warned_at = Clock::now();
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
  const std::string desired = std::to_string(seq) + kSep + std::to_string(config_.rank) + kSep + text;
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

// ---------------------------------------------------------------------------------------------
// Work

FutureWork::FutureWork(std::shared_ptr<Monitor> monitor, uint64_t seq, std::string op_text,
                       double timeout_s)
    : monitor_(std::move(monitor)), seq_(seq), op_text_(std::move(op_text)), timeout_s_(timeout_s) {}

void FutureWork::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> g(mu_);
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

void FutureWork::wait(double timeout_s) {
  const double t = timeout_s > 0 ? timeout_s : timeout_s_;
  std::unique_lock<std::mutex> lk(mu_);
  const bool ok = t > 0 ? cv_.wait_for(lk, millis(t), [this] { return done_; })
                        : (cv_.wait(lk, [this] { return done_; }), true);
  if (!ok) {
    lk.unlock();
    const std::string what = "timed out after " + seconds_text(t);
    if (monitor_ && seq_ > 0) TR_FAIL(monitor_->describe_failure(seq_, what));
    TR_FAIL(op_text_, " ", what);
  }
  if (error_) std::rethrow_exception(error_);
}

bool FutureWork::completed() const {
  std::lock_guard<std::mutex> g(mu_);
  return done_;
}

}  // namespace trainrun::comm
