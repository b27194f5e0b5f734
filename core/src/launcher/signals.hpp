#pragma once
// The node agent's signals: SIGINT/SIGTERM/SIGCHLD wake its one poll() loop through a self-pipe.
#include <signal.h>

#include <map>

namespace trainrun::core::launcher {

/// SIGINT and SIGTERM received since the current SignalScope was made, and the last of them
/// (0: none). Async-signal-safe counters, read from the agent's loop.
int stop_signals();
int last_signal();

/// Installs the handlers for the life of one launch() and puts the old ones back; SIGPIPE is
/// ignored meanwhile (a closed stdout, `trainrun ... | head`, must not kill the launcher while
/// workers run). Throws v1::Error if the self-pipe cannot be made. One at a time per process.
class SignalScope {
 public:
  SignalScope();
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;
  /// The self-pipe's read end: readable after any of the three signals.
  int fd() const { return read_fd_; }
  /// Empties the self-pipe (after poll() said it is readable).
  void drain() const;

 private:
  int read_fd_ = -1, write_fd_ = -1;
  std::map<int, struct sigaction> old_;
};

}  // namespace trainrun::core::launcher
