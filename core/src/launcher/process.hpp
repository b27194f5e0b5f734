#pragma once
// The processes the node agent starts (agent.cpp): how a worker is started (an exec image built
// before fork, the environment without stale rank variables, its pipes and process group) and
// what the agent keeps of each one.
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "output.hpp"

namespace trainrun::core::launcher {

using Clock = std::chrono::steady_clock;

/// Seconds since `t` on the steady clock.
double seconds_since(Clock::time_point t);
/// `v` with one decimal ("2.5"), as the agent's messages give seconds.
std::string fixed1(double v);
/// This machine's host name ("?" if it has none).
std::string host_name();
/// "SIGTERM" for SIGTERM, "signal N" where the C library has no abbreviation.
std::string signal_name(int sig);
/// A waitpid() status in words ("exited with code 2", "was killed by signal 9 (SIGKILL)") and
/// the exit code a shell would show for it.
std::pair<std::string, int> describe_status(int status);

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
std::vector<std::string> worker_env(const std::vector<std::pair<std::string, std::string>>& add);

// fork + exec with stdout/stderr into pipes, stdin from /dev/null, in a process group of its
// own, killed with SIGKILL when the launcher dies. Returns the pid; *out/*err get the read ends.
// With `control` set, the worker also gets the write end of a third pipe as its fd 3
// (kControlFd), on which it reports what it is doing while it stops (stop_protocol below).
constexpr int kControlFd = 3;
pid_t spawn(ExecImage& image, int* out, int* err, int* control = nullptr);

// One process the agent started: a worker, or mpiexec.
struct Child {
  std::string name;  ///< "rank 3", "mpiexec"
  int rank = -1;     ///< global rank; -1 for mpiexec
  pid_t pid = -1;
  int fds[2] = {-1, -1};  ///< stdout, stderr read ends; -1 once at EOF
  std::unique_ptr<launcher_output::LineSplitter> lines[2];
  std::unique_ptr<launcher_output::HydraSplitter> hydra[2];
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

}  // namespace trainrun::core::launcher
