#include "stop_signal.hpp"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

namespace trainrun::core::stop {

namespace {

std::atomic<int> g_stop_signal{0};
// The launcher's stop protocol (core/src/launcher/agent.cpp): under trainrun's agent, fd 3
// (TRAINRUN_CONTROL_FD) is a pipe to it, and the worker says there that a stop signal arrived
// and when a checkpoint write begins and ends, so that the agent waits for a save in progress
// instead of killing it after stop_grace_s.
int g_control_fd = -1;
void (*g_prev_int)(int) = SIG_DFL;
void (*g_prev_term)(int) = SIG_DFL;

void open_control_channel() {
  const char* v = std::getenv("TRAINRUN_CONTROL_FD");
  if (v == nullptr) return;
  const int fd = std::atoi(v);
  if (fd >= 3 && fcntl(fd, F_GETFD) != -1) g_control_fd = fd;
}

// Async-signal-safe: called from the signal handler too.
void control_message(const char* msg, size_t len) {
  if (g_control_fd < 0) return;
  [[maybe_unused]] ssize_t n = write(g_control_fd, msg, len);
}

extern "C" void on_stop_signal(int sig) {
  const int saved = errno;
  if (g_stop_signal.load() == 0) control_message("stopping\n", 9);
  g_stop_signal.store(sig);
  // A second Ctrl-C ends the process at once. A second SIGTERM does not: a cluster (SLURM)
  // may signal every process of the job as well as the launcher, which then forwards one
  // more, and the step and checkpoint in progress must still finish.
  if (sig == SIGINT) std::signal(sig, SIG_DFL);
  errno = saved;
}

}  // namespace

void install() {
  g_stop_signal.store(0);
  open_control_channel();
  g_prev_int = std::signal(SIGINT, on_stop_signal);
  g_prev_term = std::signal(SIGTERM, on_stop_signal);
}

void restore() {
  std::signal(SIGINT, g_prev_int);
  std::signal(SIGTERM, g_prev_term);
}

int received() { return g_stop_signal.load(); }

void set_received(int sig) { g_stop_signal.store(sig); }

void control_message(const std::string& msg) {
  const std::string line = msg + "\n";
  control_message(line.data(), line.size());
}

}  // namespace trainrun::core::stop
