// The node agent (torchrun's role): rendezvous of the agents through c10d's TCPStore, spawning
// and supervising this node's workers; their output is routed by output.hpp (same folder), the
// worker environment is detected in worker_environment.cpp.
//
// Why it is shaped this way:
//  - One thread and one poll() loop (100 ms tick) own everything: the workers' pipes, a
//    self-pipe woken by SIGCHLD/SIGINT/SIGTERM, waitpid(WNOHANG), and the store queries of a
//    multi-node job. No state is shared between threads, and every wait has a deadline, so the
//    agent cannot hang on a worker or a peer.
//  - Each worker runs in its own process group, so a Ctrl-C on the terminal reaches only the
//    launcher, which then sends exactly one SIGTERM per worker (the trainer stops at the next
//    step; a second signal would kill it at once), and a stop reaches the worker's children
//    too. PR_SET_PDEATHSIG covers the launcher being killed with SIGKILL.
//  - The first failure is the cause. Its exit time is taken from the moment its pipes closed,
//    which poll() reports as it happens, rather than from waitpid order: ranks that fail
//    because a peer died exit a few milliseconds later, and are then only collateral. A rank
//    whose last lines are a transport error (a peer reset or closed the connection) may still
//    exit before the rank that caused it (which tears its connections down while it unwinds,
//    and only then exits): such a failure waits up to kCauseWindowS for a rank's own error,
//    which then wins.
#include "trainrun/core/launcher.hpp"
#include "trainrun/core/log.hpp"

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <trainrun/error.hpp>
#include <trainrun/error_text.hpp>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "trainrun/core/run_dir.hpp"
#include "output.hpp"

extern char** environ;

// --- the rendezvous store's listening address --------------------------------------------------
// c10d's TCPStore server (LibTorch 1.13) listens on the wildcard address of its port, i.e. on
// every interface, and has no option to do otherwise. The store has no authentication: anyone
// who reaches the port can read and write the job's keys (fail it, or impersonate a rank). So
// while node 0's agent opens the store, the executable's bind() (exported through
// core/memory.dynlist, so it interposes LibTorch's call into libc) replaces a wildcard address
// with master_addr's, and refuses the other address family, which c10d then skips. At any other
// time, and for any other address, it is libc's bind().
namespace {
std::atomic<const sockaddr_storage*> g_store_bind{nullptr};
}  // namespace

extern "C" __attribute__((visibility("default"))) int bind(int fd, const struct sockaddr* addr, socklen_t len) {
  using Real = int (*)(int, const struct sockaddr*, socklen_t);
  static const Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "bind"));
  const sockaddr_storage* want = g_store_bind.load();
  if (want != nullptr && addr != nullptr) {
    if (addr->sa_family == AF_INET && len >= sizeof(sockaddr_in) &&
        reinterpret_cast<const sockaddr_in*>(addr)->sin_addr.s_addr == htonl(INADDR_ANY)) {
      if (want->ss_family != AF_INET) return errno = EADDRNOTAVAIL, -1;
      sockaddr_in a = *reinterpret_cast<const sockaddr_in*>(addr);
      a.sin_addr = reinterpret_cast<const sockaddr_in*>(want)->sin_addr;
      return real(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a);
    }
    if (addr->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6) &&
        IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr)) {
      if (want->ss_family != AF_INET6) return errno = EADDRNOTAVAIL, -1;
      sockaddr_in6 a = *reinterpret_cast<const sockaddr_in6*>(addr);
      a.sin6_addr = reinterpret_cast<const sockaddr_in6*>(want)->sin6_addr;
      return real(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a);
    }
  }
  return real(fd, addr, len);
}

namespace fs = std::filesystem;

namespace trainrun::core {

using v1::ConfigError;
using v1::Error;

// ---------------------------------------------------------------------------------------------
// The agent

namespace {

using Clock = std::chrono::steady_clock;
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
bool looks_collateral(const std::deque<std::string>& tail) {
  static const char* const kMarkers[] = {"reset by peer", "closed by peer", "connection closed",
                                         "Connection closed", "Broken pipe", "the transport failed",
                                         "not arrived:", "then went silent", "ECONNRESET", "EPIPE"};
  for (const auto& line : tail)
    for (const char* m : kMarkers)
      if (line.find(m) != std::string::npos) return true;
  return false;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string fixed1(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// "exited with code 2", "was killed by signal 9 (SIGKILL)"; the exit code a shell would show.
std::pair<std::string, int> describe_status(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return {"was killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")",
            128 + sig};
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  return {"exited with code " + std::to_string(code), code};
}

// --- signals: a self-pipe, so poll() wakes at once ------------------------------------------

int g_wake_fd = -1;
std::atomic<int> g_stop_signals{0};
std::atomic<int> g_last_signal{0};

extern "C" void on_launcher_signal(int sig) {
  const int saved = errno;
  if (sig == SIGINT || sig == SIGTERM) {
    g_last_signal.store(sig);
    g_stop_signals.fetch_add(1);
  }
  if (g_wake_fd >= 0) {
    const char c = 0;
    [[maybe_unused]] ssize_t n = write(g_wake_fd, &c, 1);
  }
  errno = saved;
}

// Installs the handlers for the life of one launch() and puts the old ones back.
class SignalScope {
 public:
  SignalScope() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
      throw Error(std::string("launcher: pipe2: ") + std::strerror(errno));
    read_fd_ = fds[0];
    write_fd_ = fds[1];
    g_wake_fd = write_fd_;
    g_stop_signals.store(0);
    g_last_signal.store(0);
    struct sigaction sa {};
    sa.sa_handler = on_launcher_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int s : {SIGINT, SIGTERM, SIGCHLD}) sigaction(s, &sa, &old_[s]);
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    // A closed stdout (`trainrun ... | head`) must not kill the launcher while workers run.
    sigaction(SIGPIPE, &ign, &old_[SIGPIPE]);
  }
  ~SignalScope() {
    for (auto& [s, sa] : old_) sigaction(s, &sa, nullptr);
    g_wake_fd = -1;
    close(read_fd_);
    close(write_fd_);
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;
  int fd() const { return read_fd_; }
  void drain() const {
    char buf[256];
    while (read(read_fd_, buf, sizeof buf) > 0) {
    }
  }

 private:
  int read_fd_ = -1, write_fd_ = -1;
  std::map<int, struct sigaction> old_;
};

// --- processes -------------------------------------------------------------------------------

// argv/envp for execve, built before fork() (the child may only make async-signal-safe calls).
struct ExecImage {
  std::vector<std::string> args, env;
  std::vector<char*> argv, envp;
  std::string exec_error;  // written by the child when execvp fails
  void seal() {
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    exec_error = "trainrun: cannot execute " + args[0] + ": errno ";
  }
};

// The launcher's environment without the variables that say who a worker is (a stale RANK would
// override what the launcher sets), plus `add`.
std::vector<std::string> worker_env(const std::vector<std::pair<std::string, std::string>>& add) {
  static const std::set<std::string> owned = {
      "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
      "MASTER_PORT", "TRAINRUN_AGENT_STORE", "TRAINRUN_RUN_DIR_READY", "TRAINRUN_TTY",
      "TRAINRUN_RENDEZVOUS_TIMEOUT_S", "TRAINRUN_CONTROL_FD"};
  std::set<std::string> added;
  for (const auto& [k, v] : add) added.insert(k);
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv(*e);
    const std::string key = kv.substr(0, kv.find('='));
    if (!owned.count(key) && !added.count(key)) out.push_back(kv);
  }
  for (const auto& [k, v] : add) out.push_back(k + "=" + v);
  return out;
}

void write_decimal(int fd, int v) {
  char buf[16];
  int i = sizeof buf;
  buf[--i] = '\n';
  do buf[--i] = static_cast<char>('0' + v % 10); while ((v /= 10) > 0 && i > 0);
  [[maybe_unused]] ssize_t n = write(fd, buf + i, sizeof buf - i);
}

struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw Error(std::string("launcher: pipe2: ") + std::strerror(errno));
    r = fds[0], w = fds[1];
  }
};

// fork + exec with stdout/stderr into pipes, stdin from /dev/null, in a process group of its
// own, killed with SIGKILL when the launcher dies. Returns the pid; *out/*err get the read ends.
// With `control` set, the worker also gets the write end of a third pipe as its fd 3
// (kControlFd), on which it reports what it is doing while it stops (stop_protocol below).
constexpr int kControlFd = 3;
pid_t spawn(ExecImage& image, int* out, int* err, int* control = nullptr) {
  Pipe po, pe;
  std::optional<Pipe> pc;
  if (control) pc.emplace();
  const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    close(po.r), close(po.w), close(pe.r), close(pe.w), close(devnull);
    if (pc) close(pc->r), close(pc->w);
    throw Error(std::string("launcher: fork: ") + std::strerror(e));
  }
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec: other threads (the store's) may have held
    // locks at fork time.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(127);
    setpgid(0, 0);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    dup2(po.w, STDOUT_FILENO);
    dup2(pe.w, STDERR_FILENO);
    if (pc) {
      // dup2 onto itself keeps FD_CLOEXEC, so that case clears it by hand.
      if (pc->w == kControlFd) fcntl(kControlFd, F_SETFD, 0);
      else dup2(pc->w, kControlFd);
    }
    syscall(SYS_close_range, pc ? 4U : 3U, ~0U, 0U);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    // The handlers the agent installed; anything else (nohup's SIGHUP) stays as inherited.
    for (int s : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE}) sigaction(s, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execvpe(image.argv[0], image.argv.data(), image.envp.data());
    const int e = errno;
    [[maybe_unused]] ssize_t n = write(STDERR_FILENO, image.exec_error.data(), image.exec_error.size());
    write_decimal(STDERR_FILENO, e);
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so a stop sent right away reaches the group
  close(po.w), close(pe.w);
  if (devnull >= 0) close(devnull);
  *out = po.r;
  *err = pe.r;
  if (pc) {
    close(pc->w);
    fcntl(pc->r, F_SETFL, O_NONBLOCK);
    *control = pc->r;
  }
  return pid;
}

// One process the agent started: a worker, or mpiexec.
struct Child {
  std::string name;  ///< "rank 3", "mpiexec"
  int rank = -1;     ///< global rank; -1 for mpiexec
  pid_t pid = -1;
  int fds[2] = {-1, -1};  ///< stdout, stderr read ends; -1 once at EOF
  std::unique_ptr<LineSplitter> lines[2];
  std::unique_ptr<HydraSplitter> hydra[2];
  Clock::time_point started;
  std::optional<Clock::time_point> pipes_closed;  ///< when both streams reached EOF
  bool reaped = false;
  int status = 0;
  // The stop protocol (fd 3 of a worker, see Agent::read_control): what it said while stopping.
  int control_fd = -1;
  std::string control_buf;
  std::optional<Clock::time_point> saving_since;  ///< "saving STEP" seen, no "saved" yet
  std::optional<Clock::time_point> saved_at;      ///< "saved STEP" seen
  std::string save_step;
  bool stop_acknowledged = false;  ///< "stopping" seen: the signal arrived, the step finishes
  bool killed = false;             ///< SIGKILLed by the agent

  bool pipes_open() const { return fds[0] >= 0 || fds[1] >= 0; }
  void signal_group(int sig) const {
    // The group outlives the worker only through its own children, which keep the pipes open,
    // so a group whose leader is reaped and whose pipes are closed is never signalled (its id
    // may belong to someone else by then).
    if (!reaped || pipes_open()) kill(-pid, sig);
  }
};

// --- the store -------------------------------------------------------------------------------

// For the life of the object, the process's wildcard binds go to `host` (see bind() above).
class StoreBindScope {
 public:
  explicit StoreBindScope(const std::string& host) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
    if (rc != 0 || res == nullptr)
      throw ConfigError("[launch] master_addr = \"" + host + "\": cannot resolve it (" + gai_strerror(rc) +
                        "); the rendezvous store listens on this address");
    std::memcpy(&addr_, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    g_store_bind.store(&addr_);
  }
  ~StoreBindScope() { g_store_bind.store(nullptr); }
  StoreBindScope(const StoreBindScope&) = delete;
  StoreBindScope& operator=(const StoreBindScope&) = delete;

 private:
  sockaddr_storage addr_{};
};

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

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
    std::getline(ss, r.host), std::getline(ss, pid), std::getline(ss, nproc), std::getline(ss, nnodes);
    r.pid = std::atol(pid.c_str()), r.nproc = std::atoi(nproc.c_str()), r.nnodes = std::atoi(nnodes.c_str());
    return r;
  }
  std::string who(int node) const {
    return "node " + std::to_string(node) + " (host " + host + ", pid " + std::to_string(pid) + ")";
  }
};

// Keys of one rendezvous round (elastic restarts across nodes start a new round; round 0's
// names are those of a job without restarts).
std::string round_key(int round, const std::string& name) {
  if (round == 0) return name == "failed" ? "job/failed" : "trainrun/" + name;
  return "trainrun/r" + std::to_string(round) + "/" + name;
}
// The round node 0 serves now (set before it waits for the other agents).
const char* const kRoundKey = "trainrun/round";

// A job-wide failure as stored under job/failed: "<exit code>\n<report>".
std::pair<int, std::string> decode_failure(const std::string& s) {
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

int Agent::run() {
  if (!rendezvous()) return 130;
  open_logs();
  if (spec_.mpiexec) start_mpiexec();
  else start_workers();
  const int code = supervise();
  return multi_node() ? finish() : code;
}

void Agent::open_store() {
  if (spec_.node_rank == 0 && session_.server) {
    // A later round of an elastic job: the agents' store stays where they know it.
    store_ = session_.server.get();
    port_ = store_->getPort();
    return;
  }
  if (spec_.node_rank == 0) {
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(spec_.master_port);
    o.isServer = true;
    o.waitWorkers = false;
    // The server's own client connects to itself at once; the long timeout is for the peers'
    // waits, set below.
    o.timeout = std::chrono::milliseconds(10000);
    try {
      QuietC10Logging quiet;
      std::optional<StoreBindScope> only_master_addr;
      if (!spec_.store_listen_all) only_master_addr.emplace(spec_.master_addr);
      own_store_ = std::make_unique<c10d::TCPStore>(spec_.master_addr, o);
      store_ = own_store_.get();
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      const std::string msg = v1::what_of(e);
      const std::string at = spec_.master_addr + ":" + std::to_string(spec_.master_port);
      if (msg.find("in use") != std::string::npos || msg.find("errno: 98") != std::string::npos)
        throw Error("cannot serve the rendezvous store on " + at + ": port " +
                    std::to_string(spec_.master_port) +
                    " is in use by another process ([launch] master_port); choose another "
                    "port, or master_port = 0 for a free one (single node only)");
      throw Error("cannot serve the rendezvous store on " + at + " ([launch] master_addr, "
                  "master_port): " + msg);
    }
    port_ = store_->getPort();
    store_->setTimeout(std::chrono::milliseconds(static_cast<int64_t>(spec_.rendezvous_timeout_s * 1000)));
    if (elastic()) session_.server = std::move(own_store_);
    return;
  }
  port_ = spec_.master_port;
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(spec_.master_port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(spec_.rendezvous_timeout_s * 1000));
  try {
    QuietC10Logging quiet;
    own_store_ = std::make_unique<c10d::TCPStore>(spec_.master_addr, o);
    store_ = own_store_.get();
  } catch (const std::exception& e) {
    throw Error("node " + std::to_string(spec_.node_rank) + ": could not reach node 0's "
                "rendezvous store at " + where() + " within " + fixed1(spec_.rendezvous_timeout_s) +
                " s ([launch] rendezvous_timeout_s); is trainrun running on node 0 with the same "
                "master_addr and master_port? (" + v1::what_of(e) + ")");
  }
}

bool Agent::rendezvous() {
  // Node 0 moves an earlier run aside before anyone can write there: the other agents open
  // their logs only after the rendezvous, which node 0 starts serving only after this.
  if (spec_.node_rank == 0 && spec_.rotate_run_dir && !spec_.run_dir.empty())
    keep_previous_run(spec_.run_dir);
  open_store();
  if (!multi_node()) return true;
  if (elastic() && spec_.node_rank == 0) {
    store_->set(kRoundKey, bytes(std::to_string(round_)));
    if (round_ > 0) serve_worker_store();
  }
  if (!join_round()) return false;
  if (spec_.node_rank == 0) return wait_for_agents();
  say("node " + std::to_string(spec_.node_rank) + " joined the rendezvous at " + where() +
      (round_ > 0 ? " (round " + std::to_string(round_) + ")" : "") +
      "; waiting for node 0 to confirm the layout");
  return wait_for_result();
}

// Registers this agent for the current round. A node_rank already claimed is a mistake (two
// agents given the same --node-rank), except in an elastic job whose round is under way: then
// this agent replaces one that is gone (its host was restarted, as Kubernetes restarts a pod),
// and it ends that round (a failure every agent sees, as torchrun's agents restart when a node
// waits to join) and joins the next one.
bool Agent::join_round() {
  AgentRecord me{host_name(), static_cast<long>(getpid()), spec_.nproc_per_node, spec_.nnodes};
  const std::string mine = me.encode();
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(spec_.rendezvous_timeout_s * 1000));
  // The round node 0 serves now, once it is at least the one this agent is to join (after a
  // failed round, node 0 opens the next one only when its own workers have stopped).
  auto wait_for_round = [&](int at_least) {
    auto current = [&] { return store_->check({kRoundKey}) ? std::atoi(text(store_->get(kRoundKey)).c_str()) : 0; };
    for (round_ = current(); round_ < at_least; round_ = current()) {
      if (g_stop_signals.load()) return false;
      if (Clock::now() >= deadline)
        throw Error("node " + std::to_string(spec_.node_rank) + ": node 0 at " + where() +
                    " did not open round " + std::to_string(at_least) + " within " +
                    fixed1(spec_.rendezvous_timeout_s) + " s ([launch] rendezvous_timeout_s)");
      pollfd p{signals_.fd(), POLLIN, 0};
      ::poll(&p, 1, kTickMs);
      signals_.drain();
    }
    return true;
  };
  if (elastic() && spec_.node_rank != 0 && !wait_for_round(session_.round)) {
    say("interrupted while waiting for round " + std::to_string(session_.round) + "; no worker was started");
    return false;
  }
  for (;;) {
    const std::string got = text(store_->compareSet(agent_key(spec_.node_rank), {}, bytes(mine)));
    if (got == mine) return true;
    const std::string earlier = AgentRecord::decode(got).who(spec_.node_rank);
    if (!elastic() || spec_.node_rank == 0 || !store_->check({key("rendezvous/result")})) {
      const std::string msg = "two agents claim node_rank " + std::to_string(spec_.node_rank) + ": " +
                              earlier + " and " + me.who(spec_.node_rank) +
                              "; give every node its own [launch] node_rank (--node-rank)";
      store_->compareSet(key("rendezvous/duplicate"), {}, bytes(msg));
      throw Error(msg);
    }
    const std::string why = me.who(spec_.node_rank) + " rejoined the job in place of " + earlier +
                            ", which is gone; restarting every node from the latest checkpoint";
    say(why + " (round " + std::to_string(round_) + " ends)");
    store_->compareSet(key("failed"), {}, bytes("1\n" + why));
    store_->set(rejoined_key(spec_.node_rank), bytes(mine));
    if (!wait_for_round(round_ + 1)) {
      say("interrupted while waiting for the next round; no worker was started");
      return false;
    }
  }
}

// The workers' store of a round after the first, on a free port of master_addr (every
// interface with store_listen = "all").
void Agent::serve_worker_store() {
  c10d::TCPStoreOptions o;
  o.port = 0;
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(spec_.rendezvous_timeout_s * 1000));
  try {
    QuietC10Logging quiet;
    std::optional<StoreBindScope> only_master_addr;
    if (!spec_.store_listen_all) only_master_addr.emplace(spec_.master_addr);
    worker_store_ = std::make_unique<c10d::TCPStore>(spec_.master_addr, o);
  } catch (const std::exception& e) {
    throw Error("round " + std::to_string(round_) + ": cannot serve the workers' store on " +
                spec_.master_addr + " (a free port): " + v1::what_of(e));
  }
  worker_port_ = worker_store_->getPort();
}

void Agent::fail_rendezvous(const std::string& msg) {
  // The other agents read the reason from the store; give them a few ticks before it goes.
  store_->set(key("rendezvous/result"), bytes("error\n" + msg));
  ::poll(nullptr, 0, 3 * kTickMs);
  throw Error(msg);
}

bool Agent::wait_for_agents() {
  const auto deadline = t0_ + std::chrono::milliseconds(static_cast<int64_t>(spec_.rendezvous_timeout_s * 1000));
  std::vector<std::string> keys;
  for (int n = 0; n < spec_.nnodes; ++n) keys.push_back(agent_key(n));
  say("rendezvous at " + where() + ": waiting for " + std::to_string(spec_.nnodes - 1) +
      " more node(s), up to " + fixed1(spec_.rendezvous_timeout_s) + " s");
  while (!store_->check(keys)) {
    if (g_stop_signals.load()) {
      say("interrupted during the rendezvous; no worker was started");
      store_->set(key("rendezvous/result"), bytes("error\nnode 0 was interrupted during the rendezvous"));
      return false;
    }
    if (store_->check({key("rendezvous/duplicate")})) fail_rendezvous(text(store_->get(key("rendezvous/duplicate"))));
    if (Clock::now() >= deadline) {
      std::string missing, arrived;
      for (int n = 0; n < spec_.nnodes; ++n) {
        if (store_->check({agent_key(n)}))
          arrived += (arrived.empty() ? "" : ", ") + AgentRecord::decode(text(store_->get(agent_key(n)))).who(n);
        else
          missing += (missing.empty() ? "" : ", ") + std::to_string(n);
      }
      fail_rendezvous("rendezvous at " + where() + ": node(s) " + missing + " of " +
                      std::to_string(spec_.nnodes) + " did not arrive within " +
                      fixed1(spec_.rendezvous_timeout_s) + " s ([launch] rendezvous_timeout_s); "
                      "arrived: " + arrived);
    }
    pollfd p{signals_.fd(), POLLIN, 0};
    ::poll(&p, 1, kTickMs);
    signals_.drain();
  }
  const AgentRecord first = AgentRecord::decode(text(store_->get(agent_key(0))));
  for (int n = 1; n < spec_.nnodes; ++n) {
    const AgentRecord r = AgentRecord::decode(text(store_->get(agent_key(n))));
    if (r.nproc != first.nproc || r.nnodes != first.nnodes)
      fail_rendezvous(r.who(n) + " runs nproc_per_node " + std::to_string(r.nproc) + " x nnodes " +
                      std::to_string(r.nnodes) + ", but " + first.who(0) + " runs nproc_per_node " +
                      std::to_string(first.nproc) + " x nnodes " + std::to_string(first.nnodes) +
                      "; every node must use the same [launch] layout");
  }
  // "ok", or in a later round "ok\n<port of the workers' store>".
  store_->set(key("rendezvous/result"), bytes(worker_port_ ? "ok\n" + std::to_string(worker_port_) : "ok"));
  return true;
}

bool Agent::wait_for_result() {
  // Node 0 may have started up to a whole timeout after this node connected, and then waits a
  // timeout of its own.
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(spec_.rendezvous_timeout_s * 1000) + 5000);
  for (;;) {
    bool ready = false;
    try {
      ready = store_->check({key("rendezvous/result")});
    } catch (const std::exception& e) {
      throw Error("node " + std::to_string(spec_.node_rank) + ": node 0's agent at " + where() +
                  " went away during the rendezvous (see its output): " + v1::what_of(e));
    }
    if (ready) break;
    if (g_stop_signals.load()) {
      say("interrupted during the rendezvous; no worker was started");
      return false;
    }
    if (Clock::now() >= deadline)
      throw Error("node " + std::to_string(spec_.node_rank) + ": node 0 at " + where() +
                  " did not complete the rendezvous within " + fixed1(spec_.rendezvous_timeout_s) +
                  " s ([launch] rendezvous_timeout_s)");
    pollfd p{signals_.fd(), POLLIN, 0};
    ::poll(&p, 1, kTickMs);
    signals_.drain();
  }
  const std::string result = text(store_->get(key("rendezvous/result")));
  if (result.rfind("ok", 0) != 0) throw Error(result.substr(result.find('\n') + 1));
  if (result.size() > 3) worker_port_ = std::atoi(result.c_str() + 3);
  // From here on this connection carries the heartbeat and the job's failure: a store that
  // stops answering (node 0's host down or cut off) must be noticed within seconds, not after
  // the rendezvous timeout, which a TCPStore client keeps as its socket timeout for good.
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(spec_.master_port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = std::chrono::milliseconds(
      static_cast<int64_t>(std::min(kStoreOpTimeoutS, spec_.rendezvous_timeout_s) * 1000));
  try {
    QuietC10Logging quiet;
    own_store_ = std::make_unique<c10d::TCPStore>(spec_.master_addr, o);
    store_ = own_store_.get();
    // LibTorch 1.13's client socket has no receive timeout until its first wait, which leaves
    // it at the store's timeout; a get waits. Without it a cut link blocks the agent for good.
    store_->get(key("rendezvous/result"));
  } catch (const std::exception& e) {
    throw Error("node " + std::to_string(spec_.node_rank) + ": node 0's agent at " + where() +
                " went away at the end of the rendezvous (see its output): " + v1::what_of(e));
  }
  return true;
}

void Agent::open_logs() {
  const int first = spec_.mpiexec ? 0 : spec_.node_rank * spec_.nproc_per_node;
  const int count = spec_.nproc_per_node;
  if (!spec_.run_dir.empty()) {
    std::error_code ec;
    fs::create_directories(fs::path(spec_.run_dir) / "logs", ec);
    if (ec) throw Error("cannot create " + (fs::path(spec_.run_dir) / "logs").string() + ": " + ec.message());
  }
  sinks_.resize(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    RankSink& s = sinks_[static_cast<size_t>(i)];
    s.rank = first + i;
    if (spec_.run_dir.empty()) continue;
    s.log_path = log_name(s.rank);
    s.log_fd = open(s.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (s.log_fd < 0) throw Error("cannot open " + s.log_path + ": " + std::strerror(errno));
  }
}

void Agent::start_workers() {
  const bool tty = console_.stderr_tty();
  std::string columns;
  if (tty) {
    winsize ws{};
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) columns = std::to_string(ws.ws_col);
  }
  children_.resize(static_cast<size_t>(spec_.nproc_per_node));
  for (int local = 0; local < spec_.nproc_per_node; ++local) {
    const int rank = spec_.node_rank * spec_.nproc_per_node + local;
    std::vector<std::pair<std::string, std::string>> vars = {
        {"RANK", std::to_string(rank)},
        {"LOCAL_RANK", std::to_string(local)},
        {"WORLD_SIZE", std::to_string(world())},
        {"LOCAL_WORLD_SIZE", std::to_string(spec_.nproc_per_node)},
        {"GROUP_RANK", std::to_string(spec_.node_rank)},
        {"MASTER_ADDR", spec_.master_addr},
        {"MASTER_PORT", std::to_string(worker_port_ ? worker_port_ : port_)},
        {"TRAINRUN_AGENT_STORE", "1"},
        {"TRAINRUN_RUN_DIR_READY", "1"},
        {"TRAINRUN_RENDEZVOUS_TIMEOUT_S", fixed1(spec_.rendezvous_timeout_s)},
        {"TRAINRUN_CONTROL_FD", std::to_string(kControlFd)}};
    // A later round of an elastic job: the workers resume from the latest checkpoint.
    if (round_ > 0) vars.emplace_back("TRAINRUN_RESTART", std::to_string(round_));
    const bool bar = tty && rank == 0;
    if (bar) {
      vars.emplace_back("TRAINRUN_TTY", "1");
      if (!columns.empty() && !std::getenv("COLUMNS")) vars.emplace_back("COLUMNS", columns);
    }
    ExecImage image;
    image.args = spec_.argv;
    image.env = worker_env(vars);
    image.seal();
    Child& c = children_[static_cast<size_t>(local)];
    c.name = "rank " + std::to_string(rank);
    c.rank = rank;
    c.started = Clock::now();
    c.pid = spawn(image, &c.fds[0], &c.fds[1], &c.control_fd);
    RankSink* sink = &sinks_[static_cast<size_t>(local)];
    c.lines[0] = std::make_unique<LineSplitter>(sink, STDOUT_FILENO, false);
    c.lines[1] = std::make_unique<LineSplitter>(sink, STDERR_FILENO, bar);
    say("started rank " + std::to_string(rank) + " (pid " + std::to_string(c.pid) +
        (multi_node() ? ", node " + std::to_string(spec_.node_rank) : "") + ")");
  }
}

void Agent::start_mpiexec() {
  // The flags below are MPICH hydra's; Open MPI's mpiexec has none of them.
  {
    std::string first;
    if (FILE* p = popen("mpiexec --version 2>&1", "r")) {
      char buf[512];
      while (std::fgets(buf, sizeof buf, p)) first += buf;
      const int rc = pclose(p);
      if (rc != 0 && first.find("HYDRA") == std::string::npos)
        throw ConfigError("[launch] launcher = mpiexec: `mpiexec --version` failed (exit status " +
                          std::to_string(rc) + "); install MPICH (Debian: mpich) or put its "
                          "mpiexec on PATH");
    }
    if (first.find("HYDRA") == std::string::npos)
      throw ConfigError("[launch] launcher = mpiexec needs MPICH's hydra mpiexec (for "
                        "-prepend-rank); `mpiexec --version` says: " + first.substr(0, first.find('\n')));
  }
  ExecImage image;
  image.args = {"mpiexec", "-n", std::to_string(spec_.nproc_per_node), "-prepend-rank"};
  image.args.insert(image.args.end(), spec_.argv.begin(), spec_.argv.end());
  image.env = worker_env({{"MASTER_ADDR", spec_.master_addr},
                          {"MASTER_PORT", std::to_string(port_)},
                          {"TRAINRUN_AGENT_STORE", "1"},
                          {"TRAINRUN_RUN_DIR_READY", "1"},
                          {"TRAINRUN_RENDEZVOUS_TIMEOUT_S", fixed1(spec_.rendezvous_timeout_s)}});
  image.seal();
  children_.resize(1);
  Child& c = children_[0];
  c.name = "mpiexec";
  c.started = Clock::now();
  c.pid = spawn(image, &c.fds[0], &c.fds[1]);
  c.hydra[0] = std::make_unique<HydraSplitter>(&sinks_, STDOUT_FILENO, &mpiexec_tail_);
  c.hydra[1] = std::make_unique<HydraSplitter>(&sinks_, STDERR_FILENO, &mpiexec_tail_);
  say("started mpiexec (pid " + std::to_string(c.pid) + ") for " +
      std::to_string(spec_.nproc_per_node) + " ranks");
}

void Agent::close_stream(Child& c, int s) {
  if (c.lines[s]) c.lines[s]->finish(console_);
  if (c.hydra[s]) c.hydra[s]->finish(console_);
  close(c.fds[s]);
  c.fds[s] = -1;
  if (!c.pipes_open()) c.pipes_closed = Clock::now();
}

void Agent::read_ready(const std::vector<pollfd>& fds) {
  char buf[65536];
  for (const pollfd& p : fds) {
    if (p.revents == 0 || p.fd == signals_.fd()) continue;
    for (Child& c : children_) {
      for (int s = 0; s < 2; ++s) {
        if (c.fds[s] != p.fd) continue;
        const ssize_t n = read(p.fd, buf, sizeof buf);
        if (n > 0) {
          if (c.lines[s]) c.lines[s]->feed(console_, buf, static_cast<size_t>(n));
          if (c.hydra[s]) c.hydra[s]->feed(console_, buf, static_cast<size_t>(n));
        } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
          close_stream(c, s);
        }
      }
    }
  }
}

// The stop protocol. A worker started by this agent finds TRAINRUN_CONTROL_FD=3 and writes one
// line per event there: "stopping" (its SIGTERM/SIGINT handler: the signal arrived, it finishes
// the step), "saving STEP" (a checkpoint write began), "saved STEP" (it is complete). Nothing
// else uses the pipe, so a worker's own output can never be mistaken for a message.
void Agent::read_control(Child& c) {
  char buf[512];
  for (;;) {
    const ssize_t n = read(c.control_fd, buf, sizeof buf);
    if (n > 0) {
      c.control_buf.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0 || (errno != EINTR && errno != EAGAIN)) close(c.control_fd), c.control_fd = -1;
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  for (size_t nl; (nl = c.control_buf.find('\n')) != std::string::npos;) {
    const std::string line = c.control_buf.substr(0, nl);
    c.control_buf.erase(0, nl + 1);
    const std::string word = line.substr(0, line.find(' '));
    const std::string arg = line.find(' ') == std::string::npos ? "" : line.substr(line.find(' ') + 1);
    if (word == "stopping") {
      c.stop_acknowledged = true;
    } else if (word == "saving") {
      c.saving_since = Clock::now();
      c.save_step = arg;
      c.saved_at.reset();
      if (stopping_ && !c.killed)
        say(c.name + " is writing its checkpoint (step " + arg + "); waiting for it to finish (up to " +
            fixed1(spec_.save_timeout_s) + " s, [launch] stop_save_timeout_s)");
    } else if (word == "saved") {
      if (stopping_ && c.saving_since)
        say(c.name + " finished its checkpoint (step " + arg + ") in " + fixed1(seconds_since(*c.saving_since)) + " s");
      c.saving_since.reset();
      c.saved_at = Clock::now();
    }
  }
}

// While stopping: a worker is given stop_grace_s from the SIGTERM to end by itself; one that is
// writing a checkpoint is given until stop_save_timeout_s after its save began (and then
// stop_grace_s to exit). Only a worker past its own deadline is killed: a stuck one.
void Agent::kill_stuck() {
  const auto grace = std::chrono::milliseconds(static_cast<int64_t>(spec_.grace_s * 1000));
  const auto save = std::chrono::milliseconds(static_cast<int64_t>(spec_.save_timeout_s * 1000));
  std::string waiting;
  for (Child& c : children_) {
    if (c.reaped || c.killed) continue;
    Clock::time_point deadline = stop_at_ + grace;
    if (c.saving_since) deadline = std::max(deadline, *c.saving_since + save);
    else if (c.saved_at) deadline = std::max(deadline, *c.saved_at + grace);
    if (Clock::now() < deadline) {
      if (c.saving_since) waiting += (waiting.empty() ? "" : ", ") + c.name;
      continue;
    }
    say(c.name + (c.saving_since
                      ? " is still writing its checkpoint " + fixed1(seconds_since(*c.saving_since)) +
                            " s after it began ([launch] stop_save_timeout_s = " + fixed1(spec_.save_timeout_s) + " s)"
                      : " did not stop within " + fixed1(spec_.grace_s) + " s of SIGTERM ([launch] stop_grace_s)" +
                            (c.stop_acknowledged ? " and had not begun a checkpoint" : "")) +
        ": killing it (SIGKILL)");
    c.signal_group(SIGKILL);
    c.killed = true;
  }
  if (!waiting.empty() && seconds_since(last_wait_note_) >= 10.0) {
    if (last_wait_note_ != Clock::time_point{})
      say("still waiting for the checkpoint of " + waiting + " (" + fixed1(seconds_since(stop_at_)) + " s since SIGTERM)");
    last_wait_note_ = Clock::now();
  }
}

void Agent::begin_stop() {
  if (stopping_) return;
  stopping_ = true;
  stop_at_ = Clock::now();
  for (const Child& c : children_)
    if (!c.reaped) c.signal_group(SIGTERM);
}

void Agent::on_failure(Child& c) {
  const auto [how, code] = describe_status(c.status);
  const double after = std::chrono::duration<double>(c.pipes_closed.value_or(Clock::now()) - c.started).count();
  const bool others = children_.size() > 1 || multi_node() || spec_.mpiexec;
  std::string report;
  if (spec_.mpiexec) {
    report = "mpiexec (pid " + std::to_string(c.pid) + ") " + how + " after " + fixed1(after) +
             " s. Last lines of its output:";
    for (const auto& l : mpiexec_tail_) report += "\n  " + l;
  } else {
    const RankSink& sink = sinks_[static_cast<size_t>(c.rank - sinks_.front().rank)];
    report = c.name + " (pid " + std::to_string(c.pid) + ", node " + std::to_string(spec_.node_rank) +
             ") " + how + " after " + fixed1(after) + " s" + (others ? "; other ranks stopped" : "") +
             ". Last lines of " + (sink.log_path.empty() ? std::string("its output") : sink.log_path) + ":";
    for (const auto& l : sink.tail) report += "\n  " + l;
    if (sink.tail.empty()) report += "\n  (no output)";
  }
  if (multi_node() && !store_lost_) {
    // The first agent to record a failure names the cause for the whole job.
    const std::string mine = std::to_string(code) + "\n" + report;
    try {
      const std::string got = text(store_->compareSet(key("failed"), {}, bytes(mine)));
      if (got != mine) {
        const auto [peer_code, peer_report] = decode_failure(got);
        exit_code_ = peer_code;
        say(peer_report);
        say("(on this node, " + c.name + " " + how + " as well)");
        begin_stop();
        return;
      }
    } catch (const std::exception&) {
      store_lost_ = true;
    }
  }
  exit_code_ = code;
  say(report);
  begin_stop();
}

void Agent::reap() {
  std::vector<Child*> failed;
  for (Child& c : children_) {
    if (c.reaped) continue;
    int status = 0;
    const pid_t r = waitpid(c.pid, &status, WNOHANG);
    if (r != c.pid) continue;
    c.reaped = true;
    c.status = status;
    if (!c.pipes_closed) c.pipes_closed = Clock::now();
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok) failed.push_back(&c);
  }
  if (failed.empty() || exit_code_ || stopping_) return;
  if (!first_failure_at_) first_failure_at_ = Clock::now();
  failures_.insert(failures_.end(), failed.begin(), failed.end());
}

// The cause among the failures seen so far: the earliest to close its pipes that failed on its
// own (killed by a signal, or an error that is not a peer's transport error), among equal times
// a signal death (a rank killed from outside) first. Failures that all look collateral wait up
// to kCauseWindowS for such a one (or until every worker has ended); then the earliest wins.
void Agent::decide_cause() {
  if (failures_.empty() || exit_code_ || stopping_) return;
  auto own = [&](const Child* c) {
    if (WIFSIGNALED(c->status) || spec_.mpiexec) return true;
    return !looks_collateral(sinks_[static_cast<size_t>(c->rank - sinks_.front().rank)].tail);
  };
  auto key = [&](const Child* c) {
    return std::make_tuple(own(c) ? 0 : 1, *c->pipes_closed, WIFSIGNALED(c->status) ? 0 : 1);
  };
  Child* best = *std::min_element(failures_.begin(), failures_.end(),
                                  [&](const Child* a, const Child* b) { return key(a) < key(b); });
  const bool all_ended = std::all_of(children_.begin(), children_.end(), [](const Child& c) { return c.reaped; });
  if (!own(best) && !all_ended && seconds_since(*first_failure_at_) < kCauseWindowS) return;
  failures_.clear();
  on_failure(*best);
}

void Agent::poll_peers() {
  if (!multi_node() || store_lost_) return;
  try {
    if (spec_.node_rank != 0 && seconds_since(last_beat_sent_) >= 1.0) {
      store_->add(beat_key(spec_.node_rank), 1);
      last_beat_sent_ = Clock::now();
    }
    if (!exit_code_ && store_->check({key("failed")})) {
      const auto [code, report] = decode_failure(text(store_->get(key("failed"))));
      exit_code_ = code;
      say(report);
      say("stopping the ranks of node " + std::to_string(spec_.node_rank) +
          " (the job failed on another node)");
      begin_stop();
    }
  } catch (const std::exception& e) {
    store_lost_ = true;
    if (!exit_code_) {
      exit_code_ = 1;
      say("lost the rendezvous store at " + where() + " (node 0's agent is gone or its host unreachable: " + v1::what_of(e) +
          "); stopping the ranks of node " + std::to_string(spec_.node_rank));
      begin_stop();
    }
  }
}

int Agent::supervise() {
  std::optional<Clock::time_point> all_reaped_at;
  bool drain_killed = false;
  for (;;) {
    std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
    for (const Child& c : children_) {
      for (int fd : c.fds)
        if (fd >= 0) fds.push_back({fd, POLLIN, 0});
      if (c.control_fd >= 0) fds.push_back({c.control_fd, POLLIN, 0});
    }
    const int n = ::poll(fds.data(), fds.size(), kTickMs);
    if (n < 0 && errno != EINTR) throw Error(std::string("launcher: poll: ") + std::strerror(errno));
    signals_.drain();
    if (n > 0) read_ready(fds);
    for (Child& c : children_)
      if (c.control_fd >= 0) read_control(c);
    reap();
    decide_cause();

    const int sigs = g_stop_signals.load();
    if (sigs > 0 && !interrupted_) {
      interrupted_ = true;
      const std::string name = signal_name(g_last_signal.load());
      if (!exit_code_) {
        exit_code_ = 130;
        say("interrupted (" + name + "): stopping " + std::to_string(children_.size()) + " " +
            (spec_.mpiexec ? "mpiexec" : "rank(s)") + " (SIGTERM, SIGKILL after " +
            fixed1(spec_.grace_s) + " s" +
            (spec_.mpiexec ? std::string()
                           : ", or up to " + fixed1(spec_.save_timeout_s) + " s after a rank begins writing a checkpoint") +
            "); press Ctrl-C again to kill them at once");
        if (multi_node() && !store_lost_) {
          try {
            store_->compareSet(key("failed"), {}, bytes("130\nnode " + std::to_string(spec_.node_rank) +
                                                         " was interrupted (" + name + ")"));
          } catch (const std::exception&) {
            store_lost_ = true;
          }
        }
      }
      begin_stop();
    }
    if (sigs > 1 && !killed_) {
      killed_ = true;
      for (const Child& c : children_) c.signal_group(SIGKILL);
    }
    poll_peers();
    if (stopping_ && !killed_) kill_stuck();

    const bool all_reaped = std::all_of(children_.begin(), children_.end(), [](const Child& c) { return c.reaped; });
    if (!all_reaped) continue;
    const bool open = std::any_of(children_.begin(), children_.end(), [](const Child& c) { return c.pipes_open(); });
    if (!open) break;
    // A worker's own children can hold its pipes after it exited: give them a second, then
    // stop them too, and do not wait for them beyond that.
    if (!all_reaped_at) all_reaped_at = Clock::now();
    if (seconds_since(*all_reaped_at) > 1.0 && !drain_killed) {
      drain_killed = true;
      for (const Child& c : children_) c.signal_group(SIGKILL);
    }
    if (seconds_since(*all_reaped_at) > 1.5) {
      for (Child& c : children_)
        for (int s = 0; s < 2; ++s)
          if (c.fds[s] >= 0) close_stream(c, s);
      break;
    }
  }
  for (RankSink& s : sinks_)
    if (s.log_fd >= 0) close(s.log_fd), s.log_fd = -1;
  return exit_code_.value_or(0);
}

// Multi-node: node 0 serves the store, so it stays until every other agent has ended (or is
// gone), and reports a failure that happened on another node after its own ranks finished.
int Agent::finish() {
  int code = exit_code_.value_or(0);
  if (store_lost_) return code;
  try {
    store_->set(ended_key(spec_.node_rank), bytes(std::to_string(code)));
    if (spec_.node_rank != 0) return code;
    // After a failure the other agents stop their ranks within their grace period, counted
    // from about when this one stopped its own; on success they may still be training, and
    // only an agent whose heartbeat stops is given up on.
    auto failure_deadline = [&] {
      return (stopping_ ? stop_at_ : Clock::now()) +
             std::chrono::milliseconds(static_cast<int64_t>((spec_.grace_s + spec_.save_timeout_s + 2.0) * 1000));
    };
    std::optional<Clock::time_point> give_up;
    if (exit_code_) give_up = failure_deadline();
    for (;;) {
      std::vector<int> waiting;
      for (int n = 1; n < spec_.nnodes; ++n)
        if (!store_->check({ended_key(n)})) waiting.push_back(n);
      if (waiting.empty()) break;
      if (!exit_code_ && store_->check({key("failed")})) {
        const auto [peer_code, report] = decode_failure(text(store_->get(key("failed"))));
        exit_code_ = code = peer_code;
        say(report);
        give_up = failure_deadline();
      }
      if (give_up && Clock::now() >= *give_up) break;
      bool lost = false;
      for (int n : waiting) {
        if (elastic() && store_->check({rejoined_key(n)})) {
          say("node " + std::to_string(n) + "'s agent was replaced by a new one (" +
              AgentRecord::decode(text(store_->get(rejoined_key(n)))).who(n) + ") before its ranks finished");
          lost = true;
          continue;
        }
        const int64_t beats = store_->add(beat_key(n), 0);
        auto it = peer_beats_.find(n);
        if (it == peer_beats_.end() || it->second.first != beats) peer_beats_[n] = {beats, Clock::now()};
        else if (seconds_since(it->second.second) > kAgentLostS) {
          say("node " + std::to_string(n) + "'s agent stopped responding (no heartbeat for " +
              fixed1(kAgentLostS) + " s) before its ranks finished");
          lost = true;
        }
      }
      if (lost) return code ? code : 1;
      if (g_stop_signals.load() && !interrupted_) {
        interrupted_ = true;
        store_->compareSet(key("failed"), {}, bytes("130\nnode 0 was interrupted"));
        if (!exit_code_) exit_code_ = code = 130;
        give_up = failure_deadline();
      }
      pollfd p{signals_.fd(), POLLIN, 0};
      ::poll(&p, 1, kTickMs);
      signals_.drain();
    }
  } catch (const std::exception& e) {
    say("lost the rendezvous store at " + where() + ": " + v1::what_of(e));
    return code ? code : 1;
  }
  return code;
}

}  // namespace

int launch(const LaunchSpec& spec) {
  if (spec.argv.empty()) throw ConfigError("launch: no worker command line (argv is empty)");
  if (const auto problem = launch_layout_problem(spec)) throw ConfigError("launch: " + problem->message);
  // Elastic restarts: the failed attempt's agent has already stopped every worker and named
  // the failing rank and its cause; a fresh agent (new rendezvous, new port) starts them all
  // again, and TRAINRUN_RESTART tells the trainers to resume from the latest checkpoint.
  // Node 0 locks run_dir for the whole job (restarts included) before it moves an earlier run
  // aside; the workers it starts do not lock again (TRAINRUN_RUN_DIR_READY).
  std::unique_ptr<RunDirLock> run_dir_lock;
  if (spec.node_rank == 0 && spec.rotate_run_dir && !spec.run_dir.empty())
    run_dir_lock = RunDirLock::acquire(spec.run_dir);
  // Several nodes: every agent takes part in numbered rounds through node 0's store, which
  // node 0's Session keeps across rounds; round k is restart k, counted for the whole job, so
  // a node that comes back mid-job (a new agent) continues the count (see Agent::join_round).
  LaunchSpec attempt_spec = spec;
  Session session;
  for (int attempt = 0;; ++attempt) {
    int code = 0, round = 0;
    bool store_lost = false;
    {
      Agent agent(attempt_spec, session);
      code = agent.run();
      round = agent.round();
      store_lost = agent.store_lost();
    }
    const int restarts = spec.nnodes > 1 ? round : attempt;
    if (code == 0 || code == 130 || restarts >= spec.max_restarts || store_lost) return code;
    log_warn("restart " + std::to_string(restarts + 1) + " of " + std::to_string(spec.max_restarts) +
             ": a worker failed (exit code " + std::to_string(code) + ", cause above); restarting all " +
             std::to_string(spec.nproc_per_node * spec.nnodes) + " workers" +
             (spec.nnodes > 1 ? " of " + std::to_string(spec.nnodes) + " nodes" : "") +
             ", resuming from the latest checkpoint");
    attempt_spec.rotate_run_dir = false;
    session.round = restarts + 1;
    if (spec.nnodes == 1) ::setenv("TRAINRUN_RESTART", std::to_string(attempt + 1).c_str(), 1);
  }
}

}  // namespace trainrun::core
