// Reward `command` (rewards.hpp): a program of the user's, kept running, one JSON line in and one
// number out per completion. Started with posix_spawnp on two pipes; the replies are read with
// poll() against a deadline, so a program that hangs is killed instead of stalling training.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "rewards.hpp"
#include "trainrun/error.hpp"

extern char** environ;

namespace trainrun::plugins {

namespace {
using Clock = std::chrono::steady_clock;

// Writing to a program that has exited raises SIGPIPE, which would end trainrun: the signal is
// blocked in this thread while writing and a pending one is taken back before unblocking, so
// the write just fails with EPIPE and the caller reports the exit.
class SigpipeBlocked {
 public:
  SigpipeBlocked() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeBlocked() {
    const timespec zero{0, 0};
    while (sigtimedwait(&pipe_, nullptr, &zero) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_, old_;
};

std::string exit_text(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "stopped";
}

// One reply line as a score: a number, or nan / null / None for "no reward".
std::optional<double> parse_score(const std::string& line) {
  const std::string t = rewards::strip(line);
  if (t == "nan" || t == "NaN" || t == "null" || t == "None")
    return std::numeric_limits<double>::quiet_NaN();
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || std::isnan(v) || std::isinf(v)) return std::nullopt;
  return v;
}

// 30 -> "30", 0.25 -> "0.25".
std::string seconds_text(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

std::string shown_line(const std::string& line) {
  return nlohmann::json(line.size() > 80 ? line.substr(0, 80) + "..." : line)
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The program's input for one batch: each sample's row with prompt, completion and
// completion_ids set, one JSON object a line (invalid UTF-8 replaced, never an exception).
std::string request_lines(const std::vector<v1::RewardSample>& samples) {
  std::string request;
  for (const auto& s : samples) {
    nlohmann::json j = nlohmann::json::parse(s.row, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) j = nlohmann::json::object();
    j["prompt"] = s.prompt;
    j["completion"] = s.completion;
    j["completion_ids"] = s.completion_ids;
    request += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  return request;
}

// How long score() waits after a batch's last answer for lines a misbehaving program writes
// beyond one per completion (they come at once; a wait per batch, not per completion).
constexpr int kSurplusWaitMs = 100;

// Appends to `pending` what `fd` has to read now, without waiting.
void append_available(int fd, std::string& pending) {
  for (pollfd p{fd, POLLIN, 0}; poll(&p, 1, 0) == 1 && (p.revents & POLLIN);) {
    char buf[4096];
    const ssize_t got = read(fd, buf, sizeof buf);
    if (got <= 0) break;
    pending.append(buf, static_cast<size_t>(got));
  }
}

}  // namespace

void CommandReward::declare_options(v1::OptionSchema& s) {
  s.string_list("command", {},
                "the program and its arguments, e.g. [\"python3\", \"judge.py\"], run in the job "
                "file's directory; required");
  s.duration("timeout_s", 60.0,
             "longest wait for each answer line (after the request, or the previous answer)",
             0.001);
}

CommandReward::CommandReward(const v1::Options& o, const v1::RunContext& ctx)
    : argv_(o.get_string_list("command")), timeout_s_(o.get_seconds("timeout_s")) {
  if (argv_.empty() || argv_[0].empty())
    throw v1::ConfigError(o.context() +
                          ": option 'command' must name a program, e.g. "
                          "command = [\"python3\", \"judge.py\"]");
  namespace fs = std::filesystem;
  if (!ctx.job_file.empty()) dir_ = fs::absolute(fs::path(ctx.job_file)).parent_path().string();
  for (const auto& a : argv_) shown_ += (shown_.empty() ? "" : " ") + a;
  if (argv_[0].find('/') != std::string::npos && fs::path(argv_[0]).is_relative() && !dir_.empty())
    argv_[0] = (fs::path(dir_) / argv_[0]).lexically_normal().string();
  // A missing program is found now (trainrun check), not at the first rollout.
  if (argv_[0].find('/') != std::string::npos && access(argv_[0].c_str(), X_OK) != 0)
    throw v1::ConfigError(o.context() + ": option 'command': '" + argv_[0] +
                          "' is not an executable file");
}

CommandReward::~CommandReward() { stop(false); }

void CommandReward::fail(const std::string& message) {
  stop(true);
  throw v1::Error("program '" + shown_ + "' " + message);
}

void CommandReward::start() {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) throw v1::Error(std::string("pipe: ") + strerror(errno));
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    throw v1::Error(std::string("pipe: ") + strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  // In the job file's directory, so a job and its scorer can travel together.
  if (!dir_.empty()) posix_spawn_file_actions_addchdir_np(&actions, dir_.c_str());
  // Its own process group, so a timeout kills what a shell script started too.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  std::vector<char*> args;
  for (auto& a : argv_) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = -1;
  const int err = posix_spawnp(&pid, argv_[0].c_str(), &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(in[0]);
  close(out[1]);
  if (err != 0) {
    close(in[1]);
    close(out[0]);
    throw v1::Error("program '" + shown_ + "' cannot be started: " + strerror(err));
  }
  pid_ = pid;
  to_child_ = in[1];
  from_child_ = out[0];
  fcntl(to_child_, F_SETFL, fcntl(to_child_, F_GETFL) | O_NONBLOCK);
  pending_.clear();
}

std::optional<int> CommandReward::wait_exit(double seconds) {
  int status = 0;
  for (int i = 0;; ++i) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      kill(-pid_, SIGKILL);  // what it started in its process group goes with it
      pid_ = -1;
      return status;
    }
    if (i >= seconds * 100) return std::nullopt;
    usleep(10000);
  }
}

void CommandReward::stop(bool force) {
  if (to_child_ >= 0) close(to_child_);  // end of input: a well-behaved program exits now
  to_child_ = -1;
  if (pid_ > 0 && !wait_exit(force ? 0.0 : 1.0)) {
    kill(-pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  if (from_child_ >= 0) close(from_child_);
  from_child_ = -1;
  pending_.clear();
}

std::vector<double> CommandReward::score(const std::vector<v1::RewardSample>& samples) {
  if (samples.empty()) return {};
  if (pid_ <= 0) start();
  auto row_of = [&](size_t i) {
    return samples[i].row_index >= 0 ? "row " + std::to_string(samples[i].row_index)
                                     : "sample " + std::to_string(i);
  };
  const std::string request = request_lines(samples);
  // Output nobody asked for: the previous batch got more lines than it had completions. What
  // the program wrote since is read first, so a late extra line is not taken for an answer to
  // this batch (one that arrives after this request still would be).
  append_available(from_child_, pending_);
  if (!pending_.empty()) {
    const std::string extra = pending_.substr(0, pending_.find('\n'));
    fail("wrote more lines than it was sent completions (an extra line " + shown_line(extra) +
         " after the previous batch's last answer)");
  }
  std::vector<double> scores;
  scores.reserve(samples.size());
  SigpipeBlocked no_sigpipe;
  size_t written = 0;
  const auto timeout =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
  auto deadline = Clock::now() + timeout;
  // Its output ended: it exited (normally within a moment), or closed stdout and went on.
  auto exited = [&]() -> std::string {
    const auto status = wait_exit(1.0);
    return status ? exit_text(*status) : "closed its output";
  };
  while (scores.size() < samples.size()) {
    // Answers already read come first.
    for (size_t nl;
         scores.size() < samples.size() && (nl = pending_.find('\n')) != std::string::npos;) {
      const std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      const auto v = parse_score(line);
      if (!v)
        fail("answered " + shown_line(line) + " for " + row_of(scores.size()) +
             ", which is not a number (one number, or nan/null/None for no reward, per line)");
      scores.push_back(*v);
      deadline = Clock::now() + timeout;
    }
    if (scores.size() == samples.size()) break;
    pollfd fds[2] = {{from_child_, POLLIN, 0}, {to_child_, POLLOUT, 0}};
    const nfds_t n = written < request.size() ? 2 : 1;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0)
      fail("gave no answer for " + row_of(scores.size()) + " within " + seconds_text(timeout_s_) +
           " s (option timeout_s; " + std::to_string(scores.size()) + " of " +
           std::to_string(samples.size()) +
           " answers received: one line per completion); it was killed");
    const int r = poll(fds, n, static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30)));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail(std::string("poll failed: ") + strerror(errno));
    }
    if (n == 2 && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
      const ssize_t w = write(to_child_, request.data() + written, request.size() - written);
      if (w > 0) {
        written += static_cast<size_t>(w);
        if (written == request.size()) deadline = Clock::now() + timeout;
      } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
        // EPIPE: it no longer reads; what it printed before is read below, then its exit shown.
        written = request.size();
      }
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[65536];
      const ssize_t got = read(from_child_, buf, sizeof buf);
      if (got > 0) {
        pending_.append(buf, static_cast<size_t>(got));
      } else if (got == 0) {
        // End of its output: take the complete lines left, then report why it stopped.
        if (pending_.find('\n') != std::string::npos) continue;
        const std::string why = exited();
        fail(why + " before answering " + row_of(scores.size()) + " (" +
             std::to_string(scores.size()) + " of " + std::to_string(samples.size()) +
             " answers received)");
      } else if (errno != EINTR && errno != EAGAIN) {
        fail(std::string("read failed: ") + strerror(errno));
      }
    }
  }
  // A line already there beyond the last answer is one too many. A program that writes more
  // lines than it was sent writes them at once, so they are waited for a moment here (the last
  // batch has no next call to find them); one arriving later still is found at the next call.
  if (pollfd p{from_child_, POLLIN, 0}; pending_.empty() && poll(&p, 1, kSurplusWaitMs) == 1)
    append_available(from_child_, pending_);
  if (!pending_.empty()) {
    const std::string extra = pending_.substr(0, pending_.find('\n'));
    fail("wrote more lines than it was sent completions (" + std::to_string(samples.size()) +
         " sent; an extra line " + shown_line(extra) + ")");
  }
  return scores;
}

}  // namespace trainrun::plugins
