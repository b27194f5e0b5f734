#pragma once
// The node agent (agent.cpp says why it is shaped as it is): its state and steps, shared by
// agent.cpp (workers: start, supervise, stop, finish) and rendezvous.cpp (the agents' store and
// rendezvous). Private to the core's launcher.
#include <c10/util/Logging.h>
#include <poll.h>
#include <sys/wait.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "output.hpp"
#include "process.hpp"
#include "signals.hpp"
#include "trainrun/core/launcher.hpp"

namespace trainrun::core::launcher {

namespace fs = std::filesystem;

using launcher_output::Console;
using launcher_output::HydraSplitter;
using launcher_output::LineSplitter;
using launcher_output::RankSink;
constexpr int kTickMs = 100;
// A peer agent that has not advanced its heartbeat for this long is taken as gone; only matters
// while node 0 waits for the other nodes to finish (running workers notice a lost peer
// themselves, through their collectives).
constexpr double kAgentLostS = 15.0;
// The other nodes' agents give up on node 0's store when one operation (a heartbeat, reading
// job/failed) gets no answer for this long: node 0's host is down or cut off.
constexpr double kStoreOpTimeoutS = 10.0;
// How long a failure that looks like a consequence of another rank's (a transport error) waits
// for that rank's own failure before it is reported as the cause.
constexpr double kCauseWindowS = 2.0;

// Whether a failed rank's last lines say that a peer went away (connection reset or closed,
// a collective whose peers did not arrive): then it failed because of another rank.
inline bool looks_collateral(const std::deque<std::string>& tail) {
  static const char* const kMarkers[] = {"reset by peer",     "closed by peer",
                                         "connection closed", "Connection closed",
                                         "Broken pipe",       "the transport failed",
                                         "not arrived:",      "then went silent",
                                         "ECONNRESET",        "EPIPE"};
  for (const auto& line : tail)
    for (const char* m : kMarkers)
      if (line.find(m) != std::string::npos) return true;
  return false;
}

// --- the store -------------------------------------------------------------------------------

inline std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
inline std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

// c10d logs each failed bind or connect attempt (through glog in Debian's LibTorch, with a
// "Logging before InitGoogleLogging" banner) and then throws; the agent reports the failure
// itself, with the [launch] key to change, so those lines are held back while it opens the store.
class QuietC10Logging {
 public:
#ifdef C10_USE_GLOG
  QuietC10Logging() : saved_(FLAGS_minloglevel) { FLAGS_minloglevel = google::GLOG_FATAL; }
  ~QuietC10Logging() { FLAGS_minloglevel = saved_; }

 private:
  int saved_;
#endif
};

// What an agent registers: "host\npid\nnproc_per_node\nnnodes".
struct AgentRecord {
  std::string host;
  long pid = 0;
  int nproc = 0, nnodes = 0;
  std::string encode() const {
    return host + "\n" + std::to_string(pid) + "\n" + std::to_string(nproc) + "\n" +
           std::to_string(nnodes);
  }
  static AgentRecord decode(const std::string& s) {
    AgentRecord r;
    std::stringstream ss(s);
    std::string pid, nproc, nnodes;
    std::getline(ss, r.host), std::getline(ss, pid), std::getline(ss, nproc),
        std::getline(ss, nnodes);
    r.pid = std::atol(pid.c_str()), r.nproc = std::atoi(nproc.c_str()),
    r.nnodes = std::atoi(nnodes.c_str());
    return r;
  }
  std::string who(int node) const {
    return "node " + std::to_string(node) + " (host " + host + ", pid " + std::to_string(pid) + ")";
  }
};

// Keys of one rendezvous round (elastic restarts across nodes start a new round; round 0's
// names are those of a job without restarts).
inline std::string round_key(int round, const std::string& name) {
  if (round == 0) return name == "failed" ? "job/failed" : "trainrun/" + name;
  return "trainrun/r" + std::to_string(round) + "/" + name;
}
// The round node 0 serves now (set before it waits for the other agents).
inline const char* const kRoundKey = "trainrun/round";

// A job-wide failure as stored under job/failed: "<exit code>\n<report>".
inline std::pair<int, std::string> decode_failure(const std::string& s) {
  const size_t nl = s.find('\n');
  return {std::atoi(s.substr(0, nl).c_str()), nl == std::string::npos ? "" : s.substr(nl + 1)};
}

// What outlives one attempt of an elastic multi-node job: node 0's store server, which the
// agents rendezvous through, round after round, and the round this node takes part in.
struct Session {
  std::unique_ptr<c10d::TCPStore> server;  ///< node 0 only
  int round = 0;
};

class Agent {
 public:
  Agent(const LaunchSpec& spec, Session& session)
      : spec_(spec), session_(session), round_(session.round), t0_(Clock::now()) {}
  /// Only reached with workers still running when the agent itself failed (an exception):
  /// nothing it started may outlive it.
  ~Agent() {
    for (Child& c : children_) {
      if (c.pid <= 0 || c.reaped) continue;
      c.signal_group(SIGKILL);
      waitpid(c.pid, nullptr, 0);
      c.reaped = true;
    }
    for (Child& c : children_) {
      for (int& fd : c.fds)
        if (fd >= 0) close(fd), fd = -1;
      if (c.control_fd >= 0) close(c.control_fd), c.control_fd = -1;
    }
    for (RankSink& s : sinks_)
      if (s.log_fd >= 0) close(s.log_fd);
  }
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;
  int run();
  /// The round this agent took part in (elastic multi-node jobs; 0 otherwise).
  int round() const { return round_; }
  /// Node 0's store stopped answering: nobody is left to restart with.
  bool store_lost() const { return store_lost_; }

 private:
  // Rendezvous; returns false when interrupted before it completed.
  bool rendezvous();
  void open_store();
  bool join_round();
  void serve_worker_store();
  bool wait_for_agents();
  bool wait_for_result();
  void fail_rendezvous(const std::string& msg);

  void open_logs();
  void start_workers();
  void start_mpiexec();
  int supervise();
  void read_ready(const std::vector<pollfd>& fds);
  void read_control(Child& c);
  void kill_stuck();
  void close_stream(Child& c, int s);
  void reap();
  void begin_stop();
  void on_failure(Child& c);
  std::string error_note(const std::string& error_line) const;
  void decide_cause();
  void poll_peers();
  int finish();

  std::string log_name(int rank) const {
    return (fs::path(spec_.run_dir) / "logs" / ("rank-" + std::to_string(rank) + ".log")).string();
  }
  std::string where() const { return spec_.master_addr + ":" + std::to_string(port_); }
  bool multi_node() const { return spec_.nnodes > 1; }
  bool elastic() const { return multi_node() && spec_.max_restarts > 0; }
  std::string key(const std::string& name) const { return round_key(round_, name); }
  std::string agent_key(int node) const { return key("agent/" + std::to_string(node)); }
  std::string beat_key(int node) const { return key("beat/" + std::to_string(node)); }
  std::string ended_key(int node) const { return key("ended/" + std::to_string(node)); }
  std::string rejoined_key(int node) const { return key("rejoined/" + std::to_string(node)); }
  int world() const { return spec_.nproc_per_node * spec_.nnodes; }
  void say(const std::string& msg) { console_.line(STDERR_FILENO, "trainrun: ", msg); }

  const LaunchSpec& spec_;
  Session& session_;
  int round_ = 0;  ///< may move on while this agent joins (a node that comes back mid-job)
  const Clock::time_point t0_;
  SignalScope signals_;
  Console console_;
  // Node 0: session_.server (or, without restarts, its own); the others: a client.
  std::unique_ptr<c10d::TCPStore> own_store_;
  c10d::TCPStore* store_ = nullptr;
  int port_ = 0;
  // Rounds after the first: the workers' store, served by node 0's agent on a free port, so
  // that no key of an earlier round's workers (their rendezvous, order slots) is seen again.
  std::unique_ptr<c10d::TCPStore> worker_store_;
  int worker_port_ = 0;
  std::vector<RankSink> sinks_;  ///< this node's ranks (all ranks under mpiexec)
  std::vector<Child> children_;
  std::deque<std::string> mpiexec_tail_;

  // Supervision state.
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point stop_at_;
  std::optional<int> exit_code_;  ///< set by the cause (a local failure, a peer's, a signal)
  bool interrupted_ = false;
  bool store_lost_ = false;
  Clock::time_point last_beat_sent_;
  std::map<int, std::pair<int64_t, Clock::time_point>> peer_beats_;  ///< node -> (count, seen)
  Clock::time_point last_wait_note_;
  std::vector<Child*> failures_;  ///< failed, not yet reported (see decide_cause)
  std::optional<Clock::time_point> first_failure_at_;
};

}  // namespace trainrun::core::launcher
