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
#include "agent.hpp"

#include <c10/util/Exception.h>
#include <trainrun/error.hpp>
#include <trainrun/error_text.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>

#include "trainrun/core/log.hpp"
#include "trainrun/core/run_dir.hpp"

namespace trainrun::core {

namespace launcher {

using v1::ConfigError;
using v1::Error;

int Agent::run() {
  if (!rendezvous()) return 130;
  open_logs();
  if (spec_.mpiexec) start_mpiexec();
  else start_workers();
  const int code = supervise();
  return multi_node() ? finish() : code;
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

// What a failure report says instead of repeating an error line the console showed once.
std::string Agent::error_note(const std::string& error_line) const {
  const std::string ranks = console_.error_ranks(error_line);
  return "(the error above, printed by rank" +
         std::string(ranks.find(' ') == std::string::npos ? " " : "s ") + ranks + ")";
}

void Agent::on_failure(Child& c) {
  const auto [how, code] = describe_status(c.status);
  const double after = std::chrono::duration<double>(c.pipes_closed.value_or(Clock::now()) - c.started).count();
  const bool others = children_.size() > 1 || multi_node() || spec_.mpiexec;
  std::string report;
  if (spec_.mpiexec) {
    report = "mpiexec (pid " + std::to_string(c.pid) + ") " + how + " after " + fixed1(after) +
             " s. Last lines of its output:";
    std::string shown;
    for (const auto& l : mpiexec_tail_) {
      // "[rank k] TEXT": an error TEXT the console showed once is named below, not repeated.
      const size_t close = l.rfind("[rank ", 0) == 0 ? l.find("] ") : std::string::npos;
      const std::string text = close == std::string::npos ? l : l.substr(close + 2);
      if (!console_.error_ranks(text).empty())
        shown = text;
      else
        report += "\n  " + l;
    }
    if (!shown.empty()) report += "\n  " + error_note(shown);
  } else {
    const RankSink& sink = sinks_[static_cast<size_t>(c.rank - sinks_.front().rank)];
    report = c.name + " (pid " + std::to_string(c.pid) + ", node " + std::to_string(spec_.node_rank) +
             ") " + how + " after " + fixed1(after) + " s" + (others ? "; other ranks stopped" : "") +
             ". Last lines of " + (sink.log_path.empty() ? std::string("its output") : sink.log_path) + ":";
    // An error line the console showed (once, for every rank that printed it) is named, not
    // repeated; another node reads this report without that console, so it gets the line.
    std::string shown;
    for (const auto& l : sink.tail)
      if (!multi_node() && !console_.error_ranks(l).empty())
        shown = l;
      else
        report += "\n  " + l;
    if (sink.tail.empty()) report += "\n  (no output)";
    if (!shown.empty()) report += "\n  " + error_note(shown);
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

    const int sigs = stop_signals();
    if (sigs > 0 && !interrupted_) {
      interrupted_ = true;
      const std::string name = signal_name(last_signal());
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
      if (stop_signals() && !interrupted_) {
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

}  // namespace launcher

using launcher::Agent;
using launcher::Session;
using v1::ConfigError;

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
