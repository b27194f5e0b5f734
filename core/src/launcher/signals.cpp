// The node agent's signals: a self-pipe, so poll() wakes at once.
#include "signals.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include <trainrun/error.hpp>

namespace trainrun::core::launcher {

namespace {
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
}  // namespace

int stop_signals() { return g_stop_signals.load(); }
int last_signal() { return g_last_signal.load(); }

SignalScope::SignalScope() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
    throw v1::Error(std::string("launcher: pipe2: ") + std::strerror(errno));
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

SignalScope::~SignalScope() {
  for (auto& [s, sa] : old_) sigaction(s, &sa, nullptr);
  g_wake_fd = -1;
  close(read_fd_);
  close(write_fd_);
}

void SignalScope::drain() const {
  char buf[256];
  while (read(read_fd_, buf, sizeof buf) > 0) {
  }
}

}  // namespace trainrun::core::launcher
